"""The harness is itself tested: every deliberately wrong kernel must fail verify, while
the real kernel passes the same cases."""

import pytest
import torch

from speedlight.ops import rms_norm as op
from speedlight.spec import Case
from speedlight.verify import verify_case
from tests.verify.broken_kernels import broken_specs

BROKEN = broken_specs()
BROKEN.insert(3, ("fp16 accumulator (fp32 input)", BROKEN[2][1], BROKEN[2][2]))


def rms_case(rows, hidden, dtype, seed=0):
    return Case("rms_norm", {"rows": rows, "hidden": hidden}, dtype=dtype, seed=seed)


CASES = {
    "missed last column": rms_case(5, 781, torch.float32),
    "unwritten row": rms_case(6, 256, torch.bfloat16),
    # fp16 running sums overflow past 65504: a long fp16 row is where the bug bites
    "fp16 accumulator": rms_case(2, 70001, torch.float16),
    "fp16 accumulator (fp32 input)": rms_case(3, 1000, torch.float32),
    "wrong eps": rms_case(4, 1000, torch.float32),
    "lost dw partial": rms_case(64, 128, torch.float32),
}


@pytest.mark.parametrize("name,spec,phrase", BROKEN, ids=[b[0] for b in BROKEN])
def test_verify_fails_broken_kernel(name, spec, phrase, device):
    result = verify_case(spec, CASES[name], device)
    assert result.status == "fail", f"{name} passed verify: {result.checks}"
    assert phrase in result.reason, result.reason


@pytest.mark.parametrize("name", list(CASES))
def test_real_kernel_passes_the_same_case(name, device):
    result = verify_case(op.SPEC, CASES[name], device)
    assert result.status == "pass", result.reason


def test_unwritten_row_is_caught_because_outputs_are_poisoned(device):
    from tests.verify.broken_kernels import _launcher
    from speedlight.verify import poisoned_allocations
    x = torch.randn(6, 32, device=device)
    w = torch.ones(32, device=device)
    with poisoned_allocations():
        y = _launcher(short_grid=True)(x, w)
    assert torch.isnan(y[-1]).all() and not torch.isnan(y[:-1]).any()
