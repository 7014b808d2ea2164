import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight.ops import softmax as op
from speedlight.spec import Case
from speedlight.verify.harness import LaunchCounter
from tests.conftest import needs_gpu
from tests.helpers import DTYPES, case_maker, assert_verified, seeded

SPEC = op.SPEC


case = case_maker("softmax", "rows", "cols")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols,layout", [
    pytest.param(1, 1, "contiguous", id="rows1-cols1"),
    pytest.param(17, 509, "contiguous", id="rows17-cols509"),
    pytest.param(8, 1823, "strided", id="rows8-cols1823-strided"),
    pytest.param(6, 1000, "transposed", id="rows6-cols1000-transposed"),
    pytest.param(3, 20011, "strided", id="rows3-cols20011-looped"),
    pytest.param(1, 50021, "contiguous", id="rows1-cols50021-split"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_and_backward_match_float64(rows, cols, layout, dtype, seed, device):
    assert_verified(SPEC, case(rows, cols, dtype, layout, seed), device)


def test_nonfinite_positions_match(device):
    assert_verified(SPEC, case(7, 300, nonfinite=True), device)


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


def test_empty_input_launches_nothing(device):
    x = torch.empty(0, 32, device=device, requires_grad=True)
    counter = LaunchCounter()
    with counter.active():
        y = speedlight.softmax(x)
        y.sum().backward()
    assert y.shape == (0, 32) and counter.count == 0


def test_module_matches_torch(device):
    for dim in (None, 1, -1):
        ref, ours = torch.nn.Softmax(dim), snn.Softmax(dim)
        assert ours.state_dict().keys() == ref.state_dict().keys()
        x = seeded((2, 3, 17), device=device)
        torch.testing.assert_close(ours(x), ref(x))
        assert isinstance(ours, torch.nn.Softmax)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend, device):
    torch._dynamo.reset()

    def scores(q, k):
        return speedlight.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1)

    compiled = torch.compile(scores, fullgraph=True, backend=backend)
    q = seeded((2, 8, 16), device=device).requires_grad_()
    k = seeded((2, 8, 16), device=device, seed=1)
    y = compiled(q, k)
    (gq,) = torch.autograd.grad(y.pow(2).sum(), (q,))
    y_ref = scores(q, k)
    (gq_ref,) = torch.autograd.grad(y_ref.pow(2).sum(), (q,))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gq, gq_ref)


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.softmax(torch.ones(3, 4, dtype=torch.int32, device=d)), TypeError,
     "x must be a float32, float16 or bfloat16 tensor"),
    (lambda d: speedlight.softmax(torch.ones(3, 4, device=d), dim=2), ValueError,
     r"dim must be in \[-2, 1\]"),
    (lambda d: speedlight.softmax(torch.ones(3, 4, device=d), dim=1.0), TypeError, "dim must be an int"),
    (lambda d: speedlight.softmax(torch.tensor(1.0, device=d)), ValueError, "at least 1 dim"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call(device)
    assert counter.count == 0


@needs_gpu("rows x stride > 2^31 needs > 4 GiB per tensor and hours under the CPU interpreter")
def test_64bit_indexing(device):
    rows, cols = 65537, 32771
    x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
    y = speedlight.softmax(x)
    tail = slice(rows - 3, rows)
    torch.testing.assert_close(y[tail].float(), torch.softmax(x[tail].float(), -1),
                               rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("sms,rows,cols", [
    pytest.param(132, 37, 128, id="132-sms-fused"),
    pytest.param(132, 3, 40000, id="132-sms-split"),  # 3 rows cannot fill 132 SMs
    pytest.param(1, 3, 40000, id="1-sm-looped"),
])
def test_gpu_sized_launches_match_float64(sms, rows, cols, device):
    """The block sizes and split plans a GPU gets (launch.sized_for), verified under the
    interpreter."""
    from speedlight.launch import sized_for

    with sized_for(sms):
        assert_verified(SPEC, Case("softmax", {"rows": rows, "cols": cols}, dtype=torch.bfloat16),
                        device)
