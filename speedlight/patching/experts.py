"""A mixture of experts' <Prefix>Experts module (transformers 5.x) on speedlight: the
forward the patch gives it, the layout it reads, and how it is installed.

Two ways in, chosen per module by `install`:
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


def experts_layout_problem(experts) -> str | None:
    """Why an experts module's weights are not in the layout experts_forward reads, or None."""
    if not all(isinstance(getattr(experts, n, None), torch.nn.Parameter) and
               getattr(experts, n).dim() == 3 for n in ("gate_up_proj", "down_proj")):
        return "its weights are not 3-D gate_up_proj/down_proj parameters"
    for flag, wanted in (("has_bias", False), ("is_transposed", False),
                         ("is_concatenated", True), ("has_gate", True),
                         ("has_post_expert_norm", False)):
        if getattr(experts, flag, wanted) != wanted:
            return f"its {flag} is {getattr(experts, flag)}; speedlight reads {flag}={wanted}"
    gate = getattr(type(experts), "_apply_gate", None)
    if gate is not None and gate.__name__ != "_default_apply_gate":
        return "it has its own gating function (_apply_gate)"
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


def registered_forward(self, hidden_states, top_k_index, top_k_weights):
    """The "speedlight" entry of transformers' experts registry: the forward built for
    this module at patch time (or, for a module the patch kept, the implementation its
    config named before)."""
    return self.__dict__[FORWARD_ATTR](self, hidden_states, top_k_index, top_k_weights)


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


def switch_configs(model: torch.nn.Module, class_name: str) -> list[tuple[object, object]]:
    """Point every config read by a registry-patched experts module of `class_name` at
    speedlight; the module of that class the patch kept (no FORWARD_ATTR) keeps the
    implementation its config named, through registered_forward. Returns (config, previous
    implementation) pairs for `restore_configs`."""
    modules = [m for m in model.modules() if type(m).__name__ == class_name and _dispatched(m)]
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
