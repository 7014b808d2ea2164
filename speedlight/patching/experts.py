"""A mixture of experts' <Prefix>Experts module (transformers 5.x) on speedlight: the
forward the patch gives it, the layout it reads, and how it is installed.

Two layouts (Family.experts): "standard" (gate_up_proj [E, 2I, H], gate rows first,
down_proj [E, H, I], no bias, the module's act_fn: Mixtral, Qwen2/3-MoE, GraniteMoE,
DeepSeek-V3's routed experts) and "gpt_oss" (GptOssExperts: [E, H, 2I] / [E, I, H], gate
and up interleaved, biases, clamped SwiGLU, checked against the module's own _apply_gate).
Anything else is reported with the field that differs (experts_layout_problem).

Two ways in, chosen per module (`register`, else the patcher's set_forward):
  registry  transformers >= 5.25 dispatches an experts module decorated with
            @use_experts_implementation through its experts-implementation registry
            (`config._experts_implementation`, as attention has one): speedlight registers
            itself there as "speedlight" and points the configs the experts read at it
  module    older transformers (the GPU machines' 5.17), or a class without the decorator:
            the instance's forward is replaced, as the other kinds are
Either way the forward is built once at patch time (its ops imported then), so a call
imports nothing and decides nothing outside torch.compile's reach.
"""

from __future__ import annotations

import inspect

import torch

NAME = "speedlight"
# the built forward of a patched experts module (registry path), held in its __dict__
FORWARD_ATTR = "_speedlight_experts_forward"


# speedlight's gated units (forwards.activation_of) -> moe_experts's activation names
_MOE_ACTIVATIONS = {("swiglu", ()): "silu", ("geglu", (("approximate", "tanh"),)): "gelu_tanh",
                    ("geglu", (("approximate", "none"),)): "gelu"}


def moe_activation(op_name: str, op_kwargs: dict) -> str | None:
    """moe_experts's activation for a gated unit (forwards.activation_of), or None."""
    return _MOE_ACTIVATIONS.get((op_name, tuple(sorted(op_kwargs.items()))))


def experts_forward(activation: str):
    """A mixture of experts' forward (transformers 5.x's <Prefix>Experts: gate_up_proj
    [E, 2I, H], down_proj [E, H, I]) as one speedlight.moe_experts call: the routing
    arrives as the module's arguments (top_k_index, top_k_weights [tokens, k]) and is used
    as it is; indices >= num_experts (expert-parallel sentinels) contribute zeros, as the
    module's own loop skips them. No host sync; moe_experts is imported now, at patch time.
    The input is cast to the weights' dtype and the output back to the input's, as
    transformers' grouped_mm implementation does."""
    from speedlight.ops.moe_experts import moe_experts

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = moe_experts(hidden_states.to(self.gate_up_proj.dtype), top_k_index, top_k_weights,
                          self.gate_up_proj, self.down_proj, activation=activation)
        return out.to(hidden_states.dtype)
    return forward


def gpt_oss_experts_forward(alpha: float, limit: float):
    """gpt-oss's experts (GptOssExperts: gate_up_proj [E, H, 2I] with gate and up
    interleaved, gate at the even columns; down_proj [E, I, H]; gate_up_proj_bias [E, 2I],
    down_proj_bias [E, H]; the clamped SwiGLU (clamp(up, -limit, limit) + 1) * g *
    sigmoid(alpha g), g = min(gate, limit)) as one speedlight.moe_experts call. The weights
    pass as transposed views (moe_experts's [E, 2I, H] / [E, H, I]), so nothing is copied
    and their gradients come back in the module's layout. The arguments keep the module's
    own names (router_indices, routing_weights [tokens, k]); alpha and limit are the
    module's, read at patch time."""
    from speedlight.ops.moe_experts import moe_experts

    def forward(self, hidden_states, router_indices=None, routing_weights=None):
        out = moe_experts(hidden_states.to(self.gate_up_proj.dtype), router_indices,
                          routing_weights, self.gate_up_proj.transpose(1, 2),
                          self.down_proj.transpose(1, 2), activation="clamped_swiglu",
                          gate_up_bias=self.gate_up_proj_bias, down_bias=self.down_proj_bias,
                          interleaved=True, swiglu_alpha=alpha, swiglu_limit=limit)
        return out.to(hidden_states.dtype)
    return forward


def forward_for(experts, layout: str, activation: str | None = None):
    """The built forward of an experts module in `layout` (Family.experts), whose
    experts_layout_problem is None."""
    if layout == "gpt_oss":
        return gpt_oss_experts_forward(float(experts.alpha), float(experts.limit))
    return experts_forward(activation)


# the decorator's flags (transformers 5.25) each layout reads; a module without a flag (an
# older transformers) is judged by its weights' shapes alone
_FLAGS = {"standard": (("has_bias", False), ("is_transposed", False), ("is_concatenated", True),
                       ("has_gate", True), ("has_post_expert_norm", False)),
          "gpt_oss": (("has_bias", True), ("is_transposed", True), ("is_concatenated", False),
                      ("has_gate", True), ("has_post_expert_norm", False))}


def _is_parameter(module, name: str, dims: int) -> bool:
    p = getattr(module, name, None)
    return isinstance(p, torch.nn.Parameter) and p.dim() == dims


def experts_layout_problem(experts, layout: str = "standard") -> str | None:
    """Why an experts module is not in the layout (Family.experts) its forward reads, or
    None: the field, what it holds and what speedlight reads."""
    if not all(_is_parameter(experts, n, 3) for n in ("gate_up_proj", "down_proj")):
        return "its weights are not 3-D gate_up_proj/down_proj parameters"
    gu, d = experts.gate_up_proj.shape, experts.down_proj.shape
    if layout == "gpt_oss":
        fits = gu[0] == d[0] and gu[1] == d[2] and gu[2] == 2 * d[1]
        wanted = "gate_up_proj [E, H, 2I] and down_proj [E, I, H]"
    else:
        fits = gu[0] == d[0] and gu[1] == 2 * d[2] and gu[2] == d[1]
        wanted = "gate_up_proj [E, 2I, H] and down_proj [E, H, I]"
    if not fits:
        return (f"its gate_up_proj {list(gu)} and down_proj {list(d)} are not {wanted}, "
                "the layout speedlight reads")
    for flag, want in _FLAGS[layout]:
        if getattr(experts, flag, want) != want:
            return f"its {flag} is {getattr(experts, flag)}; speedlight reads {flag}={want}"
    if layout == "gpt_oss":
        return _gpt_oss_problem(experts)
    gate = getattr(type(experts), "_apply_gate", None)
    if gate is not None and gate.__name__ != "_default_apply_gate":
        return "it has its own gating function (_apply_gate)"
    return None


def _gpt_oss_problem(experts) -> str | None:
    """Why a gpt-oss experts module is not what gpt_oss_experts_forward computes, or None:
    its biases, alpha and limit, and its own _apply_gate (where the installed transformers
    has one) against the clamped SwiGLU on a probe spanning the clamps."""
    gu, d = experts.gate_up_proj.shape, experts.down_proj.shape
    for name, shape in (("gate_up_proj_bias", (gu[0], gu[2])), ("down_proj_bias", (d[0], d[2]))):
        if not (_is_parameter(experts, name, 2) and tuple(getattr(experts, name).shape) == shape):
            return f"its {name} is not a parameter of shape {list(shape)}"
    for name in ("alpha", "limit"):
        if not isinstance(getattr(experts, name, None), (int, float)):
            return f"its {name} is not a number (the clamped SwiGLU's {name})"
    gate = getattr(experts, "_apply_gate", None)
    if gate is None:
        return None
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    alpha, limit = float(experts.alpha), float(experts.limit)
    with unset_fake_temporarily():
        z = torch.linspace(-2 * limit - 1, 2 * limit + 1, 16, dtype=torch.float64)[None]
        g, u = z[:, 0::2].clamp(max=limit), z[:, 1::2].clamp(-limit, limit)
        expected = (u + 1) * g * torch.sigmoid(alpha * g)
        try:
            got = gate(z)
        except Exception as e:  # noqa: BLE001 - any failure is the report's reason
            return f"its _apply_gate fails on a float64 probe ({type(e).__name__}: {e})"
        same = (isinstance(got, torch.Tensor) and got.shape == expected.shape
                and torch.allclose(got, expected, rtol=1e-12, atol=0))
    if not same:
        return ("its _apply_gate is not the clamped SwiGLU on interleaved gate/up that "
                "moe_experts computes (probed in float64)")
    return None


# --- transformers' experts-implementation registry --------------------------------------

def experts_registry():
    """transformers' experts-implementation registry (ALL_EXPERTS_FUNCTIONS, 5.25+), or
    None where the installed transformers has none."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return None
    return ALL_EXPERTS_FUNCTIONS


def _dispatched(module) -> bool:
    """Whether the module's class forward dispatches through the registry: decorated with
    @use_experts_implementation (its forward wraps the class's own) and reading a config
    that names an implementation."""
    forward = type(module).forward
    config = getattr(module, "config", None)
    return (inspect.unwrap(forward) is not forward and hasattr(module, "is_concatenated")
            and hasattr(config, "_experts_implementation_internal"))


def registered_forward(self, *args, **kwargs):
    """The "speedlight" entry of transformers' experts registry: the forward built for
    this module at patch time (or, for a module the patch kept, the implementation its
    config named before), called with the arguments under the module's own names (gpt-oss
    names its routing router_indices, routing_weights)."""
    return self.__dict__[FORWARD_ATTR](self, *args, **kwargs)


def _previous_forward(module, implementation: str | None):
    """The forward the registry gave the module before its config named speedlight."""
    registry = experts_registry()
    original = inspect.unwrap(type(module).forward)
    if implementation in (None, "eager"):
        return original
    return registry.get(implementation, original)


def register(module, forward) -> bool:
    """Give an experts module `forward` through transformers' registry, where the module
    dispatches through one (the patch then replaces the instance's forward instead).
    Whether it did; `switch_configs` then points the module's config at it."""
    registry = experts_registry()
    if registry is None or not _dispatched(module):
        return False
    if NAME not in registry:
        registry.register(NAME, registered_forward)
    module.__dict__[FORWARD_ATTR] = forward
    return True


def switch_configs(model: torch.nn.Module, class_names: tuple[str, ...]
                   ) -> list[tuple[object, object]]:
    """Point every config read by a registry-patched experts module of `class_names` at
    speedlight; the module of those classes the patch kept (no FORWARD_ATTR) keeps the
    implementation its config named, through registered_forward. Returns (config, previous
    implementation) pairs for `restore_configs`."""
    modules = [m for m in model.modules() if type(m).__name__ in class_names and _dispatched(m)]
    configs = {id(m.config): m.config for m in modules if FORWARD_ATTR in m.__dict__}
    previous = [(c, c._experts_implementation_internal) for c in configs.values()]
    before = dict((id(c), impl) for c, impl in previous)
    for m in modules:
        if id(m.config) in configs and FORWARD_ATTR not in m.__dict__:
            kept = _previous_forward(m, before[id(m.config)])
            m.__dict__[FORWARD_ATTR] = kept
    for c in configs.values():
        c._experts_implementation_internal = NAME
    return previous


def restore_configs(model: torch.nn.Module, previous: list[tuple[object, object]]) -> None:
    for config, implementation in previous:
        config._experts_implementation_internal = implementation
    for m in model.modules():
        m.__dict__.pop(FORWARD_ATTR, None)
