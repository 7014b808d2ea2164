"""A mixture of experts' expert block, whole: routing sort, the gate_up grouped GEMM, the
gate unit, the down grouped GEMM, the routing weights and the combine back into tokens.

The registration (custom ops `speedlight::moe_experts_fwd / _infer / _bwd`) of the
launchers in ops/moe_experts_launch.py (forward) and ops/moe_experts_bwd.py (backward),
the public `speedlight.moe_experts`, and the OpSpec (its cases and cost in
moe_experts_cases.py). Kernels: kernels/moe_gate_up.py, kernels/moe.py and
kernels/grouped_matmul.py.

The (token, slot) pairs of the router's choices [tokens, k] are sorted by expert on the
device (a stable sort; an index outside [0, E), an expert-parallel sentinel, sorts past the
last expert, where the grouped GEMM writes zeros and the combine adds nothing): static
shapes, no host sync, so a CUDA graph can hold the whole block. Per sorted pair p of
token t, slot j and expert e:
    z[p]  = hidden[t] @ gate_up_proj[e]^T + gate_up_bias[e]          [pairs, 2 I]
    h[p]  = gate_unit(z[p])   (in the gate_up GEMM's epilogue)        [pairs, I]
    e[p]  = h[p] @ down_proj[e]^T + down_bias[e]  (the expert's output)
    y[p]  = w[t, j] e[p]   (w = top_k_weights: in the down GEMM's epilogue, fp32) [pairs, H]
    out[t] = sum over j (in slot order, fp32) of y[pair of (t, j)]
hidden's rows are gathered in expert order by the gate_up kernel's loads (no copy).
Saved for the backward: z alone (2 I values per pair in hidden's dtype: 2 k I values,
4 k I bytes in bf16, per token: the same at any expert count for a given k I), written by
the gate_up kernel only when a gradient is needed. The sort is redone in the backward
(a sort of tokens x k integers against keeping 8 k bytes per token), h is recomputed from
z in the backward's gate kernel (elementwise, against re-running the gate_up GEMM that
saving h alone would cost: z cannot be had from h), y is never needed (its dot with dout
comes from g and h). The backward (ops/moe_experts_bwd.py) makes no [pairs, H] tensor.
"""

from __future__ import annotations

import math
import numbers

import torch

from speedlight import shapes
from speedlight.ops import moe_experts_cases as cases
from speedlight.ops._checks import (check_bool, check_choice, check_same_device,
                                   check_same_dtype, check_tensor)
from speedlight.ops.grouped_matmul import MAX_GROUPS, _like_weight
from speedlight.ops.matmul import DESIGN as GEMM_DESIGN
from speedlight.ops.moe_experts_bwd import moe_experts_bwd
from speedlight.ops.moe_experts_launch import MOE_GATE_UP_CONFIGS, _infer_fwd, moe_experts_fwd
from speedlight.ops.registration import like, register_op
from speedlight.runtime import autocast_dtype, describe
from speedlight.spec import OpSpec

# the gate units: act(gate) * up for the first three, gpt-oss's clamped SwiGLU last
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "clamped_swiglu")


def _fake(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, *options):
    pairs = top_k_index.numel()
    return hidden.new_empty(hidden.shape), hidden.new_empty((pairs, gate_up_proj.shape[1]))


def _bwd_fake(dout, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
              gate_up_bias, down_bias, *rest):
    flags = rest[-1]
    grads = (like(hidden), like(top_k_weights), _like_weight(gate_up_proj),
             _like_weight(down_proj), like(gate_up_bias), like(down_bias))
    return tuple(t if want else None for t, want in zip(grads, flags))


MOE_EXPERTS = register_op(
    "moe_experts",
    forward=moe_experts_fwd,
    outputs=("out", "z"),
    stats=("z",),
    fake=_fake,
    inference=_infer_fwd,
    backward=moe_experts_bwd,
    backward_fake=_bwd_fake,
    grads=("hidden", "top_k_weights", "gate_up_proj", "down_proj", "gate_up_bias",
           "down_bias"),
)


# --- the public function -------------------------------------------------------------------

# the most (token, slot) pairs one call takes: the sort's expert ends are int32
MAX_PAIRS = 2 ** 31 - 1

def _check_number(name: str, value, what: str) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number ({what}), got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite ({what}), got {value!r}")
    return float(value)


def check_moe_inputs(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                     gate_up_bias, down_bias) -> None:
    """Shapes, dtypes and devices of moe_experts' tensors (no value is read: no host sync)."""
    check_tensor("hidden", hidden)
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [tokens, H] (flatten batch and sequence), got "
                         f"{describe(hidden)}")
    check_tensor("top_k_index", top_k_index, dtypes=(torch.int64, torch.int32),
                 expected="int64 or int32 (the router's expert indices)")
    if top_k_index.dim() != 2 or top_k_index.shape[0] != hidden.shape[0]:
        raise ValueError(f"top_k_index must be [tokens, k] with hidden's {hidden.shape[0]} "
                         f"tokens, got {describe(top_k_index)} for hidden {describe(hidden)}")
    if top_k_index.numel() > MAX_PAIRS:
        raise ValueError(f"top_k_index holds {top_k_index.numel()} (token, slot) pairs; "
                         f"moe_experts takes at most 2^31 - 1 (the experts' row ends are "
                         f"int32), got {describe(top_k_index)}: split the tokens")
    check_tensor("top_k_weights", top_k_weights)
    if tuple(top_k_weights.shape) != tuple(top_k_index.shape):
        raise ValueError(f"top_k_weights must have top_k_index's shape "
                         f"{tuple(top_k_index.shape)} (one weight per choice), got "
                         f"{describe(top_k_weights)}")
    check_tensor("gate_up_proj", gate_up_proj)
    check_tensor("down_proj", down_proj)
    n_hidden = hidden.shape[1]
    if gate_up_proj.dim() != 3 or gate_up_proj.shape[2] != n_hidden or gate_up_proj.shape[1] % 2:
        raise ValueError(f"gate_up_proj must be [E, 2 I, H] with hidden's H = {n_hidden} (a "
                         f"[E, H, 2 I] tensor passes as .transpose(1, 2)), got "
                         f"{describe(gate_up_proj)}")
    n_experts, n_inter = gate_up_proj.shape[0], gate_up_proj.shape[1] // 2
    if tuple(down_proj.shape) != (n_experts, n_hidden, n_inter):
        raise ValueError(f"down_proj must be [E, H, I] = {(n_experts, n_hidden, n_inter)} "
                         f"(gate_up_proj {describe(gate_up_proj)}: E experts, I = half its "
                         f"rows; a [E, I, H] tensor passes as .transpose(1, 2)), got "
                         f"{describe(down_proj)}")
    if n_experts > MAX_GROUPS:
        raise ValueError(f"gate_up_proj has {n_experts} experts; moe_experts takes at most "
                         f"{MAX_GROUPS}, got {describe(gate_up_proj)}")
    for name, bias, rows in (("gate_up_bias", gate_up_bias, 2 * n_inter),
                             ("down_bias", down_bias, n_hidden)):
        if bias is not None:
            check_tensor(name, bias)
            if tuple(bias.shape) != (n_experts, rows):
                raise ValueError(f"{name} must be [E, {rows}] = {(n_experts, rows)}, got "
                                 f"{describe(bias)}")
    check_same_dtype(hidden=hidden, gate_up_proj=gate_up_proj, down_proj=down_proj,
                     gate_up_bias=gate_up_bias, down_bias=down_bias)
    check_same_device(hidden=hidden, top_k_index=top_k_index, top_k_weights=top_k_weights,
                      gate_up_proj=gate_up_proj, down_proj=down_proj,
                      gate_up_bias=gate_up_bias, down_bias=down_bias)


def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *,
                activation: str = "silu", gate_up_bias: torch.Tensor | None = None,
                down_bias: torch.Tensor | None = None, interleaved: bool = False,
                gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
                swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0) -> torch.Tensor:
    """The routed experts of a mixture-of-experts layer, whole: out [tokens, H] =
    sum over j of top_k_weights[t, j] * expert_{top_k_index[t, j]}(hidden[t]).

    hidden: [tokens, H]. top_k_index: [tokens, k] int64 or int32, the router's choices;
    an index outside [0, E) (an expert-parallel layer's sentinel for an expert held
    elsewhere) contributes zero, and its weight's gradient is zero. top_k_weights:
    [tokens, k], any float dtype (the sums run in fp32). Transformers 5.x's experts layout:
    gate_up_proj [E, 2 I, H] (the gate in its first I rows, up in the last I) and down_proj
    [E, H, I], any strides: gpt-oss's [E, H, 2 I] and [E, I, H] pass as `.transpose(1, 2)`
    views, read where they lie (no copy). hidden, the weights and biases share one dtype
    (float32, float16 or bfloat16) and device.

    Expert e on token t: z = hidden[t] @ gate_up_proj[e]^T + gate_up_bias[e];
    h = gate unit of z (below); y = h @ down_proj[e]^T + down_bias[e].
      activation: the gate unit: "silu" (SwiGLU), "gelu_tanh" or "gelu" (GeGLU, the tanh
        approximation or exact erf): act(gate_multiplier * gate) * up * down_multiplier;
        "clamped_swiglu" (gpt-oss): with a = gate_multiplier * gate, c = min(a,
        swiglu_limit), v = clamp(up, -swiglu_limit, swiglu_limit):
        (v + 1) * c * sigmoid(swiglu_alpha * c) * down_multiplier.
      interleaved: gate and up alternate over gate_up_proj's rows (gate at even rows, up
        at odd: gpt-oss) instead of its two halves.
      gate_up_bias [E, 2 I], down_bias [E, H]: per-expert biases (gpt-oss), or None.
      gate_multiplier, down_multiplier: Falcon-style mlp multipliers (1.0: none).
      swiglu_alpha, swiglu_limit: clamped_swiglu's constants (gpt-oss: 1.702 and 7.0;
        swiglu_limit >= 0, any other value is refused); the other gate units ignore them.
    Sizes of 0 are defined: no token, H = 0, no expert or k = 0 give zeros; I = 0 gives
    each expert's output as its down_bias (zeros without one). At most 2^31 - 1 pairs
    (tokens * k) a call.

    No host sync (the pairs are sorted by expert on the device; a CUDA graph can hold the
    call); deterministic (each token sums its k rows in slot order, fp32; no atomics in
    either direction). Differentiable in hidden, top_k_weights (d w[t, j] = <dout[t], y of
    (t, j)>), both weights and both biases; only the gradients asked for are computed. The
    gate unit runs in the gate_up GEMM's epilogue. Saved for the backward: the gate_up
    output z alone, 2 k I values per token in hidden's dtype (4 k I bytes in bf16; the
    same at any expert count for a given k I; not written without a gradient); the sort
    is redone and the gate unit recomputed from z. The backward reads dout and hidden in
    expert order through its kernels' loads and makes no [tokens x k, H] tensor. Works
    under torch.compile(fullgraph=True); under torch.autocast the block runs in autocast's
    dtype and returns hidden's.
    """
    check_moe_inputs(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                     gate_up_bias, down_bias)
    check_choice("activation", activation, ACTIVATIONS)
    check_bool("interleaved", interleaved)
    gm = _check_number("gate_multiplier", gate_multiplier, "scales gate before the unit")
    dm = _check_number("down_multiplier", down_multiplier, "scales the unit's output")
    alpha = _check_number("swiglu_alpha", swiglu_alpha, "clamped_swiglu's sigmoid scale")
    limit = _check_number("swiglu_limit", swiglu_limit, "clamped_swiglu's clamp")
    if limit < 0:
        raise ValueError(f"swiglu_limit must be >= 0 (clamped_swiglu clamps gate below it "
                         f"and up into [-swiglu_limit, swiglu_limit]), got {swiglu_limit!r}")
    amp = autocast_dtype(hidden)
    if amp is not None:
        device_type = hidden.device.type
        out_dtype = hidden.dtype
        cast = [None if t is None else t.to(amp)
                for t in (hidden, gate_up_proj, down_proj, gate_up_bias, down_bias)]
        with torch.autocast(device_type, enabled=False):
            out = MOE_EXPERTS(cast[0], top_k_index, top_k_weights, cast[1], cast[2], cast[3],
                              cast[4], activation, interleaved, gm, dm, alpha, limit)
        return out.to(out_dtype)
    return MOE_EXPERTS(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                       gate_up_bias, down_bias, activation, interleaved, gm, dm, alpha, limit)


# --- OpSpec ------------------------------------------------------------------------------

SPEC = OpSpec(
    impl=moe_experts,
    make_inputs=cases.make_inputs,
    cost=cases.cost,
    suites=shapes.suites(cases.cases),
    grad_inputs=("hidden", "top_k_weights", "gate_up_proj", "down_proj", "gate_up_bias",
                 "down_bias"),
    skip=cases.skip,
    case_of=cases.case_of,
    recognise=cases.recognise,
    for_model=cases.for_model,
    fuses="per-expert loop (sort, gather, gate_up matmul, gated activation, down matmul, "
          "routing weight, index_add_)",
    notes="the routed experts whole: a device-side sort by expert (no host sync), the "
          "gate_up grouped GEMM with the gate unit in its epilogue, the down grouped GEMM, a "
          "deterministic combine; backward "
          "recomputes the gate unit from the saved gate_up output and gets the routing "
          "weights' gradient from the down projection's input gradient.",
    family="compute-bound",
    peers={"liger": "liger_fused_moe"},
    kernels={"_moe_gate_up_kernel": GEMM_DESIGN, "_grouped_matmul_kernel": GEMM_DESIGN,
             "_grouped_matmul_dw_kernel": GEMM_DESIGN, "_moe_dx_kernel": GEMM_DESIGN},
    configs=MOE_GATE_UP_CONFIGS,
    count_rows=lambda case: case["tokens"],
    aligned=lambda case: case.layout != "strided" and all(
        case[p] % 16 == 0 for p in ("hidden", "inter")),
)
