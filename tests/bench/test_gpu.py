"""The CUDA side of the timer, the runner and probe: skipped without a GPU."""

import torch

from speedlight.bench.timer import (CudaEventClock, GpuLead, StopRule, capture_graph, flush_for,
                                    l2_bytes, measure)
from tests.conftest import needs_gpu

pytestmark = needs_gpu("CUDA events, graphs and probe need a GPU")
RULE = StopRule(target_rse=0.02, min_samples=10, max_samples=200, time_cap_s=0.5)


def _device():
    return torch.device("cuda", torch.cuda.current_device())


def test_events_time_a_matmul_plausibly():
    d = _device()
    a = torch.randn(2048, 2048, device=d, dtype=torch.float16)
    m = measure(lambda k: a @ a, clock=CudaEventClock(d), rule=RULE, lead=GpuLead(d))
    s = m.summary
    tflops = 2 * 2048 ** 3 / s.median / 1e12
    assert 1 < tflops < 5000 and s.rse_median < 0.1 and m.lead_s > 0


def test_flushing_l2_makes_a_cache_sized_read_slower():
    d = _device()
    x = torch.randn(l2_bytes(d) // 16, device=d)  # a quarter of L2 in fp32
    clock, flush = CudaEventClock(d), flush_for(d)
    hot = measure(lambda k: x.sum(), clock=clock, rule=RULE).summary.median
    cold = measure(lambda k: x.sum(), clock=clock, rule=RULE, flush=flush).summary.median
    assert cold > 1.1 * hot, (hot, cold)


def test_graph_replays_the_calls():
    d = _device()
    xs = [torch.randn(64, 64, device=d) for _ in range(3)]
    graph, outs = capture_graph([lambda x=x: x * 2 for x in xs], d)
    for x in xs:
        x.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    for x, o in zip(xs, outs):
        torch.testing.assert_close(o, x * 2)


def test_bench_rms_norm_rows_on_gpu():
    from speedlight.bench.baselines import Baselines
    from speedlight.bench.runner import Bench, Settings
    from speedlight.ops import rms_norm

    bench = Bench(_device(), Settings(rule=RULE), Baselines(("torch-eager", "liger")))
    case = rms_norm.SPEC.cases("quick")[2].with_(dtype=torch.bfloat16)
    rows = bench.case_rows(rms_norm.SPEC, case)
    ours = {r["mode"]: r for r in rows if r["implementation"] == "speedlight"}
    assert all(r["status"] == "ok" for r in ours.values()), [r["reason"] for r in ours.values()]
    assert ours["fwd"]["timing"]["method"] == "cuda-graph"
    assert ours["bwd"]["timing"]["method"] == "cuda-events"
    assert all(r["representative"] and isinstance(r["peak_memory_bytes"], int) for r in ours.values())
    for r in ours.values():
        assert r["sol_bug"] is None and 0 < r["sol_pct"] <= 100
        assert r["speedup"]["torch-eager"] is not None


def test_probe_measures_and_caches(tmp_path, monkeypatch):
    from speedlight import hardware
    from speedlight.bench import probe

    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    d = _device()
    ceilings, readings = probe.probe(d, copy_bytes=256 * 2 ** 20, matmul_n=2048,
                                     dtypes=("tf32", "bf16", "fp8"))
    assert ceilings.copy_bandwidth > 1e11
    assert ceilings.matmul_flops["bf16"] > ceilings.matmul_flops["tf32"] > 1e12
    hardware.save_ceilings(ceilings)
    assert hardware.load_ceilings(ceilings.device_name, ceilings.driver) == ceilings
    fp8 = next(r for r in readings if r.what == "fp8")
    assert fp8.value is not None or fp8.note
