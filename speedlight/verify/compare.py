"""Error metrics against a float64 reference, and the pass rule.

An output passes when
  * its shape and dtype are those PyTorch gives,
  * NaN, +Inf and -Inf sit exactly where the float64 reference has them,
  * its relative L2 error is at most k * max(PyTorch's relative L2 error, floor) and at
    most the dtype's ceiling (raised to k * the error of PyTorch in float32 where that is
    larger: an ill-conditioned case, such as the gradient of RMSNorm over one column, where
    no float32 computation does better),
  * its max abs error is at most k * max(PyTorch's max abs error, floor * max|ref|).
PyTorch's error is that of the same reference function run in the case's dtype on the
same inputs; floor is the dtype's unit roundoff (PyTorch's error is never taken as less
than one rounding, which it happens to beat on lucky inputs); k, floor and ceiling come
from the one tolerance table in speedlight.spec. ratio = our error / max(PyTorch's, floor),
so a check passes the k-rule exactly when ratio <= k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from speedlight.spec import Tolerance

MAX_BAD_INDICES = 5


@dataclass
class Metrics:
    rel_l2: float
    max_abs: float
    max_rel: float
    ref_scale: float  # max |ref| over finite elements


@dataclass
class Check:
    """The verdict on one output or gradient of one case."""

    name: str
    passed: bool
    reason: str
    ours: Metrics | None
    torch: Metrics | None
    ratio: float  # worst of our error / PyTorch's error (each guarded by the floor)
    rel_bound: float = 0.0
    abs_bound: float = 0.0
    ceiling: float = 0.0
    mismatches: int = 0
    bad_indices: list = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def _first_indices(mask: torch.Tensor, count: int = MAX_BAD_INDICES) -> list[list[int]]:
    idx = mask.nonzero()[:count]
    return idx.tolist()


def metrics(out: torch.Tensor, ref: torch.Tensor) -> Metrics:
    """Errors of `out` against `ref` (float64) over the elements finite in both."""
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    finite = torch.isfinite(r) & torch.isfinite(o)
    if not bool(finite.any()):
        return Metrics(0.0, 0.0, 0.0, 0.0)
    d = (o - r)[finite]
    rf = r[finite]
    scale = rf.abs().max().item()
    ref_norm = rf.norm().item()
    rel_l2 = d.norm().item() / ref_norm if ref_norm > 0 else d.norm().item()
    max_abs = d.abs().max().item()
    guard = max(scale * 1e-6, 1e-300)
    max_rel = (d.abs() / rf.abs().clamp_min(guard)).max().item()
    return Metrics(rel_l2, max_abs, max_rel, scale)


def _nonfinite_mismatch(o: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return ((torch.isnan(o) != torch.isnan(r)) | (torch.isposinf(o) != torch.isposinf(r))
            | (torch.isneginf(o) != torch.isneginf(r)))


def judge(name: str, out: torch.Tensor | None, ref64: torch.Tensor, torch_out: torch.Tensor,
          tol: Tolerance, torch_fp32: torch.Tensor | None = None) -> Check:
    """Compare one output of speedlight against float64, with PyTorch's own error in the
    same dtype as yardstick; torch_fp32 (PyTorch's output in float32) measures how well the
    case is conditioned."""
    if out is None:
        return Check(name, False, "no output (expected one)", None, None, float("inf"))
    if tuple(out.shape) != tuple(ref64.shape):
        return Check(name, False, f"shape {tuple(out.shape)} != reference {tuple(ref64.shape)}",
                     None, None, float("inf"))
    if out.dtype != torch_out.dtype:
        return Check(name, False, f"dtype {out.dtype} != PyTorch's {torch_out.dtype}",
                     None, None, float("inf"))
    if out.numel() == 0:
        return Check(name, True, "empty", Metrics(0.0, 0.0, 0.0, 0.0), Metrics(0.0, 0.0, 0.0, 0.0), 0.0)

    o = out.detach().to(torch.float64)
    r = ref64.detach().to(torch.float64)
    ours, theirs = metrics(o, r), metrics(torch_out, r)
    rel_yardstick = max(theirs.rel_l2, tol.floor)
    abs_yardstick = max(theirs.max_abs, tol.floor * ours.ref_scale, 1e-300)
    rel_bound, abs_bound = tol.k * rel_yardstick, tol.k * abs_yardstick
    ratio = max(ours.rel_l2 / rel_yardstick, ours.max_abs / abs_yardstick)

    bad_nonfinite = _nonfinite_mismatch(o, r)
    finite = torch.isfinite(o) & torch.isfinite(r)
    bad_value = finite & ((o - r).abs() > abs_bound)
    bad = bad_nonfinite | bad_value
    n_bad = int(bad.sum().item())
    ceiling = tol.ceiling
    if torch_fp32 is not None and torch_fp32.shape == r.shape:
        ceiling = max(ceiling, tol.k * metrics(torch_fp32, r).rel_l2)
    check = Check(name, True, "", ours, theirs, ratio, rel_bound, abs_bound, ceiling, n_bad,
                  _first_indices(bad))

    reasons = []
    if bool(bad_nonfinite.any()):
        reasons.append(f"{int(bad_nonfinite.sum())} NaN/Inf position(s) differ from the reference")
    if ours.rel_l2 > rel_bound:
        reasons.append(f"rel L2 error {ours.rel_l2:.3g} > {rel_bound:.3g} "
                       f"(k={tol.k:g} x PyTorch's {theirs.rel_l2:.3g})")
    if ours.rel_l2 > ceiling:
        reasons.append(f"rel L2 error {ours.rel_l2:.3g} > ceiling {ceiling:.3g}")
    if ours.max_abs > abs_bound:
        reasons.append(f"max abs error {ours.max_abs:.3g} > {abs_bound:.3g} "
                       f"(k={tol.k:g} x PyTorch's {theirs.max_abs:.3g})")
    if reasons:
        check.passed = False
        check.reason = "; ".join(reasons)
    return check
