"""moe_experts' forward launchers and the routing they share with the backward
(ops/moe_experts_bwd.py): the sort of the (token, slot) pairs by expert, the gate_up grouped
GEMM with the gate unit in its epilogue (kernels/moe_gate_up.py), the down grouped GEMM
(kernels/grouped_matmul.py) and the combine (kernels/moe.py). The registration, the public
`speedlight.moe_experts` and its OpSpec are in ops/moe_experts.py.
"""

from __future__ import annotations

import torch
import triton

from speedlight import launch
from speedlight.kernels.moe import _moe_combine_kernel
from speedlight.kernels.moe_gate_up import _moe_gate_up_kernel
from speedlight.ops._gemm import (ensure_allocator, gemm_config, gemm_configs, precision,
                                  programs, tma_layout, use_tma)
from speedlight.ops.grouped_matmul import _w_tma, group_block, grouped_matmul_fwd
from speedlight.runtime import check_runtime, describe

# the fused gate_up GEMM's space and rule (two b tiles per k-step: gate and up), with
# tuned tables of its own (speedlight tune sweeps it)
MOE_GATE_UP_CONFIGS = gemm_configs("moe_experts")


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


def slot_order(order: torch.Tensor, offsets: torch.Tensor, k: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, dst, slot_ends): the sorted pairs regrouped by router slot, each slot's
    tokens pairs (one per token) still in expert order: src [pairs] int32 the position in
    `order` (a row of what is stored in expert order) of each, slot-major; dst [pairs]
    int32 its token; slot_ends [k, E] int32 each expert's cumulative end within its
    slot's rows (sentinel pairs past the last). A stable sort and a search on the device:
    no host sync."""
    pairs, n_experts = order.numel(), offsets.numel()
    tokens = pairs // k
    slot = order % k
    src = torch.sort(slot, stable=True)[1]  # slot-major; expert order kept within a slot
    positions = torch.arange(pairs, device=order.device)
    expert = torch.searchsorted(offsets.to(torch.int64), positions, right=True)
    key = (slot * (n_experts + 1) + expert)[src]  # ascending
    slots = torch.arange(k, device=order.device)[:, None]
    bounds = slots * (n_experts + 1) + torch.arange(n_experts, device=order.device)
    ends = torch.searchsorted(key, bounds.reshape(-1), right=True).view(k, n_experts)
    return (src.to(torch.int32), (order[src] // k).to(torch.int32),
            (ends - slots * tokens).to(torch.int32))


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
    block_m, block_n, warps = launch.elementwise_tile(tokens, y.shape[1], y.device, max_block_n=256,
                                                  interpreted_max_block_n=4096)
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
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, z (None unless store_z))."""
    tokens, k = top_k_index.shape
    n_experts, n_inter = gate_up_proj.shape[0], down_proj.shape[2]
    order, offsets = expert_order(top_k_index, n_experts)
    if tokens * k == 0 or hidden.shape[1] == 0 or n_experts == 0 or n_inter == 0:
        # nothing for an expert to compute (the backward launches nothing either)
        z = hidden.new_zeros((tokens * k, gate_up_proj.shape[1]))
        return _bias_only(top_k_index, top_k_weights, down_bias, hidden), z
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
    return out, z


def moe_experts_fwd(hidden: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor,
                    down_proj: torch.Tensor, gate_up_bias: torch.Tensor | None,
                    down_bias: torch.Tensor | None, activation: str, interleaved: bool,
                    gate_multiplier: float, down_multiplier: float, swiglu_alpha: float,
                    swiglu_limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [tokens, H] in hidden's dtype, z [pairs, 2 I] in expert order): the block's
    output and all its backward keeps (the sort is redone there from top_k_index)."""
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
