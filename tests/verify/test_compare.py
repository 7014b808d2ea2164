import math

import pytest
import torch

from speedlight.spec import TOLERANCES
from speedlight.verify.compare import judge, metrics

F32, F16 = TOLERANCES[torch.float32], TOLERANCES[torch.float16]


def test_metrics_against_reference():
    ref = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    out = torch.tensor([1.0, -2.0, 4.5])
    m = metrics(out, ref)
    assert m.max_abs == pytest.approx(0.5)
    assert m.rel_l2 == pytest.approx(0.5 / math.sqrt(21))
    assert m.max_rel == pytest.approx(0.125)
    assert m.ref_scale == 4.0


def _ref_and_torch(n=1000, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g, dtype=torch.float64)
    return ref, ref.to(dtype)  # PyTorch's own error = one rounding


def test_exactly_rounded_output_passes():
    ref, theirs = _ref_and_torch()
    c = judge("y", theirs.clone(), ref, theirs, F16)
    assert c.passed and c.ratio <= 1.0  # PyTorch itself is the yardstick (or one rounding)


def test_error_above_k_times_pytorch_fails_and_lists_indices():
    ref, theirs = _ref_and_torch()
    out = theirs.clone()
    out[17] += 0.5
    c = judge("y", out, ref, theirs, F16)
    assert not c.passed and "max abs error" in c.reason
    assert c.mismatches == 1 and c.bad_indices == [[17]]


def test_nan_where_reference_is_finite_fails():
    ref, theirs = _ref_and_torch()
    out = theirs.clone()
    out[3] = float("nan")
    c = judge("y", out, ref, theirs, F16)
    assert not c.passed and "NaN/Inf position" in c.reason and c.bad_indices == [[3]]


def test_matching_nonfinite_positions_pass_and_sign_of_inf_matters():
    ref = torch.tensor([1.0, float("inf"), float("nan"), -2.0], dtype=torch.float64)
    theirs = ref.float()
    assert judge("y", theirs.clone(), ref, theirs, F32).passed
    flipped = theirs.clone()
    flipped[1] = float("-inf")
    assert not judge("y", flipped, ref, theirs, F32).passed


def test_shape_and_dtype_must_match():
    ref, theirs = _ref_and_torch(10)
    assert "shape" in judge("y", theirs[:9], ref, theirs, F16).reason
    assert "dtype" in judge("y", theirs.float(), ref, theirs, F16).reason
    assert "no output" in judge("y", None, ref, theirs, F16).reason


def test_ceiling_caps_a_lenient_yardstick():
    ref, _ = _ref_and_torch(1000, torch.float32)
    bad_torch = (ref * 1.01).float()  # PyTorch itself 1% off
    out = (ref * 1.02).float()        # within 4x of it, but far over fp32's ceiling
    c = judge("y", out, ref, bad_torch, F32)
    assert not c.passed and "ceiling" in c.reason


def test_ill_conditioned_case_raises_the_ceiling_to_float32s_error():
    ref, _ = _ref_and_torch(1000, torch.float32)
    torch32 = (ref * 1.01).float()
    out = (ref * 1.02).float()
    c = judge("y", out, ref, torch32, F32, torch_fp32=torch32)
    assert c.passed, c.reason


def test_empty_output_passes_when_shapes_match():
    ref = torch.empty(0, 5, dtype=torch.float64)
    assert judge("y", torch.empty(0, 5), ref, torch.empty(0, 5), F32).passed
