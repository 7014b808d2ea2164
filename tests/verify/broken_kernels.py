"""Deliberately wrong RMSNorm kernels. Each is a plausible bug; verify must fail every one.

  missed last column  the column mask stops one short, so the last element of each row
                      is never written (it keeps the poison)
  unwritten row       the grid is one program short, so the last row is never written
  fp16 accumulator    the running sum of squares of a looped kernel is kept in fp16
  wrong eps           eps is read as 1e-2, not the eps the caller passed
  lost dw partial     the backward drops the last program's share of dw
"""

import dataclasses

import torch
import triton
import triton.language as tl

from speedlight.ops import rms_norm as op


@triton.jit
def _broken_rms_norm_fwd_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_xm, stride_ym, eps,
                                BLOCK_N: tl.constexpr, COL_LIMIT_SHORT: tl.constexpr,
                                EPS_OVERRIDE: tl.constexpr):
    """One row per program, whole row in one block; each flag plants one bug."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    limit = n_cols - 1 if COL_LIMIT_SHORT else n_cols
    mask = offs < limit
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    e = 1e-2 if EPS_OVERRIDE else eps
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + e)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp16_acc_rms_norm_fwd_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_xm, stride_ym, eps,
                                  BLOCK_N: tl.constexpr):
    """A looped row kernel whose running sum of squares is kept in fp16."""
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float16)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
        acc = (acc.to(tl.float32) + x * x).to(tl.float16)
    total = tl.zeros([1], dtype=tl.float16)
    for i in range(0, BLOCK_N):  # a sequential fp16 reduction over the lanes
        total = (total.to(tl.float32) + tl.sum(tl.where(tl.arange(0, BLOCK_N) == i,
                                                        acc.to(tl.float32), 0.0), axis=0)).to(tl.float16)
    rstd = 1.0 / tl.sqrt(tl.sum(total.to(tl.float32), axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_ym + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def _launcher(*, short_col=False, short_grid=False, fp16_acc=False, wrong_eps=False):
    def rms_norm(x, weight=None, eps=1e-6, offset=0.0):
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        rows, n = x2.shape
        grid = (rows - 1 if short_grid else rows,)
        if fp16_acc:
            _fp16_acc_rms_norm_fwd_kernel[grid](x2, weight, y, n, x2.stride(0), n, eps, BLOCK_N=64)
            return y
        _broken_rms_norm_fwd_kernel[grid](
            x2, weight, y, n, x2.stride(0), n, eps, BLOCK_N=triton.next_power_of_2(n),
            COL_LIMIT_SHORT=short_col, EPS_OVERRIDE=wrong_eps)
        return y
    return rms_norm


class _LostPartial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = op.rms_norm_fwd(x, weight, eps, 0.0)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = op.rms_norm_bwd(dy.contiguous(), x, weight, rstd, 0.0)
        # the bug: recompute dw from all row blocks but the last
        n = x.shape[-1]
        rows = x.reshape(-1, n).shape[0]
        keep = max(rows - max(rows // 4, 1), 0)
        xh = x.reshape(-1, n)[:keep].float() * rstd[:keep, None]
        dw = (dy.reshape(-1, n)[:keep].float() * xh).sum(0).to(weight.dtype)
        return dx, dw, None


def lost_dw_partial(x, weight=None, eps=1e-6, offset=0.0):
    return _LostPartial.apply(x, weight, eps)


def broken_specs():
    """(name, OpSpec, expected phrase in the failure reason)."""
    base = op.SPEC
    fwd_only = dict(grad_inputs=())
    return [
        ("missed last column", dataclasses.replace(base, impl=_launcher(short_col=True), **fwd_only),
         "NaN/Inf position"),
        ("unwritten row", dataclasses.replace(base, impl=_launcher(short_grid=True), **fwd_only),
         "NaN/Inf position"),
        ("fp16 accumulator", dataclasses.replace(base, impl=_launcher(fp16_acc=True), **fwd_only),
         "error"),
        ("wrong eps", dataclasses.replace(base, impl=_launcher(wrong_eps=True), **fwd_only),
         "error"),
        ("lost dw partial", dataclasses.replace(base, impl=lost_dw_partial), "grad_weight"),
    ]
