"""The timer's plumbing and stopping rule, driven by a fake clock: no device, no sleeping."""

import pytest

from speedlight.bench.stats import median_rse
from speedlight.bench.timer import FLOOR_SAMPLES, MAX_LEAD_S, StopRule, measure


class FakeClock:
    """A clock whose time moves only when the work under test says so."""

    method = "fake"

    def __init__(self):
        self.now = 0.0
        self.log: list[str] = []

    def record(self):
        self.log.append("mark")
        return self.now

    def elapsed(self, start, end):
        return end - start

    def sync(self):
        pass

    def advance(self, seconds):
        self.now += seconds


def _work(clock, durations):
    """run(k) takes durations(k) seconds of fake time."""
    calls = []

    def run(k):
        calls.append(k)
        clock.log.append(f"run{k}")
        clock.advance(durations(k))
    return run, calls


RULE = StopRule(target_rse=0.01, min_samples=10, max_samples=100, time_cap_s=10.0,
                warmup_calls=3, warmup_s=0.0)


def test_only_the_run_is_timed_not_prepare_flush_or_lead():
    clock = FakeClock()
    run, _ = _work(clock, lambda k: 1e-3 * (1 + k % 2))

    def prepare(k):
        clock.log.append(f"prepare{k}")
        clock.advance(5.0)

    def flush():
        clock.log.append("flush")
        clock.advance(7.0)

    leads = []

    def lead(seconds):
        leads.append(seconds)
        clock.log.append("lead")
        clock.advance(11.0)

    m = measure(run, prepare=prepare, flush=flush, lead=lead, clock=clock, rule=RULE,
                wall=lambda: clock.now)
    # every sample is exactly its run's duration: 1 ms on even calls, 2 ms on odd ones
    first = m.warmup_calls
    assert m.samples == [pytest.approx(1e-3 * (1 + k % 2)) for k in range(first, first + len(m.samples))]
    # per timed sample: prepare, flush, lead, then the marks around the run, in that order
    k = first
    i = clock.log.index(f"prepare{k}")
    assert clock.log[i:i + 6] == [f"prepare{k}", "flush", "lead", "mark", f"run{k}", "mark"]
    # the warm-up is prepared but neither flushed nor marked
    assert clock.log[:2] == ["prepare0", "run0"]
    # the lead spin is 1.5x the host time of a warm call (median of 2 ms, 1 ms), capped
    assert leads and all(x == pytest.approx(min(1.5 * 1.5e-3, MAX_LEAD_S)) for x in leads)


def test_warmup_calls_are_excluded_and_rotation_index_keeps_counting():
    clock = FakeClock()
    # the first call "compiles": 1 s; the rest take 1 ms
    run, calls = _work(clock, lambda k: 1.0 if k == 0 else 1e-3)
    m = measure(run, clock=clock, rule=RULE, wall=lambda: clock.now)
    assert m.warmup_calls == 3
    assert max(m.samples) == pytest.approx(1e-3), "the compiling call leaked into the samples"
    assert calls == list(range(len(calls))), "k must count every call, so copies rotate"
    assert len(calls) == m.warmup_calls + len(m.samples)


def test_identical_samples_converge_at_min_samples():
    clock = FakeClock()
    run, _ = _work(clock, lambda k: 2e-3)
    m = measure(run, clock=clock, rule=RULE, wall=lambda: clock.now)
    assert m.stop == "converged" and len(m.samples) == RULE.min_samples
    assert m.summary.median == pytest.approx(2e-3) and m.summary.rse_median < 1e-9


def test_noisy_samples_sample_more_until_the_error_is_small():
    clock = FakeClock()
    # a repeating pattern with 20% spread: converges only once n is large enough
    pattern = [1.0, 1.2, 0.9, 1.1, 0.8, 1.05, 0.95, 1.15, 0.85, 1.0, 1.1]
    run, _ = _work(clock, lambda k: 1e-3 * pattern[k % len(pattern)])
    rule = StopRule(target_rse=0.02, min_samples=5, max_samples=10_000, time_cap_s=1e9,
                    warmup_calls=1, warmup_s=0.0)
    m = measure(run, clock=clock, rule=rule, wall=lambda: clock.now)
    assert m.stop == "converged"
    assert len(m.samples) > rule.min_samples
    assert median_rse(m.samples) <= rule.target_rse
    assert median_rse(m.samples[: len(m.samples) // 3]) > rule.target_rse


def test_time_cap_stops_a_slow_noisy_measurement():
    clock = FakeClock()
    run, _ = _work(clock, lambda k: 0.1 * (1 + (k * 7919) % 13))  # 0.1 .. 1.3 s, never stable
    rule = StopRule(target_rse=1e-6, min_samples=10, max_samples=1000, time_cap_s=5.0,
                    warmup_calls=1, warmup_s=0.0)
    m = measure(run, clock=clock, rule=rule, wall=lambda: clock.now)
    assert m.stop == "time cap"
    assert FLOOR_SAMPLES <= len(m.samples) < 1000
    # batches are sized from the time left: the cap is overshot by at most a batch of
    # estimated length, not by min_samples calls of the slowest kind
    assert sum(m.samples) < 2 * rule.time_cap_s + 1.3


def test_time_cap_never_leaves_fewer_than_the_floor():
    clock = FakeClock()
    run, _ = _work(clock, lambda k: 10.0 + k)  # each call is longer than the whole cap
    rule = StopRule(target_rse=1e-9, min_samples=10, max_samples=100, time_cap_s=1.0,
                    warmup_calls=1, warmup_s=0.0)
    m = measure(run, clock=clock, rule=rule, wall=lambda: clock.now)
    assert m.stop == "time cap" and len(m.samples) == FLOOR_SAMPLES


def test_max_samples_bounds_an_unstable_fast_measurement():
    clock = FakeClock()
    run, _ = _work(clock, lambda k: 1e-6 * (1 + (k * 31) % 17))
    rule = StopRule(target_rse=1e-9, min_samples=10, max_samples=64, time_cap_s=1e9,
                    warmup_calls=2, warmup_s=0.0)
    m = measure(run, clock=clock, rule=rule, wall=lambda: clock.now)
    assert m.stop == "max samples" and len(m.samples) == 64


def test_warmup_runs_for_at_least_warmup_s():
    clock = FakeClock()
    run, _ = _work(clock, lambda k: 1e-3)
    rule = StopRule(min_samples=3, warmup_calls=2, warmup_s=0.05)
    m = measure(run, clock=clock, rule=rule, wall=lambda: clock.now)
    assert m.warmup_calls >= 50  # 50 ms of 1 ms calls after the first


def test_calls_per_sample_divides_each_mark():
    clock = FakeClock()
    run, _ = _work(clock, lambda k: 20e-6)  # one "graph replay" of 20 calls of 1 us
    m = measure(run, clock=clock, rule=RULE, wall=lambda: clock.now, calls_per_sample=20,
                method="cuda-graph")
    assert m.method == "cuda-graph" and m.calls_per_sample == 20
    assert m.summary.median == pytest.approx(1e-6)
