"""`speedlight profile` on a CUDA GPU: kernel times joined to their ops, idle time between
kernels, distances to the floor, the allocator's peak, FLOPs against flop_counter."""

import json
from collections import Counter

import pytest
import torch
from torch.utils import flop_counter

from speedlight import cli, hardware
from speedlight.workloads import models
from speedlight.profile.capture import OpRecorder
from tests.conftest import needs_gpu
from tests.profile.conftest import QUICK

pytestmark = needs_gpu("kernel times, GPU idle gaps and the allocator exist only on a CUDA device")


@pytest.fixture(scope="module")
def cuda_doc(tmp_path_factory):
    if hardware.current_device_spec() is None:
        pytest.skip(f"no DeviceSpec for {torch.cuda.get_device_name()}: distances need one")
    out = tmp_path_factory.mktemp("gpu")
    assert cli.main(["profile", "--train", *QUICK, "--out", str(out), "--no-html"]) == 0
    return json.loads((out / "profile-llama-tiny-train.json").read_text())


def test_kernel_times_are_joined_to_their_ops(cuda_doc):
    assert cuda_doc["measured"]["time"] == "cuda" and cuda_doc["target"]["measured_here"]
    rows = [r for r in cuda_doc["rows"] if r["kernels"]]
    assert rows, "no op was joined to a kernel"
    for r in rows:
        assert r["time_s"] == pytest.approx(sum(k["time_s"] for k in r["kernels"]))
    phases = {r["phase"] for r in rows}
    assert {"forward", "backward", "optimizer"} <= phases
    mm = [r for r in rows if r["name"] == "mm"]
    assert mm and all(r["distance"] is not None and r["distance"] > 0 for r in mm)
    assert not any(r["kernels"] for r in cuda_doc["rows"] if r["formula"] == "view")


def test_idle_time_and_memory(cuda_doc):
    s = cuda_doc["summary"]
    assert s["gpu"]["kernels"] > 0 and 0 <= s["gpu"]["idle_s"] <= s["gpu"]["span_s"]
    assert s["speed_of_light"] is not None and 0 < s["speed_of_light"] < 1
    m = cuda_doc["memory"]
    assert m["allocator_peak_bytes"] >= m["parameters_bytes"] + m["optimizer_state_bytes"]


def test_flops_match_flop_counter_on_cuda():
    w = models.build(None, batch=2, seq=64, train=True, dtype=torch.bfloat16, device=torch.device("cuda"))
    step = lambda: w.loss_fn(w.call()).backward()  # noqa: E731
    rec = OpRecorder({}, {}, memory=None, timed=False)
    with rec:
        step()
    ours, causal = Counter(), set()
    for r in rec.ops:
        if r.cost is not None and r.cost.flops:
            ours[r.name] += r.cost.flops
            if "causal" in r.cost.detail:
                causal.add(r.name)
    mode = flop_counter.FlopCounterMode(display=False)
    with mode:
        step()
    theirs = {k.__name__: v for k, v in mode.get_flop_counts()["Global"].items()}
    assert "mm" in theirs and any("attention" in k for k in theirs)
    for name, n in theirs.items():  # flop_counter counts causal attention in full
        assert ours[name] == (n // 2 if name in causal else n), name
