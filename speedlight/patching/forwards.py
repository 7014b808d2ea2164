"""The forwards the patch gives RMSNorm and MLP instances, and the check of a projection
whose weight speedlight reads in place of calling it.

Each forward takes its input as the module's own forward does (positionally or by the
original's parameter name) and is built once at patch time with its speedlight op looked up
then, so a call decides nothing outside torch.compile's reach.
"""

from __future__ import annotations

import importlib

import torch

from speedlight.patching.families import ACTIVATIONS


def op(name: str):
    """speedlight.ops.<name>.<name>, imported now (at patch time, never inside a forward)."""
    return getattr(importlib.import_module(f"speedlight.ops.{name}"), name)


def _the_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The one input of a norm's or MLP's forward, passed by position or by name."""
    return args[0] if args else next(iter(kwargs.values()))


def norm_forward(offset: float, out: str, eps_attr: str, in_place: bool = False, fn=None):
    """<Family>RMSNorm's forward on speedlight.rms_norm: offset 1 for Gemma's (1 + w);
    out "promote": weight * x.to(input dtype) promotes to the weight's dtype (Llama);
    "input": x's dtype. fn: another candidate's RMSNorm (candidates.adapt), called with
    rms_norm's inputs by name."""
    rms_norm = fn or op("rms_norm")

    def forward(self, *args, **kwargs):
        x = _the_input(args, kwargs)
        y = rms_norm(x=x, weight=self.weight if self.weight.dtype == x.dtype
                     else self.weight.to(x.dtype),
                     eps=float(getattr(self, eps_attr)), offset=offset, in_place=in_place)
        if out == "promote":
            return y.to(torch.promote_types(x.dtype, self.weight.dtype))
        return y
    return forward


def split_mlp_forward(op_name: str, op_kwargs: dict, fn=None):
    """down_proj(act(gate_proj(x)) * up_proj(x)), with Falcon-H1's gate_multiplier and
    down_multiplier (attributes of its MLP) folded into the gated unit; down_multiplier
    scales down_proj's output instead when down_proj has a bias. fn: another candidate's
    gated unit (candidates.adapt), called with the op's inputs by name."""
    gated = fn or op(op_name)

    def forward(self, *args, **kwargs):
        x = _the_input(args, kwargs)
        gate_multiplier = float(getattr(self, "gate_multiplier", 1.0))
        down_multiplier = float(getattr(self, "down_multiplier", 1.0))
        folded = self.down_proj.bias is None
        y = self.down_proj(gated(gate=self.gate_proj(x), up=self.up_proj(x), **op_kwargs,
                                 gate_multiplier=gate_multiplier,
                                 down_multiplier=down_multiplier if folded else 1.0))
        return y if folded or down_multiplier == 1.0 else y * down_multiplier
    return forward


def fused_mlp_forward(op_name: str, op_kwargs: dict, fn=None):
    """down_proj(act(gate) * up) over gate_up_proj's [.., 2I] output (Phi-3, GLM-4). fn:
    another candidate's gated unit, given gate and up as the two halves' views."""
    gated = fn or op(op_name)

    def forward(self, *args, **kwargs):
        gate_up = self.gate_up_proj(_the_input(args, kwargs))
        if fn is None:
            return self.down_proj(gated(gate_up, None, **op_kwargs))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(gated(gate=gate, up=up, **op_kwargs))
    return forward


_GATED_ACTIVATION = {("swiglu", ""): "silu", ("geglu", "tanh"): "gelu_tanh",
                     ("geglu", "none"): "gelu"}


def gated_matmul_forward(op_name: str, op_kwargs: dict, fallback, note_fallback):
    """down_proj(act(x W_gate^T) * (x W_up^T)) with the two projections in one kernel: the
    weights are the module's own parameters (gate_up_proj's [2I, H] for Phi-3). When a
    projection is no longer a plain torch.nn.Linear (wrapped by an adapter such as a PEFT
    LoRA layer, or quantized, after the patch), reading its weight would bypass it: the
    call runs `fallback` (the gated unit alone, which calls the projections) and
    note_fallback(module, reason) records why."""
    gated_matmul = op("gated_matmul")
    activation = _GATED_ACTIVATION[(op_name, op_kwargs.get("approximate", ""))]

    def forward(self, *args, **kwargs):
        fused = hasattr(self, "gate_up_proj")
        for name in ("gate_up_proj",) if fused else ("gate_proj", "up_proj"):
            problem = direct_weight_problem(getattr(self, name))
            if problem is not None:
                note_fallback(self, f"{name}: {problem}")
                return fallback(self, *args, **kwargs)
        x = _the_input(args, kwargs)
        if fused:
            return self.down_proj(gated_matmul(x, self.gate_up_proj.weight, None, activation))
        return self.down_proj(gated_matmul(x, self.gate_proj.weight, self.up_proj.weight,
                                           activation))
    return forward


def _plain_weight(weight) -> bool:
    """A weight speedlight's kernels read as it is: a tensor or parameter, or a DTensor
    (FSDP2 gathers it before the module's forward); not a quantized tensor subclass."""
    if type(weight) in (torch.Tensor, torch.nn.Parameter):
        return True
    return type(weight).__name__ == "DTensor" and type(weight).__module__.startswith(
        "torch.distributed")


def direct_weight_problem(linear) -> str | None:
    """Why speedlight cannot read this projection's weight in place of calling it (the
    fused MLP's gate/up projections, the fused loss's lm_head), or None: a layer that is
    not a plain torch.nn.Linear (a PEFT LoRA layer wraps its base layer and adds the
    adapter in its own forward; a bitsandbytes layer dequantizes in its forward), or a
    weight that is a quantized tensor subclass. FSDP2's fully_shard, which subclasses the
    module but keeps Linear's forward, is a plain Linear here."""
    if not isinstance(linear, torch.nn.Linear) or type(linear).forward is not torch.nn.Linear.forward:
        kind = type(linear)
        return (f"it is a {kind.__module__}.{kind.__qualname__} (an adapter or a quantized "
                f"layer, not a plain torch.nn.Linear): reading its weight would bypass its "
                f"own forward")
    if not _plain_weight(linear.weight):
        return (f"its weight is a {type(linear.weight).__qualname__} (a quantized tensor), "
                f"which speedlight's kernels do not read")
    return None


def has_multipliers(mlp) -> bool:
    """Whether the MLP scales its gate or its output (Falcon-H1's mlp_multipliers)."""
    return any(float(getattr(mlp, name, 1.0)) != 1.0
               for name in ("gate_multiplier", "down_multiplier"))


def has_bias(mlp) -> bool:
    return any(getattr(getattr(mlp, name, None), "bias", None) is not None
               for name in ("gate_proj", "up_proj", "gate_up_proj"))


def activation_of(mlp) -> tuple[str, dict] | None:
    """The speedlight gated unit (op name, its keyword arguments) of an MLP's or experts'
    activation, or None."""
    act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    if act is None:
        return None
    name = type(act).__name__
    if name == "GELU" and getattr(act, "approximate", "none") == "tanh":
        return "geglu", {"approximate": "tanh"}
    return ACTIVATIONS.get(name)
