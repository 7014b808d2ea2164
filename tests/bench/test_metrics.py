import pytest

from speedlight import hardware
from speedlight.bench import metrics
from speedlight.spec import Cost
from speedlight.target import resolve

H200 = hardware.roof_for(hardware.DEVICES["h200"])


def test_percent_of_sol_on_the_bandwidth_floor():
    cost = Cost(flops=10**6, bytes=4.8 * 10**9)  # 1 ms at 4.8 TB/s; FLOPs negligible
    out = metrics.speed_of_light(cost, 2e-3, H200, "fp32", "datasheet")
    assert out["sol_pct"] == pytest.approx(50.0)
    assert out["sol_bound"] == "memory" and out["sol_roof"] == "datasheet"
    assert out["sol_floor_us"] == pytest.approx(1000.0) and out["sol_bug"] is None


def test_percent_of_sol_takes_the_compute_floor_when_it_is_larger():
    cost = Cost(flops=int(989.4e12), bytes=1)  # 1 s of bf16 tensor-core work
    out = metrics.speed_of_light(cost, 1.25, H200, "bf16")
    assert out["sol_bound"] == "compute" and out["sol_pct"] == pytest.approx(80.0)


def test_above_100_percent_is_flagged_as_a_bug_not_reported():
    cost = Cost(flops=0, bytes=4.8 * 10**9)
    out = metrics.speed_of_light(cost, 0.5e-3, H200, "fp32")  # "faster than the roof"
    assert out["sol_pct"] is None
    assert out["sol_pct_raw"] == pytest.approx(200.0)
    assert "bug" in out["sol_bug"] and "not a result" in out["sol_bug"]


def test_no_roof_no_percent():
    out = metrics.speed_of_light(Cost(1, 1), 1e-3, None, "fp32", "no speed-of-light on the CPU")
    assert out["sol_pct"] is None and out["sol_bug"] is None and "CPU" in out["sol_note"]


def test_cpu_has_no_roof_and_another_gpu_lends_none():
    roof, note = metrics.device_roof(resolve(None, None, "cpu"))
    assert roof is None and "CPU" in note
    roof, note = metrics.device_roof(resolve("b200", None, "cpu"))
    assert roof is None and "not the device the times are measured on" in note


def test_throughput():
    t = metrics.throughput(Cost(flops=2 * 10**12, bytes=3 * 10**9), 1e-3)
    assert t["gbps"] == pytest.approx(3000.0) and t["tflops"] == pytest.approx(2000.0)


def _ours(**kw):
    base = {"status": "ok", "median_us": 10.0, "verified": True, "verify_note": "passed"}
    return dict(base, **kw)


def test_speedup_over_each_baseline():
    ups, why = metrics.speedups(_ours(), {"torch-eager": {"status": "ok", "median_us": 25.0},
                                          "liger": {"status": "ok", "median_us": 12.0}})
    assert ups == {"torch-eager": pytest.approx(2.5), "liger": pytest.approx(1.2)} and why == {}


def test_speedup_withheld_for_an_unverified_case():
    ups, why = metrics.speedups(_ours(verified=False, verify_note="grad_x: rel L2 error too big"),
                                {"torch-eager": {"status": "ok", "median_us": 25.0}})
    assert ups == {"torch-eager": None}
    assert "not verified" in why["torch-eager"] and "rel L2" in why["torch-eager"]


def test_speedup_withheld_when_the_baseline_did_not_run():
    ups, why = metrics.speedups(_ours(), {"liger": {"status": "unavailable",
                                                    "reason": "Liger-Kernel has no counterpart"}})
    assert ups == {"liger": None} and "no counterpart" in why["liger"]


def test_nvidia_smi_is_asked_about_the_gpu_torch_sees(monkeypatch):
    """A Ray worker given a node's GPU 5 sees it as cuda:0; nvidia-smi, which ignores
    CUDA_VISIBLE_DEVICES, must be asked about 5 (or the UUID given there)."""
    from speedlight.bench.metrics import smi_id

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert smi_id(0) == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert (smi_id(0), smi_id(1)) == ("5", "7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1b2c")
    assert smi_id(0) == "GPU-1b2c"
