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

import math
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from speedlight import results
from speedlight.bench import liger, metrics
from speedlight.bench.baselines import LIGER, SPEEDLIGHT, Baselines, Implementation, compile_limits
from speedlight.bench.timer import (Clock, GpuLead, L2Flush, Measurement, StopRule, capture_graph,
                                    clock_for, default_rule, flush_for, l2_bytes, measure)
from speedlight.spec import Case, Cost, OpSpec, dtype_name, rand_tensor
from speedlight.target import TENSOR_CORE_FAMILIES, Target, peak_key, resolve
# bench calls verify (to check a case before timing it) and differentiates the same way
from speedlight.verify.compare import metrics as error_metrics
from speedlight.verify.harness import _as_tuple, _leaves, verify_case

MODES = ("fwd", "bwd", "fwd+bwd")
MiB, GiB = 2 ** 20, 2 ** 30


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


def _float_outputs(out) -> list[torch.Tensor]:
    return [o for o in _as_tuple(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _error(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno}" if tb else ""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:300]}{where}"


def output_mismatch(outs, refs, spec: OpSpec, dtype: torch.dtype) -> str | None:
    """Why a baseline's forward output is not the reference's, or None when it is (NaN/Inf
    positions equal, relative L2 difference under the dtype's ceiling)."""
    outs, refs = _as_tuple(outs), _as_tuple(refs)
    if len(outs) != len(refs):
        return f"{len(outs)} outputs, the reference gives {len(refs)}"
    ceiling = spec.tolerance(dtype).ceiling
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(r, torch.Tensor):
            continue
        if not isinstance(o, torch.Tensor) or tuple(o.shape) != tuple(r.shape):
            got = tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
            return f"output {i} is {got}, the reference's is {tuple(r.shape)}"
        if not r.is_floating_point():
            if not torch.equal(o.cpu(), r.cpu()):
                return f"output {i} differs from the reference"
            continue
        o64, r64 = o.detach().double(), r.detach().double()
        if not torch.equal(torch.isnan(o64), torch.isnan(r64)) or not torch.equal(
                torch.isinf(o64) & (o64 > 0), torch.isinf(r64) & (r64 > 0)):
            return f"output {i}: NaN/Inf positions differ from the reference"
        err = error_metrics(o64, r64).rel_l2
        if err > ceiling:
            return f"output {i}: relative L2 difference {err:.3g} from the reference > {ceiling:.3g}"
    return None


class Bench:
    """Times the cases of OpSpecs on one device and turns each measurement into a row."""

    def __init__(self, device: torch.device | str, settings: Settings | None = None,
                 baselines: Baselines | None = None, *, suite: str = "", run_id: str | None = None,
                 clock: Clock | None = None, wall: Callable[[], float] = time.perf_counter,
                 target: Target | None = None):
        self.device = torch.device(device)
        self.settings = settings or Settings()
        self.baselines = baselines or Baselines()
        self.rule = self.settings.rule or default_rule(self.device)
        self.clock = clock or clock_for(self.device)
        self.wall = wall
        self.suite = suite
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.env = results.environment(self.device)
        if LIGER in self.baselines.names:
            self.env["liger_kernel"] = liger.version()
        self.target = target or resolve(None, None, self.device, self.env.get("driver"))
        self.env["target"] = self.target.sku.key
        self.roof, self.roof_note = metrics.device_roof(self.target)
        self.representative = self.device.type == "cuda"
        self._flush: L2Flush | None = None
        self._lead: GpuLead | None = None

    # --- shared pieces -----------------------------------------------------------------

    def peak_for(self, spec: OpSpec, dtype: torch.dtype) -> str:
        """The target's peak for the op: tensor cores for the families that use them, with
        tf32 for fp32 (Triton's tl.dot default)."""
        return peak_key(dtype, tensor_core=spec.family in TENSOR_CORE_FAMILIES, tf32=True)

    def flush(self) -> L2Flush:
        if self._flush is None:
            self._flush = flush_for(self.device)
        return self._flush

    def lead(self) -> GpuLead | None:
        if self.device.type != "cuda":
            return None
        if self._lead is None:
            self._lead = GpuLead(self.device)
        return self._lead

    def max_bytes(self) -> int:
        if self.settings.max_bytes is not None:
            return self.settings.max_bytes
        if self.device.type == "cuda":
            # free memory, plus what torch's allocator holds cached but unused
            free = torch.cuda.mem_get_info(self.device)[0]
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            return (free + cached) // 2
        return 8 * GiB

    def base_row(self, spec: OpSpec, case: Case, impl: str, mode: str) -> dict:
        return {"tool": "bench", "run": self.run_id, "suite": self.suite, "op": spec.name,
                "implementation": impl, "case_id": case.id, "case_label": case.label,
                "case": case.to_json(), "mode": mode,
                "dtype": dtype_name(case.dtype), "representative": self.representative,
                "family": spec.family, **self.env}

    def cost(self, spec: OpSpec, case: Case, mode: str) -> Cost | None:
        if mode == "fwd":
            return spec.cost(case, "fwd")
        bwd = spec.cost(case, "bwd") if spec.grad_inputs else None
        if bwd is None:
            return None
        return bwd if mode == "bwd" else spec.cost(case, "fwd") + bwd

    def skip_reason(self, spec: OpSpec, case: Case) -> str | None:
        if case.dtype not in spec.dtypes:
            return f"{spec.name} does not support {dtype_name(case.dtype)}"
        reason = spec.skip(case, self.device)
        if reason:
            return reason
        fwd = spec.cost(case, "fwd")
        if fwd.bytes == 0:
            return "empty input: nothing to time"
        if self.device.type == "cpu" and fwd.bytes > self.settings.cpu_max_bytes:
            return (f"too large for the Triton interpreter on CPU ({fwd.bytes / MiB:.1f} MiB "
                    f"moved per forward, budget {self.settings.cpu_max_bytes / MiB:g} MiB: "
                    f"--cpu-max-mib); it runs on a GPU")
        need = self._bytes_needed(spec, case, 1)
        if need > self.max_bytes():
            return (f"needs ~{need / GiB:.1f} GiB, over the {self.max_bytes() / GiB:.1f} GiB "
                    f"budget (--max-gib)")
        return None

    def _bytes_needed(self, spec: OpSpec, case: Case, copies: int) -> int:
        """Inputs (copies + one pristine set), outputs, gradients and a baseline's
        temporaries: a generous multiple of the compulsory traffic."""
        fwd = spec.cost(case, "fwd").bytes
        bwd = self.cost(spec, case, "bwd")
        return int(fwd * (copies + 3) + (bwd.bytes if bwd else 0) * 2)

    def copies_for(self, spec: OpSpec, case: Case) -> int:
        """Input sets to rotate among: enough to cover twice the L2 when one set fits in it."""
        one = spec.cost(case, "fwd").bytes
        l2 = l2_bytes(self.device)
        if one > l2:
            return 1
        n = min(self.settings.max_copies, math.ceil(2 * l2 / max(one, 1)))
        while n > 1 and self._bytes_needed(spec, case, n) > self.max_bytes():
            n -= 1
        return max(n, 1)

    # --- one case ---------------------------------------------------------------------------

    def skip_rows(self, spec: OpSpec, case: Case, reason: str) -> list[dict]:
        names = [SPEEDLIGHT, *self.baselines.names]
        return [dict(self.base_row(spec, case, n, m), status="skip", reason=reason)
                for n in names for m in self.settings.modes]

    def case_rows(self, spec: OpSpec, case: Case) -> list[dict]:
        """Every implementation in every mode on one case (skip rows when it cannot run)."""
        reason = self.skip_reason(spec, case)
        if reason:
            return self.skip_rows(spec, case, reason)
        verified, verify_status, verify_note = None, "not run", "--no-verify"
        if self.settings.verify:
            v = verify_case(spec, case, self.device, max_bytes=self.max_bytes())
            verified, verify_status = v.status == "pass", v.status
            verify_note = v.reason or ("passed" if v.status == "pass" else v.status)

        n_copies = self.copies_for(spec, case)
        copies = [spec.make_inputs(case, self.device) for _ in range(n_copies)]
        if any(isinstance(v, torch.Tensor) and v.numel() == 0 for v in copies[0].values()):
            return self.skip_rows(spec, case, "empty input: nothing to time")
        with torch.no_grad():
            reference = spec.reference(**copies[0])
        upstream = [rand_tensor(tuple(o.shape), case.with_(layout="contiguous"), self.device,
                                dtype=o.dtype, salt=101 + i)
                    for i, o in enumerate(_float_outputs(reference))]
        impls = self.baselines.for_case(spec, case, copies[0], self.device)
        pristine = (spec.make_inputs(case, self.device)
                    if any(i.mutates_inputs for i in impls) else None)
        use_graph = self._graph_for(spec, case)

        rows = []
        for mode in self.settings.modes:
            by_impl: dict[str, dict] = {}
            cost = self.cost(spec, case, mode)
            for impl in impls:
                row = self.base_row(spec, case, impl.name, mode)
                if impl.name == SPEEDLIGHT:
                    row.update(verified=verified, verify_status=verify_status, verify_note=verify_note)
                if cost is None:
                    row.update(status="skip", reason=f"{spec.name} has no backward")
                elif not impl.available:
                    row.update(status="unavailable", reason=impl.reason)
                else:
                    row.update(self._timed(impl, spec, case, mode, copies, pristine, upstream,
                                           reference, use_graph and mode == "fwd"))
                    if row["status"] == "ok":
                        row.update(metrics.throughput(cost, row["median_us"] * 1e-6))
                        row.update(metrics.speed_of_light(
                            cost, row["median_us"] * 1e-6, self.roof,
                            self.peak_for(spec, case.dtype), self.roof_note))
                by_impl[impl.name] = row
            ours = by_impl[SPEEDLIGHT]
            ours["speedup"], ours["speedup_note"] = metrics.speedups(
                ours, {n: r for n, r in by_impl.items() if n != SPEEDLIGHT})
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

    # --- one implementation in one mode -------------------------------------------------------

    def _timed(self, impl: Implementation, spec: OpSpec, case: Case, mode: str, copies: list[dict],
               pristine: dict | None, upstream: list[torch.Tensor], reference: Any,
               use_graph: bool) -> dict:
        failed = "error" if impl.name == SPEEDLIGHT else "unavailable"
        restore = self._restorer(copies, pristine) if impl.mutates_inputs else None
        try:
            if impl.checked:
                with torch.no_grad():
                    why = output_mismatch(impl.fn(**copies[0]), reference, spec, case.dtype)
                if restore:
                    restore(0)
                if why:
                    return {"status": failed, "reason": f"does not compute {spec.name}: {why}"}
            prepare, run = self._work(impl, spec, mode, copies, upstream, restore)
            if run is None:
                return {"status": "skip", "reason": prepare}
            notes = []
            m = None
            if use_graph:
                try:
                    m = self._measure_graph(impl, copies, restore)
                except Exception as e:
                    notes.append(f"CUDA-graph capture failed ({_error(e)}): timed with events, "
                                 f"so launch gaps count")
            if m is None:
                m = measure(run, prepare=prepare, clock=self.clock, rule=self.rule,
                            flush=self.flush(), lead=self.lead(), wall=self.wall)
            m.notes += notes
            peak = self._peak_memory(prepare, run)
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            return {"status": failed, "reason": f"out of memory: {_error(e)}"}
        except Exception as e:
            return {"status": failed, "reason": f"raised {_error(e)}"}
        return self._latency_fields(m, peak, len(copies))

    def _restorer(self, copies: list[dict], pristine: dict):
        def restore(k: int) -> None:
            for name, v in copies[k % len(copies)].items():
                if isinstance(v, torch.Tensor):
                    v.copy_(pristine[name])
        return restore

    def _work(self, impl: Implementation, spec: OpSpec, mode: str, copies: list[dict],
              upstream: list[torch.Tensor], restore):
        """(prepare, run) for measure(); (reason, None) when the mode cannot run."""
        fn, n = impl.fn, len(copies)
        if mode == "fwd":
            def run_fwd(k):
                with torch.no_grad():
                    return fn(**copies[k % n])
            return (restore, run_fwd)
        leaves = [_leaves(c, spec.grad_inputs) for c in copies]
        if not leaves[0][1]:
            return (f"{spec.name} has no differentiable input among {spec.grad_inputs}", None)
        state: dict = {}

        def forward(k):
            inputs, names = leaves[k % n]
            outs = [o for o in _float_outputs(fn(**inputs))]
            pairs = [(o, g) for o, g in zip(outs, state["grads"]) if o.requires_grad]
            if not pairs:
                raise RuntimeError("no output of the forward requires grad")
            state["outs"] = [o for o, _ in pairs]
            state["grads"] = [g for _, g in pairs]
            state["wrt"] = [inputs[m] for m in names]

        def backward():
            torch.autograd.grad(state["outs"], state["wrt"], state["grads"], allow_unused=True)

        if mode == "bwd":
            def prepare_bwd(k):
                if restore:
                    restore(k)
                state["grads"] = [u.clone() for u in upstream]
                forward(k)
            return (prepare_bwd, lambda k: backward())

        def prepare_both(k):
            if restore:
                restore(k)
            state["grads"] = [u.clone() for u in upstream]

        def run_both(k):
            forward(k)
            backward()
        return (prepare_both, run_both)

    def _measure_graph(self, impl: Implementation, copies: list[dict], restore) -> Measurement:
        calls = self.settings.graph_calls
        n = len(copies)
        with torch.no_grad():
            graph, _outs = capture_graph(
                [lambda c=copies[j % n]: impl.fn(**c) for j in range(calls)], self.device)
        prepare = (lambda k: [restore(j) for j in range(n)]) if restore else None
        m = measure(lambda k: graph.replay(), prepare=prepare, clock=self.clock, rule=self.rule,
                    flush=self.flush(), lead=self.lead(), wall=self.wall, calls_per_sample=calls,
                    method="cuda-graph")
        return m

    def _peak_memory(self, prepare, run) -> int | None:
        if self.device.type != "cuda":
            return None
        if prepare is not None:
            prepare(0)
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        run(0)
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - base)

    def _latency_fields(self, m: Measurement, peak: int | None, n_copies: int) -> dict:
        s = m.summary
        us = 1e6
        return {
            "status": "ok", "reason": "",
            "median_us": s.median * us, "p20_us": s.p20 * us, "p80_us": s.p80 * us,
            "mean_us": s.mean * us, "std_us": s.std * us, "min_us": s.min * us,
            "spread": s.spread, "rse": s.rse_median, "n_samples": s.n, "stop": m.stop,
            "samples_us": [round(x * us, 4) for x in m.samples],
            "timing": {"method": m.method, "warmup_calls": m.warmup_calls,
                       "calls_per_sample": m.calls_per_sample, "input_copies": n_copies,
                       "l2_flush_bytes": self._flush.nbytes if self._flush else 0,
                       "host_us": m.host_s * us, "lead_us": m.lead_s * us,
                       "rule": {"target_rse": self.rule.target_rse, "min": self.rule.min_samples,
                                "max": self.rule.max_samples, "cap_s": self.rule.time_cap_s},
                       "notes": m.notes},
            "peak_memory_bytes": peak,
            "peak_memory_note": ("bytes allocated at peak by the timed work, beyond its inputs"
                                 if peak is not None else "CPU: no allocator statistics"),
        }

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
