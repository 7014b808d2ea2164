"""The CUDA C++ implementation of RMSNorm and the fused residual add (impl="cuda").

Host launchers with the Triton launchers' signatures (ops/rms_norm.py, ops/add_rms_norm.py
register both under one op): allocate, size the launches with `cuda_row_launch` and
`cuda_column_launch` below (the sizing `speedlight inspect` reads the kernels at too:
rms_norm.cuda_launches), and call the extension built from csrc/rms_norm.cu +
csrc/rms_norm_binding.cpp on first use.

The kernels take one dtype for x, w, y and dw: a weight of another dtype than x is cast
to x's before the launch and dw cast back (the Triton kernels load w in its own dtype).
Rows need stride 1 along the hidden dim; a tensor whose last dim is strided is copied.
"""

from __future__ import annotations

import functools

import torch
import triton

from speedlight.csrc import loader
from speedlight.ops._checks import check_choice
from speedlight.ops._rms_norm_launchers import RmsNormLaunchers
from speedlight.launch import as_rows, extension_kernel, planned_sm_count
from speedlight.spec import Implementation, cuda_implementation


# --- how the kernels of csrc/rms_norm.cu are sized (its launchers here, and inspect) --------

# What every SM speedlight targets (sm_80 to sm_100a) holds at once: 2048 resident threads
# (64 warps), 64K registers, and 160 KB of shared memory for blocks (sm_80's 164 KB
# carve-out less the driver's reserve; sm_90 and sm_100 allow more).
CUDA_THREADS_PER_SM = 2048
CUDA_REGISTERS_PER_SM = 65536
CUDA_SMEM_PER_SM = 160 * 1024
# A 16-byte vector (csrc/rms_norm.cu's Vec<T>) moves this many elements of each itemsize.
CUDA_VECTOR_BYTES = 16
# The register caps csrc/rms_norm.cu compiles its kernels under (kFwdRegisters; the
# backward's __launch_bounds__(1024)): what their grids are sized by.
CUDA_FWD_REGISTERS = 48
CUDA_BWD_REGISTERS = 64
# csrc/rms_norm.cu's kMaxSharedDwBytes: the RMSNorm backward sums dw in shared memory up to
# this many bytes of fp32 sums (hidden 24576), in its dw_partial row in global memory above.
CUDA_MAX_SHARED_DW_BYTES = 96 * 1024


def cuda_row_launch(rows: int, hidden: int, dtype: torch.dtype, sm_count: int, *,
                    backward: bool = False, weight: bool = True) -> tuple[int, int]:
    """(grid, threads) of csrc/rms_norm.cu's persistent row kernels: the forward, or with
    `backward` the backward (`weight`: it sums dw, in shared memory when
    cuda_shared_dw_bytes says). Each block walks rows p, p + grid, ... moving 16-byte vectors.

    Threads: a power of two from 64 to 1024, about two vectors of the row per thread
    (hidden 4096 in bf16: 512 vectors, 256 threads), so one pass over a row is one or two
    fully coalesced sweeps. Grid: the blocks resident at once on `sm_count` SMs, by threads,
    by the kernel's register cap (CUDA_FWD_REGISTERS, CUDA_BWD_REGISTERS) and by the
    backward's shared memory, and no more than rows; at least one, so that a backward with
    a weight and no rows still writes its zero dw partials.
    """
    if not isinstance(sm_count, int) or isinstance(sm_count, bool) or sm_count < 1:
        raise ValueError(f"sm_count must be a positive int, got {sm_count!r}")
    if rows < 0 or hidden < 0:
        raise ValueError(f"rows and hidden must be >= 0, got rows={rows}, hidden={hidden}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    vectors = triton.cdiv(max(hidden, 1), CUDA_VECTOR_BYTES // itemsize)
    threads = max(64, min(1024, triton.next_power_of_2(triton.cdiv(vectors, 2))))
    registers = CUDA_BWD_REGISTERS if backward else CUDA_FWD_REGISTERS
    # registers are allocated per warp in units of 256
    regs_per_block = triton.cdiv(registers * 32, 256) * 256 * (threads // 32)
    per_sm = min(CUDA_THREADS_PER_SM // threads, CUDA_REGISTERS_PER_SM // regs_per_block)
    smem = cuda_shared_dw_bytes(hidden) if backward and weight else 0
    if smem:
        per_sm = min(per_sm, CUDA_SMEM_PER_SM // (smem + 1024))  # + the driver's reserve
    return max(1, min(rows, sm_count * max(per_sm, 1))), threads


def cuda_shared_dw_bytes(hidden: int) -> int:
    """Dynamic shared memory of the CUDA RMSNorm backward with a weight: its dw sums, as
    float4s (0 when they go to global memory instead: rows over CUDA_MAX_SHARED_DW_BYTES)."""
    nbytes = triton.cdiv(hidden, 4) * 16
    return nbytes if nbytes <= CUDA_MAX_SHARED_DW_BYTES else 0


def cuda_column_launch(hidden: int, threads: int = 256) -> tuple[int, int]:
    """(grid, threads) of csrc/rms_norm.cu's dw reduce: a block per 32 columns (a lane
    each), its `threads // 32` warps splitting the partial rows."""
    return max(1, triton.cdiv(hidden, 32)), threads



class _Extension:
    """The built extension's functions, each counted as a launch (watch_launches)."""

    def __init__(self, module):
        self.fwd = extension_kernel(module.fwd, "rms_norm_fwd_cuda")
        self.bwd = extension_kernel(module.bwd, "rms_norm_bwd_cuda")
        self.dw_reduce = extension_kernel(module.dw_reduce, "rms_norm_dw_reduce_cuda")


@functools.lru_cache(maxsize=None)
def _extension() -> _Extension:
    return _Extension(loader.extension("rms_norm"))


def _loaded() -> bool:
    return _extension.cache_info().currsize > 0


def check_cuda(x: torch.Tensor) -> None:
    """Raise CudaBuildError when the CUDA implementation cannot run on x here (a CPU build
    of torch, a CPU tensor, no compiler): before any allocation or launch. Once the
    extension is loaded only x's device is checked: asking for the build tools runs
    `ninja --version` in a subprocess, and doing so on every launch made each CUDA launch
    cost milliseconds of host time on an H200 (fwd+bwd of one row took 3.7 ms)."""
    if _loaded() and x.device.type == "cuda":
        return
    reason = loader.unavailable(x.device)
    if reason:
        raise loader.CudaBuildError(f"impl='cuda': {reason} (x: {x.device})")


def _rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """t as [rows, n_cols] with stride 1 along a row (the kernels' one layout rule)."""
    t2 = as_rows(t, n_cols)
    return t2 if t2.stride(1) == 1 or n_cols == 1 else t2.contiguous()


# --- launchers ----------------------------------------------------------------------------

def rms_norm_residual_fwd(x: torch.Tensor, residual: torch.Tensor | None,
                          weight: torch.Tensor | None, eps: float, offset: float,
                          store_rstd: bool = True
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """y, h (None without residual) and rstd (None unless store_rstd), as the Triton
    launcher of the same name returns them."""
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    rstd = (torch.empty(n_rows, dtype=torch.float32, device=x.device) if store_rstd
            else None)
    if x.numel() == 0:
        return y, h, rstd
    check_cuda(x)
    w = weight.to(x.dtype).contiguous() if weight is not None else None
    r2 = _rows(residual, n_cols) if residual is not None else None
    h2 = h.view(-1, n_cols) if h is not None else None
    grid, threads = cuda_row_launch(n_rows, n_cols, x.dtype, planned_sm_count(x.device))
    _extension().fwd(_rows(x, n_cols), r2, w, y.view(-1, n_cols), h2, rstd, eps, offset,
                     grid, threads)
    return y, h, rstd


def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                 rstd: torch.Tensor, offset: float, dh: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dx and dw as the Triton launcher of the same name (out: where dx is written; it may
    be dy)."""
    n_cols = x.shape[-1]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if x.numel() == 0:
        return dx, (torch.zeros_like(weight) if weight is not None else None)
    check_cuda(x)
    n_rows = x.numel() // n_cols
    ext = _extension()
    w = weight.to(x.dtype).contiguous() if weight is not None else None
    grid, threads = cuda_row_launch(n_rows, n_cols, x.dtype, planned_sm_count(x.device),
                                    backward=True, weight=w is not None)
    dw_partial = (torch.empty((grid, n_cols), dtype=torch.float32, device=x.device)
                  if w is not None else None)
    ext.bwd(_rows(dy, n_cols), _rows(x, n_cols), w, rstd,
            _rows(dh, n_cols) if dh is not None else None, dx.view(-1, n_cols), dw_partial,
            offset, grid, threads)
    if w is None:
        return dx, None
    dw = torch.empty(n_cols, dtype=x.dtype, device=x.device)
    ext.dw_reduce(dw_partial, dw, *cuda_column_launch(n_cols))
    return dx, dw.to(weight.dtype)


# --- the launchers registered beside the Triton ones (same signatures) ---------------------

LAUNCHERS = RmsNormLaunchers(rms_norm_residual_fwd, rms_norm_bwd)
rms_norm_fwd = LAUNCHERS.rms_norm_fwd
rms_norm_infer = LAUNCHERS.rms_norm_infer
rms_norm_inplace_bwd = LAUNCHERS.rms_norm_inplace_bwd
add_rms_norm_fwd = LAUNCHERS.add_rms_norm_fwd
add_rms_norm_infer = LAUNCHERS.add_rms_norm_infer
add_rms_norm_bwd = LAUNCHERS.add_rms_norm_bwd
add_rms_norm_inplace_bwd = LAUNCHERS.add_rms_norm_inplace_bwd


# --- the OpSpec side -------------------------------------------------------------------------

# Implementations no GPU run has verified yet: never the default, labelled in every row.
UNVERIFIED = ("cuda",)


def check_impl(op, impl: str | None, x: torch.Tensor) -> None:
    """impl must name one of op's implementations (or be None: op.default); "cuda" must be
    able to run on x here. Raises before any allocation or launch."""
    check_choice("impl", impl, op.impls, optional=True)
    if op._impl(impl) == "cuda":
        check_cuda(x)


def implementations(public, op) -> dict:
    """An RMSNorm OpSpec's implementations: the Triton one, and this CUDA C++ one (labelled
    unverified while op lists it so)."""
    return {"triton": Implementation(public),
            "cuda": cuda_implementation(functools.partial(public, impl="cuda"),
                                        verified="cuda" not in op.unverified)}
