"""Timing one piece of work the way the numbers stay honest.

Each sample is: untimed set-up (`prepare`: a fresh forward for a backward timing, inputs
restored for an implementation that writes into them), the L2 flush (a write of a buffer
larger than twice the L2, so no input is served from cache), a short spin that keeps the
GPU ahead of the host (so the host's Python and launch overhead is not what gets
measured), then the timed work between two clock marks. The work is warmed up first (the
first call compiles and autotunes), and samples are taken in batches until the median's
relative standard error is below a target, a sample limit is reached, or a time cap is
spent.

The clock is injected: CUDA events on a GPU, perf_counter on the CPU, and a fake clock in
the tests, which drive the plumbing, statistics and stopping rule without any device.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from speedlight.bench.stats import Summary, median_rse, summarize

FLOOR_SAMPLES = 3  # the time cap never stops a measurement with fewer samples than this
MAX_LEAD_S = 2e-3


class Clock(Protocol):
    """Marks points in a stream of work and says how far apart two marks are."""

    method: str

    def record(self) -> Any: ...

    def elapsed(self, start: Any, end: Any) -> float:  # seconds
        ...

    def sync(self) -> None: ...


class HostClock:
    """perf_counter: for CPU work, which runs synchronously (the Triton interpreter)."""

    method = "perf_counter"

    def record(self) -> float:
        return time.perf_counter()

    def elapsed(self, start: float, end: float) -> float:
        return end - start

    def sync(self) -> None:
        pass


class CudaEventClock:
    """CUDA events on the current stream: device time between the two marks."""

    method = "cuda-events"

    def __init__(self, device: torch.device):
        self.device = device

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


def clock_for(device: torch.device) -> Clock:
    return CudaEventClock(device) if device.type == "cuda" else HostClock()


@dataclass(frozen=True)
class StopRule:
    """When a measurement has enough samples."""

    target_rse: float = 0.01  # stop once the median's relative standard error is below this
    min_samples: int = 10
    max_samples: int = 500
    time_cap_s: float = 1.0  # wall time for the samples of one measurement
    warmup_calls: int = 3  # at least this many untimed calls (the first compiles) ...
    warmup_s: float = 0.025  # ... and at least this long after the first


GPU_RULE = StopRule()
# The interpreter takes milliseconds per program: fewer, looser samples (not representative).
CPU_RULE = StopRule(target_rse=0.05, min_samples=3, max_samples=15, time_cap_s=0.25,
                    warmup_calls=1, warmup_s=0.0)


def default_rule(device: torch.device) -> StopRule:
    return GPU_RULE if device.type == "cuda" else CPU_RULE


@dataclass
class Measurement:
    samples: list[float]  # seconds per call
    stop: str  # converged | max samples | time cap
    method: str  # cuda-events | cuda-graph | perf_counter | fake
    warmup_calls: int
    calls_per_sample: int = 1  # > 1 in CUDA-graph mode: one replay runs this many calls
    host_s: float = 0.0  # median host time to enqueue one call (from the warm-up)
    lead_s: float = 0.0  # GPU spin before each sample, to stay ahead of the host
    notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> Summary:
        return summarize(self.samples)


def measure(run: Callable[[int], Any], *, clock: Clock, rule: StopRule,
            prepare: Callable[[int], Any] | None = None, flush: Callable[[], Any] | None = None,
            lead: Callable[[float], Any] | None = None, wall: Callable[[], float] = time.perf_counter,
            calls_per_sample: int = 1, method: str | None = None) -> Measurement:
    """Time `run(k)` (k counts calls; implementations use it to rotate input copies).

    Per call: prepare(k) (untimed), flush() (untimed), lead(seconds) (untimed), then
    run(k) between two clock marks. Each sample is the marked time / calls_per_sample.
    """
    k = 0
    # warm-up: the first call compiles; the host time of later calls sizes the lead spin
    host: list[float] = []
    per_call: list[float] = []  # wall time of a whole call, set-up and sync included
    warm_start = None
    calls = 0
    while calls < max(rule.warmup_calls, 1) or wall() - warm_start < rule.warmup_s:
        t0 = wall()
        if prepare is not None:
            prepare(k)
        h0 = wall()
        run(k)
        host.append(wall() - h0)
        clock.sync()
        per_call.append(wall() - t0)
        k += 1
        calls += 1
        if warm_start is None:
            warm_start = wall()
    host_s = statistics.median(host[1:]) if len(host) > 1 else host[0]
    lead_s = min(1.5 * host_s, MAX_LEAD_S) if lead is not None else 0.0

    samples: list[float] = []
    start = wall()
    # the first batch: min_samples, or fewer when the warm-up says they overrun the cap
    est = statistics.median(per_call[1:]) if len(per_call) > 1 else per_call[0]
    want = max(1, min(rule.min_samples, rule.max_samples))
    if est > 0:
        want = min(want, max(FLOOR_SAMPLES, math.ceil(rule.time_cap_s / est)))
    while True:
        marks = []
        for _ in range(want):
            if prepare is not None:
                prepare(k)
            if flush is not None:
                flush()
            if lead is not None and lead_s > 0:
                lead(lead_s)
            a = clock.record()
            run(k)
            b = clock.record()
            marks.append((a, b))
            k += 1
        clock.sync()
        samples += [clock.elapsed(a, b) / calls_per_sample for a, b in marks]
        n, spent = len(samples), wall() - start
        if n >= rule.max_samples:
            stop = "max samples"
        elif n >= rule.min_samples and median_rse(samples) <= rule.target_rse:
            stop = "converged"
        elif spent >= rule.time_cap_s and n >= FLOOR_SAMPLES:
            stop = "time cap"
        else:
            want = _next_batch(n, spent, rule)
            continue
        return Measurement(samples, stop, method or clock.method, calls, calls_per_sample,
                           host_s, lead_s)


def _next_batch(n: int, spent: float, rule: StopRule) -> int:
    """Grow by half the samples so far, within the samples left and the time left."""
    want = max(rule.min_samples, n // 2, 1)
    want = min(want, rule.max_samples - n)
    per = spent / n if n else 0.0
    if per > 0:
        left = rule.time_cap_s - spent
        want = min(want, max(1, math.ceil(left / per)))
    return max(want, FLOOR_SAMPLES - n, 1)


# --- what happens between samples ------------------------------------------------------------

class L2Flush:
    """Writes a buffer of `nbytes` (more than twice the L2) to evict everything cached."""

    def __init__(self, nbytes: int, device: torch.device):
        self.nbytes = int(nbytes)
        self.buffer = torch.empty(self.nbytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def l2_bytes(device: torch.device) -> int:
    """The L2 size torch reports for a GPU; on CPU a nominal 2 MiB (the timings there are
    not representative; the flush keeps the code path the same)."""
    if device.type != "cuda":
        return 2 * 2 ** 20
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 64 * 2 ** 20)


def flush_for(device: torch.device) -> L2Flush:
    return L2Flush(int(2.5 * l2_bytes(device)), device)


class GpuLead:
    """A spin kernel (torch.cuda._sleep) that keeps the GPU busy while the host enqueues
    the timed work, so the start mark is not reached before the work is launched."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cycles_per_s = _sleep_rate(device.index if device.index is not None
                                        else torch.cuda.current_device())

    def __call__(self, seconds: float) -> None:
        torch.cuda._sleep(max(1, int(seconds * self.cycles_per_s)))


@functools.lru_cache(maxsize=None)
def _sleep_rate(index: int) -> float:
    """Spin cycles per second, measured once per device with events."""
    with torch.cuda.device(index):
        torch.cuda._sleep(1000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        return cycles / (a.elapsed_time(b) / 1e3)


# --- CUDA-graph mode ---------------------------------------------------------------------------

def capture_graph(calls: Sequence[Callable[[], Any]], device: torch.device):
    """One CUDA graph running `calls` back to back (each on its own input copy).

    Tiny shapes take a few microseconds of GPU time, less than the host needs to launch
    them: replaying a captured graph removes the host from the measurement, as in a model
    run under CUDA graphs. Returns (graph, outputs); the outputs live in the graph's pool.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # torch asks for a warm-up on a side stream before capture
        for c in calls:
            c()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [c() for c in calls]
    return graph, outs
