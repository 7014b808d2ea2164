"""Run an OpSpec's cases and judge every output and gradient against float64.

For each case: inputs from the spec; the reference in float64 (ground truth) and in the
case's dtype (PyTorch's own error); speedlight's implementation with every allocation
poisoned (NaN for floats) and its Triton launches counted; then the same for gradients of
every differentiable input under a random upstream gradient.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from speedlight.launch import watch_launches
from speedlight.spec import (Case, OpSpec, Tolerance, as_outputs, dtype_name, grad_leaves,
                             rand_tensor)
from speedlight.verify.compare import Check, judge

GiB = 2 ** 30


# --- instruments -------------------------------------------------------------------------

@contextlib.contextmanager
def poisoned_allocations():
    """Every torch.empty* inside is filled with NaN (floats) or the max value (ints), so an
    element a kernel forgot to write cannot pass as a plausible number."""
    was_det = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        probe = torch.empty(4)
        if not bool(torch.isnan(probe).all()):
            raise RuntimeError("torch did not poison a new allocation; verify cannot run")
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_det, warn_only=was_warn)


class LaunchCounter:
    """Counts kernel launches while active: Triton's, compiled or interpreted, and those of
    CUDA extension functions (speedlight.launch.watch_launches)."""

    def __init__(self):
        self.kernels: list[str] = []

    @property
    def count(self) -> int:
        return len(self.kernels)

    @contextlib.contextmanager
    def active(self):
        with watch_launches(into=self.kernels):
            yield self


# --- results ------------------------------------------------------------------------------

@dataclass
class CaseResult:
    op: str
    case: Case
    status: str  # pass | fail | skip | error
    reason: str = ""
    checks: list[Check] = field(default_factory=list)
    launches: int = 0
    seconds: float = 0.0
    impl: str = "triton"  # which of the OpSpec's implementations ran
    label: str = "speedlight"  # the row's `implementation`: OpSpec.label(impl)
    language: str = "triton"
    unverified: bool = False  # an implementation no GPU run has verified yet

    @property
    def worst(self) -> Check | None:
        scored = [c for c in self.checks if c.ours is not None]
        failed = [c for c in self.checks if not c.passed]
        if failed:
            return max(failed, key=lambda c: c.ratio)
        return max(scored, key=lambda c: c.ratio) if scored else None

    def to_row(self) -> dict:
        return {"tool": "verify", "op": self.op, "implementation": self.label,
                "impl": self.impl, "language": self.language, "unverified": self.unverified,
                "case_id": self.case.id, "case": self.case.to_json(), "status": self.status,
                "reason": self.reason, "launches": self.launches,
                "seconds": round(self.seconds, 4), "checks": [c.to_json() for c in self.checks]}


# --- the harness ----------------------------------------------------------------------------

def _to(inputs: dict, dtype: torch.dtype) -> dict:
    """inputs with every floating tensor converted to dtype (detached)."""
    return {k: (v.detach().to(dtype) if isinstance(v, torch.Tensor)
                and v.is_floating_point() else v) for k, v in inputs.items()}


def _to64(inputs: dict) -> dict:
    return _to(inputs, torch.float64)


@contextlib.contextmanager
def _quiet_numpy(device: torch.device):
    """The interpreter computes in numpy, which warns on inf - inf and 0 * inf; those are
    the point of the nonfinite cases, whose outputs are checked position by position."""
    if device.type != "cpu":
        yield
        return
    import numpy as np
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        yield


def _output_names(n: int) -> list[str]:
    return ["y"] if n == 1 else [f"y{i}" for i in range(n)]


def _grads(fn: Callable, inputs: dict, names: Sequence[str], upstream: Sequence[torch.Tensor]):
    outs = [o for o in as_outputs(fn(**inputs)) if isinstance(o, torch.Tensor) and o.is_floating_point()]
    pairs = [(o, g.to(o.dtype)) for o, g in zip(outs, upstream) if o.requires_grad]
    if not pairs:
        return [None] * len(names)
    return torch.autograd.grad([o for o, _ in pairs], [inputs[n] for n in names],
                               [g for _, g in pairs], allow_unused=True)


def estimate_bytes(spec: OpSpec, case: Case) -> int:
    """Device memory verify needs for a case: inputs and outputs in the case dtype, twice in
    float64, for forward and backward."""
    fwd = spec.cost(case, "fwd")
    bwd = spec.cost(case, "bwd") if spec.grad_inputs else None
    moved = fwd.bytes + (bwd.bytes if bwd else 0)
    return int(moved * (1 + 2 * 8 / case.dtype.itemsize))


def default_max_bytes(device: torch.device, max_gib: float | None = None) -> int:
    """The memory a case may use: --max-gib, else half the free GPU memory, else 8 GiB."""
    if max_gib is not None:
        return int(max_gib * GiB)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return 8 * GiB


def verify_case(spec: OpSpec, case: Case, device: torch.device | str, *,
                max_bytes: int = 8 * GiB, impl: str | None = None) -> CaseResult:
    """One case of one implementation (`impl`, default the spec's first): pass, fail,
    error, or skip with the reason (a dtype the op lacks, a case the runtime cannot run,
    over the memory budget, an implementation that cannot run here)."""
    device = torch.device(device)
    start = time.perf_counter()
    impl = impl or next(iter(spec.implementations))
    if impl not in spec.implementations:
        raise ValueError(f"{spec.name} has no implementation {impl!r}: expected one of "
                         f"{', '.join(spec.implementations)}")
    implementation = spec.implementations[impl]

    def result(status: str, reason: str = "", **kw) -> CaseResult:
        return CaseResult(spec.name, case, status, reason, impl=impl, label=spec.label(impl),
                          language=implementation.language,
                          unverified=not implementation.verified, **kw)

    if case.dtype not in spec.dtypes:
        return result("skip", f"{spec.name} does not support {dtype_name(case.dtype)}")
    reason = spec.skip(case, device) or implementation.unavailable(device)
    if reason:
        return result("skip", reason)
    need = estimate_bytes(spec, case)
    if need > max_bytes:
        return result("skip", f"needs ~{need / GiB:.1f} GiB with its float64 references, over "
                              f"the {max_bytes / GiB:.1f} GiB budget (--max-gib)")
    try:
        checks, launches = _run_case(spec, implementation.fn, case, device)
        failed = [c for c in checks if not c.passed]
        out = result("fail" if failed else "pass",
                     "; ".join(f"{c.name}: {c.reason}" for c in failed),
                     checks=checks, launches=launches)
    except Exception as e:  # an op that raises on a valid case fails it, with the reason
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno}" if tb else ""
        out = result("error", f"{type(e).__name__}: {e}{where}")
    out.seconds = time.perf_counter() - start
    return out


def verify_implementations(spec: OpSpec, case: Case, device: torch.device | str, *,
                           max_bytes: int = 8 * GiB, named: Sequence[str] = ()
                           ) -> list[CaseResult]:
    """The case verified for each of the spec's implementations a sweep runs, side by side
    (one that cannot run here is a skip with the reason, never left out); one run only by
    name (Implementation.named_only) when `named` lists it (OpSpec.swept)."""
    return [verify_case(spec, case, device, max_bytes=max_bytes, impl=name)
            for name in spec.swept(named)]


def references(spec: OpSpec, inputs: dict) -> tuple[tuple, tuple, tuple]:
    """The reference's outputs on `inputs` in float64 (ground truth), in the inputs' own
    dtypes (PyTorch's error) and in float32 (how well the case is conditioned)."""
    low = any(v.dtype != torch.float32 for v in inputs.values()
              if isinstance(v, torch.Tensor) and v.is_floating_point())
    with torch.no_grad():
        ref64 = as_outputs(spec.reference(**_to64(inputs)))
        ref_lp = as_outputs(spec.reference(**inputs))
        ref32 = as_outputs(spec.reference(**_to(inputs, torch.float32))) if low else ref_lp
    return ref64, ref_lp, ref32


def judge_outputs(ours: Sequence, refs: tuple[tuple, tuple, tuple], tol: Tolerance) -> list[Check]:
    """The checks of speedlight's outputs `ours` against `references(...)`."""
    ref64, ref_lp, ref32 = refs
    checks: list[Check] = []
    if len(ours) != len(ref64):
        checks.append(Check("outputs", False, f"{len(ours)} outputs, reference has {len(ref64)}",
                            None, None, float("inf")))
    for name, o, r, t, t32 in zip(_output_names(len(ref64)), ours, ref64, ref_lp, ref32):
        if isinstance(r, torch.Tensor):
            checks.append(judge(name, o if isinstance(o, torch.Tensor) else None, r, t, tol, t32))
    return checks


def _run_case(spec: OpSpec, fn: Callable, case: Case, device: torch.device
              ) -> tuple[list[Check], int]:
    """The checks of implementation `fn` on a case, and how many kernels it launched."""
    tol = spec.tolerance(case.dtype)
    inputs = spec.make_inputs(case, device)
    empty = any(isinstance(v, torch.Tensor) and v.numel() == 0 for v in inputs.values())
    counter = LaunchCounter()

    low = case.dtype != torch.float32
    refs = references(spec, inputs)
    with torch.no_grad(), poisoned_allocations(), counter.active(), _quiet_numpy(device):
        ours = as_outputs(fn(**inputs))
    checks = judge_outputs(ours, refs, tol)
    ref64 = refs[0]

    # gradients of every differentiable input, under one random upstream gradient per output
    leaves, names = grad_leaves(inputs, spec.grad_inputs)
    if names:
        float_refs = [r for r in ref64 if isinstance(r, torch.Tensor) and r.is_floating_point()]
        upstream = [rand_tensor(tuple(r.shape), case.with_(layout="contiguous"), device,
                                dtype=case.dtype, salt=101 + i) for i, r in enumerate(float_refs)]
        leaves64, _ = grad_leaves(_to64(inputs), names)
        g64 = _grads(spec.reference, leaves64, names, [u.to(torch.float64) for u in upstream])
        leaves_lp, _ = grad_leaves(inputs, names)
        g_lp = _grads(spec.reference, leaves_lp, names, upstream)
        if low:
            leaves32, _ = grad_leaves(_to(inputs, torch.float32), names)
            g32 = _grads(spec.reference, leaves32, names, [u.float() for u in upstream])
        else:
            g32 = g_lp
        with poisoned_allocations(), counter.active(), _quiet_numpy(device):
            g_ours = _grads(fn, leaves, names, upstream)
        for n, go, gr, gt, gt32 in zip(names, g_ours, g64, g_lp, g32):
            if gr is None:
                continue
            checks.append(judge(f"grad_{n}", go, gr, gt if gt is not None else gr.to(case.dtype),
                                tol, gt32))

    if empty:
        ok = counter.count == 0
        checks.append(Check("no_launch", ok, "" if ok else
                            f"{counter.count} kernel launch(es) on empty input: "
                            f"{', '.join(counter.kernels)}", None, None, 0.0))
    return checks, counter.count


def expand(spec: OpSpec, suite: str, dtypes: Iterable[torch.dtype], seeds: Iterable[int]) -> list[Case]:
    """The spec's suite crossed with dtypes and seeds."""
    out = []
    for base in spec.cases(suite):
        for d in dtypes:
            for s in seeds:
                out.append(base.with_(dtype=d, seed=s))
    return out


def run(specs: Sequence[OpSpec], suite: str, dtypes: Sequence[torch.dtype], seeds: Sequence[int],
        device: torch.device | str, *, max_bytes: int = 8 * GiB,
        on_result: Callable[[CaseResult, int, int], Any] | None = None) -> list[CaseResult]:
    """Verify every (spec, case, dtype, seed, implementation); on_result(result, done,
    total) after each."""
    work = [(spec, c, impl) for spec in specs for c in expand(spec, suite, dtypes, seeds)
            for impl in spec.implementations]
    results = []
    for i, (spec, case, impl) in enumerate(work, 1):
        r = verify_case(spec, case, device, max_bytes=max_bytes, impl=impl)
        results.append(r)
        if on_result is not None:
            on_result(r, i, len(work))
    return results
