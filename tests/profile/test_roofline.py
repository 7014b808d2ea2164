"""Floors, bounds and the target's ceilings; the GPU timeline arithmetic on a made-up trace."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from speedlight import hardware, target
from speedlight.profile import capture, roofline
from speedlight.workloads.costs import OpCost
from speedlight.target import Target, peak_key

H200 = hardware.roof_for(hardware.DEVICES["h200"])


def test_floor_is_the_larger_of_compute_and_memory():
    big_mm = OpCost(flops=2 * 8192**3, bytes=3 * 8192 * 8192 * 2, formula="matmul", detail="", tensor_core=True)
    key = peak_key("bf16", tensor_core=big_mm.tensor_core)
    assert key == "bf16"
    assert roofline.floor_seconds(big_mm, key, H200) == pytest.approx(2 * 8192**3 / 989.4e12)
    assert roofline.bound(big_mm, roofline.floor_seconds(big_mm, key, H200), key, H200) == "compute"
    copy = OpCost(flops=0, bytes=2 * 2**30, formula="copy", detail="")
    floor = roofline.floor_seconds(copy, "fp32", H200)
    assert floor == pytest.approx(2 * 2**30 / 4.8e12)
    assert roofline.bound(copy, floor, "fp32", H200) == "memory"


def test_elementwise_flops_run_on_cuda_cores_not_tensor_cores():
    add = OpCost(flops=10, bytes=12, formula="pointwise", detail="")
    assert peak_key("bf16", tensor_core=add.tensor_core) == "fp32"


def test_short_kernels_are_launch_bound_measured_or_projected():
    small = OpCost(flops=1000, bytes=12_000, formula="pointwise", detail="")
    floor = roofline.floor_seconds(small, "fp32", H200)
    assert floor < roofline.LAUNCH_S and roofline.bound(small, floor, "fp32", H200) == "launch"
    big = OpCost(flops=0, bytes=10**9, formula="copy", detail="")
    assert roofline.bound(big, 1.0, "fp32", H200, kernel_times=[2e-6, 3e-6]) == "launch"
    assert roofline.bound(big, 1.0, "fp32", H200, kernel_times=[2e-6, 3e-4]) == "memory"
    # three launches of 4 us each: 12 us of work under 15 us of fixed cost (a decode
    # step's norm backward): overhead-bound though no one kernel is under a launch
    assert roofline.bound(big, 1.0, "fp32", H200, kernel_times=[6e-6, 4e-6, 2e-6]) == "launch"
    assert roofline.launch_floor(3) == 3 * roofline.LAUNCH_S


def test_views_and_unknown_ops():
    view = OpCost(0, 0, "view", "", kernel=False)
    assert roofline.floor_seconds(view, "fp32", H200) == 0.0
    assert roofline.bound(view, 0.0, "fp32", H200) == "none"
    assert roofline.bound(None, 0.0, None, H200) == "unknown"


def _event(start, end, device=torch.autograd.DeviceType.CUDA):
    return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), device_type=device)


def test_gpu_timeline_busy_and_idle():
    # kernels (µs): [0, 10], [5, 12] overlap; gap to [20, 30]; a CPU event is ignored
    prof = SimpleNamespace(events=lambda: [_event(0, 10), _event(5, 12), _event(20, 30),
                                           _event(0, 100, torch.autograd.DeviceType.CPU)])
    t = capture._gpu_timeline(prof)
    assert t["kernels"] == 3
    assert t["busy_s"] == pytest.approx(22e-6) and t["span_s"] == pytest.approx(30e-6)
    assert t["idle_s"] == pytest.approx(8e-6)


def test_cuda_times_are_the_kernels_inside_each_op_range():
    child = SimpleNamespace(kernels=[SimpleNamespace(name="gemm", duration=40.0)], cpu_children=[])
    evt = SimpleNamespace(name=f"{capture.RANGE_PREFIX}0", cpu_time_total=9.0,
                          kernels=[SimpleNamespace(name="fill", duration=2.0)], cpu_children=[child])
    other = SimpleNamespace(name="aten::mm", cpu_time_total=50.0, kernels=[], cpu_children=[])
    rec = capture.OpRecord(0, "aten.mm.default", "mm", "forward", "", None, None, None, None,
                           [], [], "", [], None)
    capture._join_times(SimpleNamespace(events=lambda: [other, evt]), [rec], torch.device("cuda"))
    assert rec.times == [pytest.approx(42e-6)] and rec.host_times == [pytest.approx(9e-6)]
    assert rec.kernels == [("fill", pytest.approx(2e-6)), ("gemm", pytest.approx(40e-6))]


def test_cuda_kernels_correlated_to_the_enclosing_aten_op_are_found():
    evt = SimpleNamespace(name=f"{capture.RANGE_PREFIX}0", cpu_time_total=5.0, kernels=[], cpu_children=[])
    parent = SimpleNamespace(name="aten::mm", kernels=[SimpleNamespace(name="gemm", duration=30.0)],
                             cpu_children=[evt])
    evt.cpu_parent = parent
    rec = capture.OpRecord(0, "aten.mm.default", "mm", "forward", "", None, None, None, None,
                           [], [], "", [], None)
    capture._join_times(SimpleNamespace(events=lambda: [parent, evt]), [rec], torch.device("cuda"))
    assert rec.times == [pytest.approx(30e-6)] and rec.kernels == [("gemm", pytest.approx(30e-6))]


def test_a_gpu_without_a_roof_puts_its_floors_on_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    odd = dataclasses.replace(hardware.DEVICES["l4"], name="Some GPU", key="some-gpu",
                              peak_flops={}, dram_bandwidth=0.0)
    here = Target(odd, 89, None, in_use=True, origin="the GPU in use", roof_note="none")
    tgt, why = roofline.with_roof(here)
    assert tgt.sku.key == target.DEFAULT_SKU and tgt.roof is not None
    assert "Some GPU has no roof here" in why and "the default" in why
    h100 = target.resolve("h100")
    assert roofline.with_roof(h100) == (h100, None)
