"""Small ops built to make inspect's findings fire (or not), each with its OpSpec.

  copy     y = x over [rows, cols] with any strides: exact byte counts, specialisation,
           misaligned and strided layouts
  spill    a row of BLOCK fp32 values held live per thread across a reduction, with one
           warp: 256 values per thread cannot fit 255 registers, so ptxas spills
  matmul   c = a @ b in fp16 with tl.dot; num_warps decides whether sm_90a gets wgmma
           (HGMMA needs a warp group: num_warps a multiple of 4)
  center   y = x * w - mean(x * w) per row, the product left for the compiler to contract:
           at one column the mean is the product's own register, and sm_90a's FFMA
           subtracts it from the exact product (a rounding-leak; LayerNorm's backward once)
  pick     y = x then z, through one load that picks x's or z's pointers with tl.where:
           compiles for NVIDIA; Triton 3.6 does not compile it for an AMD target (its
           pointer canonicalisation cannot follow a select between two arguments' pointers,
           which rope's kernel once did)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from speedlight.spec import Case, Cost, KernelDesign, OpSpec, rand_tensor


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_xm, stride_xn, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y[m, n] = x[m, n]; x_ptr [n_rows, n_cols] (own strides), y_ptr [n_rows, n_cols]."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < n_rows)[:, None] & (offs_n < n_cols)[None, :]
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=mask)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], x, mask=mask)


def copy(x: torch.Tensor, block_m: int = 4, block_n: int = 1024, num_warps: int = 4):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(x.shape[0], block_m), triton.cdiv(x.shape[1], block_n))
    _copy_kernel[grid](x, y, x.shape[0], x.shape[1], x.stride(0), x.stride(1), y.stride(0),
                       BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return y


def _copy_inputs(case: Case, device) -> dict:
    x = rand_tensor((case["rows"], case["cols"]), case, device)
    if case.flag("offset"):  # a view starting `offset` elements into its buffer
        k = int(case.flag("offset"))
        x = rand_tensor((case["rows"] * case["cols"] + k,), case, device)[k:].view(
            case["rows"], case["cols"])
    return {"x": x, "block_m": case.flag("bm", 4), "block_n": case.flag("bn", 1024),
            "num_warps": case.flag("warps", 4)}


COPY = OpSpec(
    name="copy",
    impl=lambda x, block_m, block_n, num_warps: copy(x, block_m, block_n, num_warps),
    reference=lambda x, **_: x.clone(),
    make_inputs=_copy_inputs,
    cost=lambda case, mode: Cost(0, 2 * case["rows"] * case["cols"] * case.dtype.itemsize),
    suites={"quick": lambda: [Case("copy", {"rows": 8, "cols": 4096})]},
)


@triton.jit
def _spill_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    """y = x * sum(x) * max(x) over one row of BLOCK values held whole by one warp."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    s = tl.sum(x, axis=0)
    m = tl.max(x, axis=0)
    tl.store(y_ptr + offs, x * s * m + x * x)


def spill(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _spill_kernel[(1,)](x, y, BLOCK=x.numel(), num_warps=1)
    return y


SPILL = OpSpec(
    name="spill",
    impl=spill,
    reference=lambda x: x * x.sum() * x.max() + x * x,
    make_inputs=lambda case, device: {"x": rand_tensor((case["n"],), case, device)},
    cost=lambda case, mode: Cost(4 * case["n"], 8 * case["n"]),
    suites={"quick": lambda: [Case("spill", {"n": 8192})]},
)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """c = a @ b; a_ptr [M, K], b_ptr [K, N], c_ptr [M, N] (unit inner strides), fp32 acc."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :],
                    mask=(offs_m[:, None] < M) & ((k0 + offs_k)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :],
                    mask=((k0 + offs_k)[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        # [BM, BK] @ [BK, BN] -> [BM, BN]
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul(a, b, num_warps=4):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
    _matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0),
                         BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=num_warps)
    return c


MATMUL = OpSpec(
    name="matmul",
    impl=lambda a, b, num_warps: matmul(a, b, num_warps),
    reference=lambda a, b, **_: a @ b,
    make_inputs=lambda case, device: {
        "a": rand_tensor((case["m"], case["k"]), case, device),
        "b": rand_tensor((case["k"], case["n"]), case, device, salt=1),
        "num_warps": case.flag("warps", 4)},
    cost=lambda case, mode: Cost(2 * case["m"] * case["n"] * case["k"],
                                 (case["m"] * case["k"] + case["k"] * case["n"]
                                  + case["m"] * case["n"]) * case.dtype.itemsize),
    suites={"quick": lambda: [Case("matmul", {"m": 64, "n": 64, "k": 64}, dtype=torch.float16)]},
    dtypes=(torch.float16,),
    family="compute-bound",
    kernels={"_matmul_kernel": KernelDesign(min_occupancy=0.0)},
)


@triton.jit
def _pick_kernel(x_ptr, z_ptr, y_ptr, BLOCK: tl.constexpr):
    """y[:BLOCK] = x[:BLOCK], y[BLOCK:] = z[:BLOCK]: x_ptr, z_ptr [BLOCK], y_ptr [2 BLOCK]."""
    offs = tl.arange(0, BLOCK)
    for step in range(0, 2):
        v = tl.load(tl.where(step == 0, x_ptr + offs, z_ptr + offs))
        tl.store(y_ptr + step * BLOCK + offs, v)


def pick(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    y = torch.empty(2 * x.numel(), dtype=x.dtype, device=x.device)
    _pick_kernel[(1,)](x, z, y, BLOCK=x.numel())
    return y


PICK = OpSpec(
    name="pick",
    impl=pick,
    reference=lambda x, z: torch.cat([x, z]),
    make_inputs=lambda case, device: {"x": rand_tensor((case["n"],), case, device),
                                      "z": rand_tensor((case["n"],), case, device, salt=1)},
    cost=lambda case, mode: Cost(0, 4 * case["n"] * case.dtype.itemsize),
    suites={"quick": lambda: [Case("pick", {"n": 64}, dtype=torch.float32)]},
)

@triton.jit
def _center_kernel(x_ptr, w_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    """y[m] = x[m] * w - mean_j(x[m, j] * w[j]); x_ptr, y_ptr [rows, n_cols], w_ptr
    [n_cols], one row per program, BLOCK >= n_cols."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    p = (tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0)
         * tl.load(w_ptr + offs, mask=mask, other=0.0))
    tl.store(y_ptr + row * n_cols + offs, p - tl.sum(p, axis=0) / n_cols, mask=mask)


def center(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _center_kernel[(x.shape[0],)](x, w, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


CENTER = OpSpec(
    name="center",
    impl=center,
    reference=lambda x, w: x * w - (x * w).mean(dim=1, keepdim=True),
    make_inputs=lambda case, device: {
        "x": rand_tensor((case["rows"], case["cols"]), case, device),
        "w": rand_tensor((case["cols"],), case, device, salt=1)},
    cost=lambda case, mode: Cost(3 * case["rows"] * case["cols"],
                                 (2 * case["rows"] + 1) * case["cols"] * case.dtype.itemsize),
    suites={"quick": lambda: [Case("center", {"rows": 8, "cols": 1}, dtype=torch.float32)]},
)

SPECS = [COPY, SPILL, MATMUL, PICK, CENTER]  # so `speedlight inspect --spec tests/inspect/kernels.py` finds them
