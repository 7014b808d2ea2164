"""Times one implementation of one case in one mode and turns the measurement into the
latency fields of a bench row: checks a baseline computes the op, times it (as CUDA-graph
replays for tiny forwards, else with events or the wall clock), and reads its peak memory."""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable

import torch

from speedlight.bench.baselines import Contender, is_speedlight
from speedlight.bench.timer import (Clock, GpuLead, L2Flush, Measurement, StopRule, capture_graph,
                                    flush_for, measure)
from speedlight.bench.workload import restorer, work
from speedlight.spec import Case, OpSpec, as_outputs
# bench calls verify (to check a case before timing it) and judges outputs the same way
from speedlight.verify.compare import metrics as error_metrics


def _error(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno}" if tb else ""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:300]}{where}"


def output_mismatch(outs, refs, spec: OpSpec, dtype: torch.dtype) -> str | None:
    """Why a baseline's forward output is not the reference's, or None when it is (NaN/Inf
    positions equal, relative L2 difference under the dtype's ceiling)."""
    outs, refs = as_outputs(outs), as_outputs(refs)
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


class ImplTimer:
    """Times implementations on one device under one stop rule and clock."""

    def __init__(self, device: torch.device, rule: StopRule, clock: Clock, graph_calls: int,
                 wall: Callable[[], float] = time.perf_counter):
        self.device = device
        self.rule = rule
        self.clock = clock
        self.graph_calls = graph_calls
        self.wall = wall
        self._flush: L2Flush | None = None
        self._lead: GpuLead | None = None

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

    def time(self, impl: Contender, spec: OpSpec, case: Case, mode: str, copies: list[dict],
             pristine: dict | None, upstream: list[torch.Tensor], reference: Any,
             use_graph: bool) -> dict:
        failed = "error" if is_speedlight(impl.name) else "unavailable"
        restore = restorer(copies, pristine) if impl.mutates_inputs else None
        try:
            if impl.checked:
                with torch.no_grad():
                    why = output_mismatch(impl.fn(**copies[0]), reference, spec, case.dtype)
                if restore:
                    restore(0)
                if why:
                    return {"status": failed, "reason": f"does not compute {spec.name}: {why}"}
            prepare, run = work(impl, spec, mode, copies, upstream, restore)
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

    def _measure_graph(self, impl: Contender, copies: list[dict], restore) -> Measurement:
        calls = self.graph_calls
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
