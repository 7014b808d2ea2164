"""moe_experts' backward launcher (usable without autograd), ops/moe_experts.py registers
it. Per sorted pair p of token t, slot j and expert e, with g[p] = dout[t] @ down_proj[e]
(before the routing weight w = top_k_weights[t, j]):
    d top_k_weights[t, j] = <dout[t], e_out[p]> = <g[p], h[p]> + <dout[t], down_bias[e]>
    dh[p] = w g[p];  dz[p] = d gate_unit(dh[p]) at z[p]
    d down_proj[e]    = sum over e's pairs of dout[t]^T (w h[p])
    d gate_up_proj[e] = sum over e's pairs of dz[p]^T hidden[t]
    dhidden[t]        = sum over j of dz[p(t, j)] @ gate_up_proj[e(t, j)]
dout and hidden are read in expert order by the kernels' loads (never gathered into a
[pairs, H] copy): g's grouped GEMM gathers dout's rows, the two weight gradients' reductions
gather dout's and hidden's, and dhidden is k grouped GEMMs, one per router slot, whose rows
scatter to distinct tokens and add into one fp32 [tokens, H] sum (kernels/moe.py
_moe_dx_kernel): no [pairs, H] tensor at all. What it allocates per token, k I fixed (so
whatever the expert count): g (4 k I bytes, fp32), w h (k I values), dz (2 k I values),
the fp32 sum (4 H bytes, not for fp32 or k = 1), and the routing's indices (about 40 k
bytes: the sort redone, the slot order).
"""

from __future__ import annotations

import torch
import triton

from speedlight import launch
from speedlight.kernels.moe import _moe_dx_kernel, _moe_gate_bwd_kernel
from speedlight.ops._gemm import ensure_allocator, gemm_config, precision, programs, use_tma
from speedlight.ops.grouped_matmul import (GROUPED_MATMUL_CONFIGS, _like_weight, _w_tma,
                                           group_block, grouped_matmul_fwd,
                                           grouped_weight_grad)
from speedlight.ops.moe_experts_launch import (_gate_views, _inverse, expert_order,
                                               slot_order)
from speedlight.runtime import check_runtime


def gate_bwd(g: torch.Tensor, z: torch.Tensor, w_pair: torch.Tensor, activation: str,
             interleaved: bool, gate_multiplier: float, down_multiplier: float, alpha: float,
             limit: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(wh [pairs, I] = w_pair h in z's dtype, dz [pairs, 2 I] in z's layout, dw_pair
    [pairs] fp32 = <g, h>) from g [pairs, I] and the saved z (kernels/moe.py
    _moe_gate_bwd_kernel, h recomputed from z)."""
    pairs, n_inter = g.shape
    wh = torch.empty((pairs, n_inter), dtype=z.dtype, device=z.device)
    dz = torch.empty_like(z)
    dw_pair = torch.zeros(pairs, dtype=torch.float32, device=z.device)
    check_runtime(z, _moe_gate_bwd_kernel)
    gate, up = _gate_views(z, interleaved)
    dgate, dup = _gate_views(dz, interleaved)
    block_m, block_n, warps = launch.elementwise_tile(pairs, n_inter, z.device, max_block_n=256,
                                                  interpreted_max_block_n=4096)
    block_m = max(1, min(block_m, 16))
    if activation == "clamped_swiglu" and launch.planned_sm_count(z.device) is not None:
        # its clamps keep about twice the live values per element: 8 a lane, not 16
        # (sm_90a: 221 registers at 16, an eighth of the SM's warps resident)
        block_n = max(1, block_n // 2)
    _moe_gate_bwd_kernel[(triton.cdiv(pairs, block_m),)](
        g, gate, up, w_pair, wh, dgate, dup, dw_pair, pairs, n_inter, g.stride(0),
        z.stride(0), gate.stride(1), wh.stride(0), dz.stride(0), dgate.stride(1),
        gate_multiplier, down_multiplier, alpha, limit,
        ACTIVATION=activation, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return wh, dz, dw_pair


def hidden_grad(dz: torch.Tensor, gate_up_proj: torch.Tensor, order: torch.Tensor,
                offsets: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """dhidden [tokens, H] in dtype: sum over slots j of dz[p(t, j)] @ gate_up_proj[e],
    one _moe_dx_kernel launch per slot in slot order, each adding its tokens' rows into
    an fp32 sum (dhidden itself when fp32 or k = 1; the last slot writes dhidden, rounded
    once): deterministic, no atomics, no [pairs, H] tensor."""
    n_experts, n_gate_up, n_hidden = gate_up_proj.shape
    tokens = order.numel() // k
    src, dst, ends = slot_order(order, offsets, k)
    out = torch.empty((tokens, n_hidden), dtype=dtype, device=dz.device)
    total = out if dtype == torch.float32 or k == 1 else torch.empty(
        (tokens, n_hidden), dtype=torch.float32, device=dz.device)
    w = gate_up_proj.transpose(1, 2)  # [E, H, 2 I]: N = H, K = 2 I
    check_runtime(dz, _moe_dx_kernel)
    cfg = gemm_config(GROUPED_MATMUL_CONFIGS, max(1, tokens // n_experts), n_hidden,
                      n_gate_up, dz.dtype, dz.device, out_dtype=torch.float32, residual=True)
    w_lay = _w_tma(w)
    tma = use_tma(dz.device) and w_lay is not None
    if tma and dz.device.type == "cuda":
        ensure_allocator()
    most_tiles = ((triton.cdiv(tokens, cfg.block_m) + n_experts + 1)
                  * triton.cdiv(n_hidden, cfg.block_n))
    for j in range(k):
        rows = slice(j * tokens, (j + 1) * tokens)
        target = out if j == k - 1 else total
        _moe_dx_kernel[(programs(most_tiles, dz.device),)](
            dz, src[rows], dst[rows], w, total, target, ends[j], tokens, n_hidden, n_gate_up,
            n_experts, dz.stride(0), dz.stride(1), w.stride(0), w.stride(1), w.stride(2),
            total.stride(0), target.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, BLOCK_G=group_block(n_experts), TMA=tma,
            W_KMAJOR=w_lay == "row", ACCUMULATE=j > 0, PRECISION=precision(dz.dtype),
            **cfg.options())
    return out


def moe_experts_bwd(dout: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor,
                    down_proj: torch.Tensor, gate_up_bias: torch.Tensor | None,
                    down_bias: torch.Tensor | None, z: torch.Tensor, activation: str,
                    interleaved: bool, gate_multiplier: float, down_multiplier: float,
                    swiglu_alpha: float, swiglu_limit: float, needs_grad: list[bool]):
    """(dhidden, dtop_k_weights, dgate_up_proj, ddown_proj, dgate_up_bias, ddown_bias),
    None for each gradient needs_grad does not ask for; weight gradients in each weight's
    own layout, fp32 sums per expert (see the module docstring)."""
    want_x, want_w, want_gu, want_d, want_gub, want_db = needs_grad
    tokens, k = top_k_index.shape
    n_experts, n_inter = gate_up_proj.shape[0], down_proj.shape[2]
    dout = dout.to(hidden.dtype)
    if tokens * k == 0 or hidden.shape[1] == 0 or n_experts == 0 or n_inter == 0:
        return _bwd_without_launch(dout, hidden, top_k_index, top_k_weights, gate_up_proj,
                                   down_proj, gate_up_bias, down_bias, needs_grad)
    # the forward's sort again (tokens x k integers: nothing of the routing is saved)
    order, offsets = expert_order(top_k_index, n_experts)
    w_pair = top_k_weights.reshape(-1)[order]
    # g = dout[t] @ down_proj[e]: [pairs, H] @ [H, I] -> [pairs, I], fp32, dout's rows
    # gathered in expert order by the loads
    g = grouped_matmul_fwd(dout, down_proj.transpose(1, 2), offsets, out_dtype=torch.float32,
                           check_offsets=False, rows=order, rows_div=k)[0]
    wh, dz, dw_pair = gate_bwd(g, z, w_pair, activation, interleaved, gate_multiplier,
                               down_multiplier, swiglu_alpha, swiglu_limit)
    del g
    d_weights = d_gate_up = d_down = d_gate_up_bias = d_down_bias = d_hidden = None
    if want_w:
        d_weights = _weights_grad(dw_pair[_inverse(order)].view(tokens, k), dout, top_k_index,
                                  top_k_weights, n_experts, down_bias)
    if want_d:
        # d down_proj[e] = sum over its pairs of dout[t]^T (w h): the weight rides on h
        # (the gate kernel's wh), dout's rows gathered by the reduction's loads
        d_down = grouped_weight_grad(dout, wh, offsets, down_proj, rows=order, gather="dz",
                                     rows_div=k)[0]
    del wh
    if want_db:
        d_down_bias = _down_bias_grad(dout, top_k_index, top_k_weights, down_bias)
    if want_x:
        d_hidden = hidden_grad(dz, gate_up_proj, order, offsets, k, hidden.dtype)
    if want_gu or want_gub:
        d_gate_up, d_gate_up_bias = grouped_weight_grad(dz, hidden, offsets, gate_up_proj,
                                                        gate_up_bias, rows=order, gather="x",
                                                        rows_div=k)
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
