"""Runs a suite: for every op, case, implementation and mode, one measurement, one row.

Per case: the case is verified first (a speedup is reported only for a verified case);
inputs come from the OpSpec's make_inputs (never zeros), in several copies when one set
fits in L2 (samples rotate among them); each baseline's forward output is checked against
the reference before it is timed.

Modes:
  fwd      the forward, under torch.no_grad (inference).
  bwd      the backward alone: every sample runs a fresh forward outside the timed region
           (so no graph is reused and nothing needs retain_graph), then times
           torch.autograd.grad of the outputs under a random upstream gradient, cloned
           fresh for every sample (some implementations overwrite it).
  fwd+bwd  the forward with autograd recording, then the same backward, both timed.
Tiny forward cases (at most `graph_max_bytes` moved) are timed as CUDA-graph replays of
`graph_calls` calls, which removes the host's launch overhead as a model under CUDA
graphs does; every implementation of a case is timed the same way.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from speedlight import results
from speedlight.bench import metrics
from speedlight.bench.baselines import LIGER, SPEEDLIGHT, Baselines, compile_limits, is_speedlight
from speedlight.bench.sampler import ImplTimer
from speedlight.bench.sizing import CaseSizing, mode_cost
from speedlight.bench.timer import Clock, StopRule, clock_for, default_rule
from speedlight.bench.workload import float_outputs
from speedlight.candidates import liger
from speedlight.spec import Case, OpSpec, dtype_name, rand_tensor
from speedlight.target import TENSOR_CORE_FAMILIES, Target, peak_key, resolve
# bench calls verify to check a case before timing it
from speedlight.verify.harness import verify_case

MODES = ("fwd", "bwd", "fwd+bwd")
MiB = 2 ** 20


@dataclass
class Settings:
    modes: tuple[str, ...] = MODES
    rule: StopRule | None = None  # None: the device's default
    graph: str = "auto"  # auto (tiny forward cases) | always | never
    graph_max_bytes: int = 8 * MiB
    graph_calls: int = 20
    verify: bool = True
    max_bytes: int | None = None  # device memory a case may use; None: half of what is free
    cpu_max_bytes: int = 4 * MiB  # forward traffic the interpreter is given at most
    max_copies: int = 8
    named: tuple[str, ...] = ()  # implementations run only by name to include (OpSpec.swept)


class Bench:
    """Times the cases of OpSpecs on one device and turns each measurement into a row."""

    def __init__(self, device: torch.device | str, settings: Settings | None = None,
                 baselines: Baselines | None = None, *, suite: str = "", run_id: str | None = None,
                 clock: Clock | None = None, wall: Callable[[], float] = time.perf_counter,
                 target: Target | None = None):
        self.device = torch.device(device)
        self.settings = settings or Settings()
        self.baselines = baselines or Baselines()
        self.wall = wall
        self.sizing = CaseSizing(self.device, self.settings)
        self.timer = ImplTimer(self.device, self.settings.rule or default_rule(self.device),
                               clock or clock_for(self.device), self.settings.graph_calls, wall)
        self.suite = suite
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.env = results.environment(self.device)
        if LIGER in self.baselines.names:
            self.env["liger_kernel"] = liger.version()
        self.target = target or resolve(None, None, self.device, self.env.get("driver"))
        self.env["target"] = self.target.sku.key
        self.roof, self.roof_note = metrics.device_roof(self.target)
        self.representative = self.device.type == "cuda"

    def peak_for(self, spec: OpSpec, dtype: torch.dtype) -> str:
        """The target's peak for the op: tensor cores for the families that use them, with
        tf32 for fp32 (Triton's tl.dot default)."""
        return peak_key(dtype, tensor_core=spec.family in TENSOR_CORE_FAMILIES, tf32=True)

    def base_row(self, spec: OpSpec, case: Case, impl: str, mode: str) -> dict:
        return {"tool": "bench", "run": self.run_id, "suite": self.suite, "op": spec.name,
                "implementation": impl, "case_id": case.id, "case_label": case.label,
                "case": case.to_json(), "mode": mode,
                "dtype": dtype_name(case.dtype), "representative": self.representative,
                "family": spec.family, **self.env}

    # --- one case ---------------------------------------------------------------------------

    def skip_rows(self, spec: OpSpec, case: Case, reason: str) -> list[dict]:
        names = [spec.label(i) for i in spec.swept(self.settings.named)] + list(self.baselines.names)
        return [dict(self.base_row(spec, case, n, m), status="skip", reason=reason,
                     **self.impl_fields(spec, n))
                for n in names for m in self.settings.modes]

    @staticmethod
    def impl_fields(spec: OpSpec, label: str) -> dict:
        """What a speedlight row says of its implementation: which ("triton", "cuda"), its
        language, and whether no GPU run has verified it yet; {} for a baseline's row."""
        for name, implementation in spec.implementations.items():
            if spec.label(name) == label:
                return {"impl": name, "language": implementation.language,
                        "unverified": not implementation.verified}
        return {}

    def case_rows(self, spec: OpSpec, case: Case) -> list[dict]:
        """Every implementation in every mode on one case (skip rows when it cannot run)."""
        reason = self.sizing.skip_reason(spec, case)
        if reason:
            return self.skip_rows(spec, case, reason)
        verdicts = {}  # implementation label -> (verified, status, note)
        for name, implementation in spec.swept(self.settings.named).items():
            verdicts[spec.label(name)] = (None, "not run", "--no-verify")
            if self.settings.verify and implementation.unavailable(self.device) is None:
                v = verify_case(spec, case, self.device, max_bytes=self.sizing.max_bytes(),
                                impl=name)
                verdicts[spec.label(name)] = (v.status == "pass", v.status, v.reason or (
                    "passed" if v.status == "pass" else v.status))

        n_copies = self.sizing.copies_for(spec, case)
        copies = [spec.make_inputs(case, self.device) for _ in range(n_copies)]
        if any(isinstance(v, torch.Tensor) and v.numel() == 0 for v in copies[0].values()):
            return self.skip_rows(spec, case, "empty input: nothing to time")
        with torch.no_grad():
            reference = spec.reference(**copies[0])
        upstream = [rand_tensor(tuple(o.shape), case.with_(layout="contiguous"), self.device,
                                dtype=o.dtype, salt=101 + i)
                    for i, o in enumerate(float_outputs(reference))]
        impls = self.baselines.for_case(spec, case, copies[0], self.device,
                                        named=self.settings.named)
        pristine = (spec.make_inputs(case, self.device)
                    if any(i.mutates_inputs for i in impls) else None)
        use_graph = self._graph_for(spec, case)

        rows = []
        for mode in self.settings.modes:
            by_impl: dict[str, dict] = {}
            cost = mode_cost(spec, case, mode)
            for impl in impls:
                row = self.base_row(spec, case, impl.name, mode)
                row.update(self.impl_fields(spec, impl.name))
                if impl.name in verdicts:
                    verified, verify_status, verify_note = verdicts[impl.name]
                    row.update(verified=verified, verify_status=verify_status, verify_note=verify_note)
                if cost is None:
                    row.update(status="skip", reason=f"{spec.name} has no backward")
                elif not impl.available:  # one of ours that cannot run here is a skip
                    row.update(status="skip" if is_speedlight(impl.name) else "unavailable",
                               reason=impl.reason)
                else:
                    row.update(self.timer.time(impl, spec, case, mode, copies, pristine, upstream,
                                           reference, use_graph and mode == "fwd"))
                    if row["status"] == "ok":
                        row.update(metrics.throughput(cost, row["median_us"] * 1e-6))
                        row.update(metrics.speed_of_light(
                            cost, row["median_us"] * 1e-6, self.roof,
                            self.peak_for(spec, case.dtype), self.roof_note))
                by_impl[impl.name] = row
            # each speedlight implementation over the baselines, and the others over the first
            first = by_impl[SPEEDLIGHT] if SPEEDLIGHT in by_impl else None
            for label, ours in by_impl.items():
                if not is_speedlight(label):
                    continue
                others = {n: r for n, r in by_impl.items() if not is_speedlight(n)}
                if first is not None and label != SPEEDLIGHT:
                    others[SPEEDLIGHT] = first
                ours["speedup"], ours["speedup_note"] = metrics.speedups(ours, others)
            rows += by_impl.values()
        clocks = metrics.read_clocks(self.device)  # right after the work, still under load
        for row in rows:
            row["clocks"] = clocks
        return rows

    def _graph_for(self, spec: OpSpec, case: Case) -> bool:
        if self.device.type != "cuda" or self.settings.graph == "never":
            return False
        return (self.settings.graph == "always"
                or spec.cost(case, "fwd").bytes <= self.settings.graph_max_bytes)

    # --- a whole suite ------------------------------------------------------------------------

    def run(self, specs: Sequence[OpSpec], cases: Callable[[OpSpec], Iterable[Case]], *,
            budget_s: float | None = None, on_case: Callable[[OpSpec, Case, list[dict]], Any] | None = None,
            ) -> list[dict]:
        """Rows of every case of every spec; on_case(spec, case, rows) after each case.

        With a budget, each op gets an even share of the time left when it starts, and its
        cases run in an order spread over the suite (so a run cut short still has small and
        large shapes); cases not started in time are recorded as skipped with that reason.
        """
        all_rows = []
        start = self.wall()
        with compile_limits():
            for i, spec in enumerate(specs):
                op_start = self.wall()
                share = None
                todo = list(cases(spec))
                if budget_s is not None:
                    share = max(0.0, budget_s - (op_start - start)) / (len(specs) - i)
                    todo = [todo[j] for j in spread_order(len(todo))]
                for case in todo:
                    if share is not None and self.wall() - op_start >= share:
                        rows = self.skip_rows(spec, case, f"the run's time budget (--budget-s "
                                                          f"{budget_s:g}) was spent before this case")
                    else:
                        rows = self.case_rows(spec, case)
                    all_rows += rows
                    if on_case is not None:
                        on_case(spec, case, rows)
        return all_rows


def spread_order(n: int) -> list[int]:
    """0..n-1 in bit-reversed order (0, n/2, n/4, 3n/4, ...): every prefix is spread evenly
    over the range."""
    bits = max(1, (n - 1).bit_length())
    order = [int(format(i, f"0{bits}b")[::-1], 2) for i in range(2 ** bits)]
    return [j for j in order if j < n]
