"""Small kernels whose loops inspect counts, with known figures.

  scores  acc += a @ b_j over key blocks j, the first `n_masked` blocks masked by a
          tl.where on the dot's result: with SPLIT, a masked loop then an unmasked one
          (acc = tl.dot(a, b, acc)); without, every block through the masked loop. Per
          iteration each loop issues BLOCK_K / 16 HGMMA.64x64x16 per warp on sm_90a
          (2 * 64 * 64 * BLOCK_K FLOPs a program) and the masked one BM * BN / 128 FSEL
          per thread (one per accumulator element, 4 warps).
  rows    y[r] = x[r] / sqrt(mean(x[r]^2)), rows of BLOCK fp32 strided over the grid as a
          persistent norm walks them: each row loaded where it is used, or (PREFETCH) the
          next row loaded before this one is normalized. Either loads BLOCK * 4 / 128
          bytes per thread per iteration (4 warps).
  twodots acc = a1 @ b1 + a2 @ b2 accumulated in one loop, the two dots feeding one
          accumulator (what Triton merges on Blackwell), beside a control with one dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from speedlight.spec import Case, Cost, KernelDesign, OpSpec, rand_tensor

BM, BN, BK = 64, 64, 32
ROW = 1024  # fp32 elements a row: 32 bytes per thread of 4 warps


@triton.jit
def _scores_kernel(a_ptr, b_ptr, c_ptr, n_masked, n_blocks, limit,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT: tl.constexpr):
    """c = sum_j mask_j(a @ b_j); a_ptr [BM, BK], b_ptr [n_blocks, BK, BN], c_ptr [BM, BN]
    fp32. Blocks j < n_masked (all of them without SPLIT) keep columns j * BN + n <= limit.
    SPLIT: the blocks from n_masked on run in a second loop with no mask."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    masked_end = n_masked if SPLIT else n_blocks
    for j in range(0, masked_end):
        b = tl.load(b_ptr + j * BLOCK_K * BLOCK_N + offs_k[:, None] * BLOCK_N + offs_n[None, :])
        # [BM, BK] @ [BK, BN] -> [BM, BN]
        s = tl.dot(a, b)
        acc += tl.where((j * BLOCK_N + offs_n)[None, :] <= limit, s, 0.0)
    if SPLIT:
        for j in range(n_masked, n_blocks):
            b = tl.load(b_ptr + j * BLOCK_K * BLOCK_N + offs_k[:, None] * BLOCK_N
                        + offs_n[None, :])
            # [BM, BK] @ [BK, BN] -> [BM, BN]
            acc = tl.dot(a, b, acc)
    tl.store(c_ptr + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


def scores(a, b, n_masked, limit, split):
    c = torch.empty((BM, BN), dtype=torch.float32, device=a.device)
    _scores_kernel[(1,)](a, b, c, n_masked, b.shape[0], limit, BLOCK_M=BM, BLOCK_N=BN,
                         BLOCK_K=BK, SPLIT=split, num_warps=4)
    return c


def _scores_reference(a, b, n_masked, limit, split):
    out = torch.zeros(BM, BN, dtype=torch.float64)
    for j in range(b.shape[0]):
        s = a.double() @ b[j].double()
        if j < n_masked or not split:
            s = torch.where(torch.arange(j * BN, (j + 1) * BN) <= limit, s, 0.0)
        out += s
    return out


SCORES = OpSpec(
    name="scores",
    impl=scores,
    reference=_scores_reference,
    make_inputs=lambda case, device: {
        "a": rand_tensor((BM, BK), case, device),
        "b": rand_tensor((case["blocks"], BK, BN), case, device, salt=1),
        "n_masked": 2, "limit": BN + BN // 2, "split": bool(case.flag("split"))},
    cost=lambda case, mode: Cost(2 * BM * BN * BK * case["blocks"],
                                 (BM * BK + case["blocks"] * BK * BN) * 2 + BM * BN * 4),
    suites={"quick": lambda: [Case("scores", {"blocks": 4}, dtype=torch.float16)]},
    dtypes=(torch.float16,),
    family="compute-bound",
    kernels={"_scores_kernel": KernelDesign(min_occupancy=0.0)},
)


@triton.jit
def _rows_kernel(x_ptr, y_ptr, n_rows, BLOCK: tl.constexpr, PREFETCH: tl.constexpr):
    """y[r] = x[r] * rsqrt(mean(x[r]^2) + 1e-6); x_ptr, y_ptr [n_rows, BLOCK] fp32. Program
    p takes rows p, p + P, ...: each loaded where it is used, or with PREFETCH one row ahead."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    if PREFETCH:
        x = tl.load(x_ptr + tl.minimum(pid, n_rows - 1) * BLOCK + offs)
        for row in range(pid, n_rows, step):
            x_next = tl.load(x_ptr + tl.minimum(row + step, n_rows - 1) * BLOCK + offs)
            y = x * tl.rsqrt(tl.sum(x * x, axis=0) / BLOCK + 1e-6)
            tl.store(y_ptr + row * BLOCK + offs, y)
            x = x_next
    else:
        for row in range(pid, n_rows, step):
            x = tl.load(x_ptr + row * BLOCK + offs)
            y = x * tl.rsqrt(tl.sum(x * x, axis=0) / BLOCK + 1e-6)
            tl.store(y_ptr + row * BLOCK + offs, y)


def rows(x, prefetch):
    y = torch.empty_like(x)
    _rows_kernel[(4,)](x, y, x.shape[0], BLOCK=ROW, PREFETCH=prefetch, num_warps=4)
    return y


ROWS = OpSpec(
    name="rows",
    impl=rows,
    reference=lambda x, prefetch: x.double() * torch.rsqrt((x.double() ** 2).mean(1, keepdim=True)
                                                           + 1e-6),
    make_inputs=lambda case, device: {"x": rand_tensor((case["rows"], ROW), case, device),
                                      "prefetch": bool(case.flag("prefetch"))},
    cost=lambda case, mode: Cost(3 * case["rows"] * ROW, 8 * case["rows"] * ROW),
    suites={"quick": lambda: [Case("rows", {"rows": 16}, dtype=torch.float32)]},
    dtypes=(torch.float32,),
)


@triton.jit
def _twodots_kernel(a1_ptr, b1_ptr, a2_ptr, b2_ptr, c_ptr, n_blocks,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    TWO: tl.constexpr):
    """c = sum_j a1 @ b1_j (+ a2 @ b2_j with TWO) into one fp32 accumulator; a*_ptr [BM, BK],
    b*_ptr [n_blocks, BK, BN], c_ptr [BM, BN]."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a1 = tl.load(a1_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    a2 = tl.load(a2_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for j in range(0, n_blocks):
        tile = j * BLOCK_K * BLOCK_N + offs_k[:, None] * BLOCK_N + offs_n[None, :]
        # [BM, BK] @ [BK, BN] -> [BM, BN]
        acc = tl.dot(a1, tl.load(b1_ptr + tile), acc)
        if TWO:
            # [BM, BK] @ [BK, BN] -> [BM, BN], into the same accumulator
            acc = tl.dot(a2, tl.load(b2_ptr + tile), acc)
    tl.store(c_ptr + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


def twodots(a1, b1, a2, b2, two):
    c = torch.empty((a1.shape[0], b1.shape[2]), dtype=torch.float32, device=a1.device)
    _twodots_kernel[(1,)](a1, b1, a2, b2, c, b1.shape[0], BLOCK_M=a1.shape[0],
                          BLOCK_N=b1.shape[2], BLOCK_K=a1.shape[1], TWO=two, num_warps=4)
    return c


TWODOTS = OpSpec(
    name="twodots",
    impl=twodots,
    reference=lambda a1, b1, a2, b2, two: (a1.double() @ b1.double()).sum(0)
    + ((a2.double() @ b2.double()).sum(0) if two else 0),
    make_inputs=lambda case, device: {
        "a1": rand_tensor((128, BK), case, device),
        "b1": rand_tensor((case["blocks"], BK, BN), case, device, salt=1),
        "a2": rand_tensor((128, BK), case, device, salt=2),
        "b2": rand_tensor((case["blocks"], BK, BN), case, device, salt=3),
        "two": bool(case.flag("two"))},
    cost=lambda case, mode: Cost(4 * 128 * BN * BK * case["blocks"], 0),
    suites={"quick": lambda: [Case("twodots", {"blocks": 4}, dtype=torch.float16)]},
    dtypes=(torch.float16,),
    family="compute-bound",
    kernels={"_twodots_kernel": KernelDesign(min_occupancy=0.0)},
)
