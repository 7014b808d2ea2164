"""The parts of the profile only a GPU run reaches (distances, idle time, measured roofline),
fed a capture whose kernel times are given, since this machine has no GPU."""

import torch
from rich.console import Console
from torch import nn

from speedlight import hardware
from speedlight.profile import advice, analyze, display, html, roofline, schema
from speedlight.target import Target
from tests.profile.util import profile_model

KERNEL_S = 20e-6


def gpu_capture():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.SiLU(), nn.Linear(256, 64))
    cap, _, _ = profile_model(model, torch.randn(128, 64))
    cap.device = "cuda"
    for r in cap.ops:  # as if each kernel-launching op ran one 20 µs kernel
        launches = r.cost is not None and r.cost.kernel
        r.kernels = [("k", KERNEL_S)] if launches else []
        r.times = [KERNEL_S] if launches else [0.0]
    cap.gpu = {"kernels": 10, "busy_s": 1e-3, "span_s": 1.5e-3, "idle_s": 5e-4}
    cap.step_times = [2e-3]
    return cap


def test_distances_idle_and_speed_of_light():
    spec = hardware.DEVICES["h200"]
    target = Target(spec, 90, hardware.roof_for(spec), in_use=True, origin="the GPU in use")
    cap = gpu_capture()
    res = analyze.analyze(cap, target)
    kernels = [r for r in res["rows"] if r["launches_kernel"]]
    assert all(r["distance"] == KERNEL_S / r["floor_s"] for r in kernels if r["floor_s"])
    assert all(r["bound"] != "launch" for r in kernels), "20 µs kernels are not launch-bound"
    s = res["summary"]
    assert s["speed_of_light"] == s["floor_s"] / 2e-3
    assert s["launch"]["measured_idle_s"] == 5e-4 and s["time_by_bound_s"]["idle"] == 5e-4
    mm = next(g for g in res["by_type"] if g["key"] == "aten.addmm.default")
    assert mm["distance"] == mm["time_s"] / mm["floor_s"]

    doc = schema.document(environment={"device": "NVIDIA H200", "runtime": "cuda", "torch": "x",
                                       "timestamp": "t", "git": "g"},
                          run={"id": "r", "model": "mlp", "mode": "train", "batch": 128, "seq": 1,
                               "dtype": "fp32", "device": "cuda"},
                          model={"parameters": 1, "source": "test"},
                          target=dict(target.to_json(), launch_s=roofline.LAUNCH_S),
                          measured={"time": "cuda", "floors": "on the measured GPU",
                                    "note": roofline.note(target, torch.device("cuda"))},
                          analysis=res, memory=cap.memory,
                          advice=advice.advise(res["rows"], cap.calls, target.roof), notes=[])
    assert schema.check(doc) == []
    console = Console(width=200, record=True)
    display.print_profile(doc, console)
    text = console.export_text()
    assert "vs floor" in text and "GPU idle between kernels" in text and "speed of light" in text
    page = html.render_page(doc)
    assert "FLOP/s reached (measured)" in page and "GPU idle between kernels" in page
