import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight.ops import softmax as op
from speedlight.spec import Case
from tests.conftest import gpu_target
from tests.helpers import assert_rejected, assert_verified, seeded

SPEC = op.SPEC


@pytest.mark.parametrize("cols", [100, 20011, 50021])
def test_rows_sum_to_one_and_shift_invariance(cols, device):
    x = seeded((3, cols), device=device, scale=3.0)
    y = speedlight.softmax(x)
    torch.testing.assert_close(y.sum(-1), torch.ones(3, device=device), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(speedlight.softmax(x + 1000.0), y, rtol=1e-4, atol=1e-7)


def test_all_minus_inf_row_is_nan_like_torch(device):
    x = torch.full((2, 40), float("-inf"), device=device)
    x[1, 3] = 0.0
    ours, ref = speedlight.softmax(x), torch.softmax(x, -1)
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    torch.testing.assert_close(ours[1], ref[1])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_any_dim_of_3d(dim, device):
    x = seeded((4, 5, 33), device=device).requires_grad_()
    g = seeded((4, 5, 33), device=device, seed=1)
    y = speedlight.softmax(x, dim)
    (gx,) = torch.autograd.grad(y, x, g)
    y_ref = torch.softmax(x, dim)
    (gx_ref,) = torch.autograd.grad(y_ref, x, g)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, gx_ref)


def test_module_matches_torch(device):
    for dim in (None, 1, -1):
        ref, ours = torch.nn.Softmax(dim), snn.Softmax(dim)
        assert ours.state_dict().keys() == ref.state_dict().keys()
        x = seeded((2, 3, 17), device=device)
        torch.testing.assert_close(ours(x), ref(x))
        assert isinstance(ours, torch.nn.Softmax)


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.softmax(torch.ones(3, 4, dtype=torch.int32, device=d)), TypeError,
     "x must be a float32, float16 or bfloat16 tensor"),
    (lambda d: speedlight.softmax(torch.ones(3, 4, device=d), dim=2), ValueError,
     r"dim must be in \[-2, 1\]"),
    (lambda d: speedlight.softmax(torch.ones(3, 4, device=d), dim=1.0), TypeError, "dim must be an int"),
    (lambda d: speedlight.softmax(torch.tensor(1.0, device=d)), ValueError, "at least 1 dim"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    assert_rejected(lambda: call(device), error, match)


@pytest.mark.parametrize("sms,rows,cols", [
    pytest.param(132, 37, 128, id="132-sms-fused"),
    pytest.param(132, 3, 40000, id="132-sms-split"),  # 3 rows cannot fill 132 SMs
    pytest.param(1, 3, 40000, id="1-sm-looped"),
])
def test_gpu_sized_launches_match_float64(sms, rows, cols, device):
    """The block sizes and split plans a GPU gets (launch.for_target), verified under the
    interpreter."""
    from speedlight.launch import for_target

    with for_target(gpu_target(sms)):
        assert_verified(SPEC, Case("softmax", {"rows": rows, "cols": cols}, dtype=torch.bfloat16),
                        device)
