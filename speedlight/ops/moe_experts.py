"""A mixture of experts' expert block, whole: routing sort, the gate_up grouped GEMM, the
gate unit, the down grouped GEMM, the routing weights and the combine back into tokens.

Host code of kernels/moe_gate_up.py, kernels/moe.py and kernels/grouped_matmul.py: the
launchers `moe_experts_fwd` / `moe_experts_bwd` (usable without autograd), the registration
(custom ops `speedlight::moe_experts_fwd / _infer / _bwd`), the public
`speedlight.moe_experts`, and the OpSpec (its cases and cost in moe_experts_cases.py).

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
Backward (g[p] = dout[t] @ down_proj[e], before the weight):
    d top_k_weights[t, j] = <dout[t], e[p]> = <g[p], h[p]> + <dout[t], down_bias[e]>
    dh[p] = w[t, j] g[p];  dz = d gate_unit(dh);  dhidden[t] = sum over j of dz[p] @ gate_up_proj[e]
    d down_proj[e] = sum over p of e of (w dout[t])^T h[p];  d gate_up_proj[e] = dz^T hidden[t]
Saved for the backward: z (2 I values per pair in hidden's dtype: 2 k I values, 4 k I bytes
in bf16, per token), written by the gate_up kernel only when a gradient is needed, and the
sort (one int64 per pair: 8 k bytes per token; the E int32 ends per call). h is recomputed
from z in the backward's gate kernel (elementwise, against re-running the gate_up GEMM that
saving h alone would cost: z cannot be had from h), y is never needed (its dot with dout
comes from g and h).
"""

from __future__ import annotations

import math
import numbers

import torch
import triton

from speedlight import launch, shapes
from speedlight.kernels.moe import _moe_combine_kernel, _moe_gate_bwd_kernel
from speedlight.kernels.moe_gate_up import _moe_gate_up_kernel
from speedlight.ops._checks import check_bool, check_choice, check_same_device, check_same_dtype, check_tensor
from speedlight.ops import moe_experts_cases as cases
from speedlight.ops._gemm import (ensure_allocator, gemm_config, gemm_configs, precision,
                                  programs, tma_layout, use_tma)
from speedlight.ops.grouped_matmul import (MAX_GROUPS, _like_weight, _w_tma, group_block,
                                           grouped_matmul_fwd, grouped_weight_grad)
from speedlight.ops.matmul import DESIGN as GEMM_DESIGN
from speedlight.ops.registration import like, register_op
from speedlight.runtime import autocast_dtype, check_runtime, describe
from speedlight.spec import OpSpec

# the gate units: act(gate) * up for the first three, gpt-oss's clamped SwiGLU last
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "clamped_swiglu")
# the fused gate_up GEMM's space and rule (two b tiles per k-step: gate and up), with
# tuned tables of its own (speedlight tune sweeps it)
MOE_GATE_UP_CONFIGS = gemm_configs("moe_experts")


# --- launchers (usable without autograd) --------------------------------------------------

def expert_order(top_k_index: torch.Tensor, n_experts: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, group_offsets): the flattened (token, slot) pairs sorted by expert (stable:
    a token's pairs keep their slot order; int64 [tokens * k]) and each expert's
    cumulative end in that order (int32 [n_experts]). Indices outside [0, n_experts) sort
    last, past the last end. A sort and a binary search on the device: no host sync."""
    flat = top_k_index.reshape(-1)
    expert = torch.where((flat >= 0) & (flat < n_experts), flat, n_experts).to(torch.int64)
    sorted_expert, order = torch.sort(expert, stable=True)
    bounds = torch.arange(n_experts, device=flat.device, dtype=torch.int64)
    ends = torch.searchsorted(sorted_expert, bounds, right=True)
    return order, ends.to(torch.int32)


def _tile(n_rows: int, n_cols: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of an elementwise tile: ~4K elements per program on a
    GPU (or the launch context's target), large tiles under the interpreter."""
    gpu = launch.planned_sm_count(device) is not None
    max_tile, max_n = (4096, 256) if gpu else (65536, 4096)
    block_n = min(triton.next_power_of_2(max(n_cols, 1)), max_n)
    block_m = min(triton.next_power_of_2(max(n_rows, 1)), max(1, max_tile // block_n))
    return block_m, block_n, launch.warps_for_tile(block_m * block_n) if gpu else 1


def _gate_views(z: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up as views of z [pairs, 2 I]: its halves, or its even and odd columns."""
    if interleaved:
        return z[:, 0::2], z[:, 1::2]
    n = z.shape[1] // 2
    return z[:, :n], z[:, n:]


def gate_up_fwd(x: torch.Tensor, gate_up_proj: torch.Tensor, offsets: torch.Tensor,
                gate_up_bias: torch.Tensor | None, activation: str, interleaved: bool,
                gate_multiplier: float, down_multiplier: float, alpha: float, limit: float,
                store_z: bool, order: torch.Tensor | None = None, k: int = 1
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(h [M, I], z [M, 2 I] or None): the gate_up grouped GEMM with the gate unit in its
    epilogue (kernels/moe_gate_up.py) on M rows in expert order, z written only when
    store_z (a backward reads it); rows past the last expert's end are zeros in both.
    The rows are x [M, H] itself, or with `order` (the sort of the (token, slot) pairs, M
    of them) the tokens x [tokens, H] gathered in the kernel's loads: row r is x[order[r]
    // k], and no gathered copy is made."""
    m = x.shape[0] if order is None else order.numel()
    n_experts, n_inter = gate_up_proj.shape[0], gate_up_proj.shape[1] // 2
    h = torch.empty((m, n_inter), dtype=x.dtype, device=x.device)
    z = torch.empty((m, 2 * n_inter), dtype=x.dtype, device=x.device) if store_z else None
    if h.numel() == 0:
        return h, z
    if x.shape[1] == 0 or n_experts == 0:  # no launch: caught before (moe_experts_fwd)
        raise ValueError(f"gate_up_fwd needs H > 0 and experts, got x {describe(x)}, "
                         f"gate_up_proj {describe(gate_up_proj)}")
    check_runtime(x, _moe_gate_up_kernel)
    cfg = gemm_config(MOE_GATE_UP_CONFIGS, max(1, m // n_experts), n_inter, x.shape[1],
                      x.dtype, x.device, operands=2, store_dact=store_z)
    # gathered rows come by pointers, whatever x's layout; w by TMA where it can
    x_lay = tma_layout(x) if order is None else "row"
    w_lay = _w_tma(gate_up_proj)
    tma = use_tma(x.device) and x_lay is not None and w_lay is not None
    if tma and x.device.type == "cuda":
        ensure_allocator()
    # every group adds at most one partial row tile, the rows past the last group one more
    most_tiles = (triton.cdiv(m, cfg.block_m) + n_experts + 1) * triton.cdiv(n_inter,
                                                                            cfg.block_n)
    bias = gate_up_bias if gate_up_bias is not None else h
    zt = z if z is not None else h
    _moe_gate_up_kernel[(programs(most_tiles, x.device),)](
        x, order if order is not None else offsets, gate_up_proj, h, zt, bias, offsets, m,
        n_inter, x.shape[1], n_experts, k, x.stride(0),
        x.stride(1), gate_up_proj.stride(0), gate_up_proj.stride(1), gate_up_proj.stride(2),
        h.stride(0), zt.stride(0), bias.stride(0), bias.stride(1), gate_multiplier,
        down_multiplier, alpha, limit, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, BLOCK_G=group_block(n_experts), TMA=tma,
        X_KMAJOR=x_lay == "row", W_KMAJOR=w_lay == "row", GATHER=order is not None,
        INTERLEAVED=interleaved,
        HAS_BIAS=gate_up_bias is not None, ACTIVATION=activation, STORE_Z=store_z,
        PRECISION=precision(x.dtype), **cfg.options())
    return h, z


def combine(y: torch.Tensor, pos: torch.Tensor, top_k_index: torch.Tensor, n_experts: int,
            out_dtype: torch.dtype) -> torch.Tensor:
    """out [tokens, n_cols]: each token's k rows of y (at pos) summed in slot order in fp32;
    pairs of an index outside [0, n_experts) add nothing."""
    tokens, k = top_k_index.shape
    out = torch.empty((tokens, y.shape[1]), dtype=out_dtype, device=y.device)
    if out.numel() == 0:
        return out
    check_runtime(y, _moe_combine_kernel)
    block_m, block_n, warps = _tile(tokens, y.shape[1], y.device)
    _moe_combine_kernel[(triton.cdiv(tokens, block_m), triton.cdiv(y.shape[1], block_n))](
        y, pos, top_k_index, out, tokens, y.shape[1], n_experts, y.stride(0),
        top_k_index.stride(0), top_k_index.stride(1), out.stride(0), K=k, BLOCK_M=block_m,
        BLOCK_N=block_n, num_warps=warps)
    return out


def _inverse(order: torch.Tensor) -> torch.Tensor:
    """pos[pair] = where `pair` sits in the sorted order (order's inverse permutation)."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(
        order.numel(), device=order.device, dtype=order.dtype))


def _bias_only(top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
               down_bias: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """The block's output when no expert computes anything (I = 0, H = 0, no token or no
    expert): out[t] = sum over j of w[t, j] down_bias[e] (fp32, rounded once), zeros
    without a bias. No launch."""
    n_experts = 0 if down_bias is None else down_bias.shape[0]
    if down_bias is None or n_experts == 0 or hidden.numel() == 0:
        return hidden.new_zeros(hidden.shape)
    valid = (top_k_index >= 0) & (top_k_index < n_experts)
    bias = down_bias.float()[top_k_index.long().clamp(0, n_experts - 1)]  # [tokens, k, H]
    y = torch.where(valid[..., None], top_k_weights.float()[..., None] * bias, 0.0)
    return y.sum(1).to(hidden.dtype)


def _forward(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
             gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
             gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
             activation: str, interleaved: bool, gate_multiplier: float,
             down_multiplier: float, swiglu_alpha: float, swiglu_limit: float, store_z: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(out, z (None unless store_z), order, group_offsets)."""
    tokens, k = top_k_index.shape
    n_experts, n_inter = gate_up_proj.shape[0], down_proj.shape[2]
    order, offsets = expert_order(top_k_index, n_experts)
    if tokens * k == 0 or hidden.shape[1] == 0 or n_experts == 0 or n_inter == 0:
        # nothing for an expert to compute (the backward launches nothing either)
        z = hidden.new_zeros((tokens * k, gate_up_proj.shape[1]))
        return _bias_only(top_k_index, top_k_weights, down_bias, hidden), z, order, offsets
    # hidden's rows gathered in expert order by the gate_up kernel's loads (no copy)
    h, z = gate_up_fwd(hidden, gate_up_proj, offsets, gate_up_bias, activation, interleaved,
                       gate_multiplier, down_multiplier, swiglu_alpha, swiglu_limit, store_z,
                       order=order, k=k)
    # y = w_pair * (h @ down_proj[e]^T + down_bias[e]): the weight in the down GEMM's
    # epilogue (fp32, one rounding), so the combine only sums each token's k rows
    w_pair = top_k_weights.reshape(-1)[order]
    y = grouped_matmul_fwd(h, down_proj, offsets, down_bias, check_offsets=False,
                           row_scale=w_pair)[0]
    out = combine(y, _inverse(order), top_k_index, n_experts, hidden.dtype)
    return out, z, order, offsets


def moe_experts_fwd(hidden: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor,
                    down_proj: torch.Tensor, gate_up_bias: torch.Tensor | None,
                    down_bias: torch.Tensor | None, activation: str, interleaved: bool,
                    gate_multiplier: float, down_multiplier: float, swiglu_alpha: float,
                    swiglu_limit: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [tokens, H] in hidden's dtype, z [pairs, 2 I], order [pairs], group_offsets
    [E]): the block's output and what its backward reads."""
    return _forward(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                    gate_up_bias, down_bias, activation, interleaved, gate_multiplier,
                    down_multiplier, swiglu_alpha, swiglu_limit, store_z=True)


def _infer_fwd(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
               gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
               gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
               activation: str, interleaved: bool, gate_multiplier: float,
               down_multiplier: float, swiglu_alpha: float, swiglu_limit: float
               ) -> torch.Tensor:
    """The output alone (z is not written: nothing kept for a backward)."""
    return _forward(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                    gate_up_bias, down_bias, activation, interleaved, gate_multiplier,
                    down_multiplier, swiglu_alpha, swiglu_limit, store_z=False)[0]


def moe_experts_bwd(dout: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor,
                    down_proj: torch.Tensor, gate_up_bias: torch.Tensor | None,
                    down_bias: torch.Tensor | None, z: torch.Tensor, order: torch.Tensor,
                    offsets: torch.Tensor, activation: str, interleaved: bool,
                    gate_multiplier: float, down_multiplier: float, swiglu_alpha: float,
                    swiglu_limit: float, needs_grad: list[bool]):
    """(dhidden, dtop_k_weights, dgate_up_proj, ddown_proj, dgate_up_bias, ddown_bias),
    None for each gradient needs_grad does not ask for; weight gradients in each weight's
    own layout, fp32 sums per expert."""
    want_x, want_w, want_gu, want_d, want_gub, want_db = needs_grad
    tokens, k = top_k_index.shape
    n_experts, n_inter = gate_up_proj.shape[0], down_proj.shape[2]
    dtype = hidden.dtype
    pairs = order.numel()
    dout = dout.to(dtype)
    if pairs == 0 or hidden.shape[1] == 0 or n_experts == 0 or n_inter == 0:
        return _bwd_without_launch(dout, hidden, top_k_index, top_k_weights, gate_up_proj,
                                   down_proj, gate_up_bias, down_bias, needs_grad)
    token = order // k
    # dout's rows by expert, a copy: the down weight gradient's reduction reads them (a
    # gathered operand there pipelines 2 deep on sm_90a, not 3; see DESIGN-NOTES)
    dout_pairs = dout[token]  # [pairs, H]
    w_pair = top_k_weights.reshape(-1)[order]
    # g = dout_pair @ down_proj[e]: [pairs, H] @ [H, I] -> [pairs, I], fp32
    g = grouped_matmul_fwd(dout_pairs, down_proj.transpose(1, 2), offsets,
                           out_dtype=torch.float32, check_offsets=False)[0]
    wh = torch.empty((pairs, n_inter), dtype=dtype, device=hidden.device)  # w_pair * h
    dz = torch.empty_like(z)
    dw_pair = torch.zeros(pairs, dtype=torch.float32, device=hidden.device)
    if wh.numel():
        check_runtime(z, _moe_gate_bwd_kernel)
        gate, up = _gate_views(z, interleaved)
        dgate, dup = _gate_views(dz, interleaved)
        block_m, block_n, warps = _tile(pairs, n_inter, z.device)
        block_m = max(1, min(block_m, 16))
        if activation == "clamped_swiglu" and launch.planned_sm_count(z.device) is not None:
            # its clamps keep about twice the live values per element: 8 a lane, not 16
            # (sm_90a: 221 registers at 16, an eighth of the SM's warps resident)
            block_n = max(1, block_n // 2)
        _moe_gate_bwd_kernel[(triton.cdiv(pairs, block_m),)](
            g, gate, up, w_pair, wh, dgate, dup, dw_pair, pairs, n_inter, g.stride(0),
            z.stride(0), gate.stride(1), wh.stride(0), dz.stride(0), dgate.stride(1),
            gate_multiplier, down_multiplier, swiglu_alpha, swiglu_limit,
            ACTIVATION=activation, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    else:
        dz.zero_()
    d_weights = d_gate_up = d_down = d_gate_up_bias = d_down_bias = d_hidden = None
    if want_w:
        d_weights = _weights_grad(dw_pair[_inverse(order)].view(tokens, k), dout, top_k_index,
                                  top_k_weights, n_experts, down_bias)
    if want_d:
        # d down_proj[e] = sum over its pairs of dout[t]^T (w h): the weight rides on h
        # (the gate kernel's wh), so dout's rows need no weighted copy
        d_down = grouped_weight_grad(dout_pairs, wh, offsets, down_proj)[0]
    if want_db:
        d_down_bias = _down_bias_grad(dout, top_k_index, top_k_weights, down_bias)
    if want_x and n_inter == 0:
        d_hidden = torch.zeros_like(hidden)
    elif want_x:
        # dx_pair = dz @ gate_up_proj[e]: [pairs, 2I] @ [2I, H] -> [pairs, H]
        dx = grouped_matmul_fwd(dz, gate_up_proj.transpose(1, 2), offsets,
                                check_offsets=False)[0]
        d_hidden = combine(dx, _inverse(order), top_k_index, n_experts, dtype)
    if want_gu or want_gub:
        d_gate_up, d_gate_up_bias = grouped_weight_grad(dz, hidden[token], offsets,
                                                        gate_up_proj, gate_up_bias)
    return (d_hidden, d_weights, d_gate_up if want_gu else None, d_down if want_d else None,
            d_gate_up_bias if want_gub else None, d_down_bias if want_db else None)


def _weights_grad(per_slot: torch.Tensor, dout: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor, n_experts: int,
                  down_bias: torch.Tensor | None) -> torch.Tensor:
    """d top_k_weights [tokens, k]: per_slot (<g, h> of each pair, fp32) plus <dout[t],
    down_bias[e]>, zero where the index is outside [0, E)."""
    if down_bias is not None and n_experts:
        # <dout[t], down_bias[e]> for every (t, e): one [tokens, H] @ [H, E] product
        to_bias = dout.float() @ down_bias.float().t()
        per_slot = per_slot + to_bias.gather(1, top_k_index.long().clamp(0, n_experts - 1))
    valid = (top_k_index >= 0) & (top_k_index < n_experts)
    return torch.where(valid, per_slot, 0.0).to(top_k_weights.dtype)


def _down_bias_grad(dout: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, down_bias: torch.Tensor) -> torch.Tensor:
    """d down_bias[e] = sum over t of w[t, j] dout[t] where index[t, j] = e: R^T @ dout with
    the routing matrix R [tokens, E] built slot by slot (fp32, no atomics)."""
    tokens, k = top_k_index.shape
    n_experts = down_bias.shape[0]
    experts = torch.arange(n_experts, device=dout.device)
    routing = torch.zeros((tokens, n_experts), dtype=torch.float32, device=dout.device)
    for j in range(k):
        routing += torch.where(top_k_index[:, j:j + 1] == experts,
                               top_k_weights[:, j:j + 1].float(), 0.0)
    return (routing.t() @ dout.float()).to(down_bias.dtype)


def _bwd_without_launch(dout, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                        gate_up_bias, down_bias, needs_grad):
    """The gradients when no expert computes anything (no pair, H = 0, no expert or I = 0):
    h is empty or g is zeros, so only down_bias reaches the output: d top_k_weights =
    <dout[t], down_bias[e]> and d down_bias = R^T dout, the rest zeros. No launch."""
    want_x, want_w, want_gu, want_d, want_gub, want_db = needs_grad
    zeros = top_k_weights.new_zeros(top_k_index.shape, dtype=torch.float32)
    return (torch.zeros_like(hidden) if want_x else None,
            _weights_grad(zeros, dout, top_k_index, top_k_weights, gate_up_proj.shape[0],
                          down_bias) if want_w else None,
            _like_weight(gate_up_proj).zero_() if want_gu else None,
            _like_weight(down_proj).zero_() if want_d else None,
            torch.zeros_like(gate_up_bias) if want_gub else None,
            _down_bias_grad(dout, top_k_index, top_k_weights, down_bias) if want_db else None)


def _fake(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, *options):
    pairs = top_k_index.numel()
    return (hidden.new_empty(hidden.shape), hidden.new_empty((pairs, gate_up_proj.shape[1])),
            top_k_index.new_empty((pairs,), dtype=torch.int64),
            top_k_index.new_empty((gate_up_proj.shape[0],), dtype=torch.int32))


def _bwd_fake(dout, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
              gate_up_bias, down_bias, *rest):
    flags = rest[-1]
    grads = (like(hidden), like(top_k_weights), _like_weight(gate_up_proj),
             _like_weight(down_proj), like(gate_up_bias), like(down_bias))
    return tuple(t if want else None for t, want in zip(grads, flags))


MOE_EXPERTS = register_op(
    "moe_experts",
    forward=moe_experts_fwd,
    outputs=("out", "z", "order", "offsets"),
    stats=("z", "order", "offsets"),
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
    call); the combine is deterministic (each token sums its k rows in slot order, fp32).
    Differentiable in hidden, top_k_weights (d w[t, j] = <dout[t], y of (t, j)>), both
    weights and both biases; only the gradients asked for are computed. The gate unit runs
    in the gate_up GEMM's epilogue. Saved for the backward: the gate_up output z (2 k I
    values per token in hidden's dtype: 4 k I bytes in bf16; not written without a
    gradient) and the sort (k int64 per token: 8 k bytes); the gate unit is recomputed
    from z. Works under
    torch.compile(fullgraph=True); under torch.autocast the block runs in autocast's dtype
    and returns hidden's.
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
             "_grouped_matmul_dw_kernel": GEMM_DESIGN},
    configs=MOE_GATE_UP_CONFIGS,
    count_rows=lambda case: case["tokens"],
    aligned=lambda case: case.layout != "strided" and all(
        case[p] % 16 == 0 for p in ("hidden", "inter")),
)
