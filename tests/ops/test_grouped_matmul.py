"""What is particular to speedlight.grouped_matmul (tests/ops/test_contract.py runs its
quick suite in every dtype, torch.compile, empty and non-finite inputs; tests/ops/test_fuzz.py
every argument): 256 groups, the offsets' checks and what unchecked bad offsets do, empty
groups' weight gradients, rows past the last group, the gradient in w's own layout, both
operand paths, no host sync, and torch._grouped_mm's layout."""

import pytest
import torch

import speedlight
from speedlight.inspect.launches import capture_case
from speedlight.ops import grouped_matmul as op
from speedlight.verify.harness import poisoned_allocations
from tests.helpers import assert_rejected, assert_verified, case_maker, seeded

SPEC = op.SPEC
case = case_maker("grouped_matmul", "m", "n", "k", "groups")


def test_256_groups_forward_and_backward(device):
    """The most experts of the models speedlight knows (DeepSeek-V3's 256), most of them
    empty at 40 rows: one launch walks them all."""
    assert_verified(SPEC, case(40, 16, 16, 256, routing="skewed"), device)


@pytest.mark.parametrize("groups", [1, 2, 9])
def test_group_counts_in_bf16(groups, device):
    assert_verified(SPEC, case(31, 24, 32, groups, torch.bfloat16, routing="skewed"), device)


def _inputs(m=12, n=8, k=16, groups=3, dtype=torch.float32, device="cpu"):
    x = seeded((m, k), dtype, device)
    w = seeded((groups, n, k), dtype, device, seed=1)
    return x, w


@pytest.mark.parametrize("ends,what", [
    pytest.param([4, 2, 12], "decreases at index 1", id="decreasing"),
    pytest.param([4, 8, 13], "past x's 12 rows", id="past-rows"),
    pytest.param([-1, 8, 12], "first end is -1", id="negative"),
])
def test_bad_offset_values_are_refused_before_any_launch(ends, what, device):
    x, w = _inputs(device=device)
    offs = torch.tensor(ends, dtype=torch.int32, device=device)
    assert_rejected(lambda: speedlight.grouped_matmul(x, w, offs), ValueError,
                    f"group_offsets.*{what}")


@pytest.mark.parametrize("offs,error,match", [
    pytest.param(torch.tensor([4, 8], dtype=torch.int32), ValueError, "one int32 row end per group",
                 id="wrong-length"),
    pytest.param(torch.tensor([4, 8, 12]), TypeError, "group_offsets must be a int32", id="int64"),
    pytest.param(torch.tensor([[4, 8, 12]], dtype=torch.int32), ValueError, "1-D", id="2-D"),
    pytest.param([4, 8, 12], TypeError, "group_offsets must be a torch.Tensor", id="list"),
])
def test_bad_offsets_shape_and_dtype_are_refused(offs, error, match, device):
    x, w = _inputs(device=device)
    if isinstance(offs, torch.Tensor):
        offs = offs.to(device)
    assert_rejected(lambda: speedlight.grouped_matmul(x, w, offs), error, match)


def test_other_arguments_are_named():
    x, w = _inputs()
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    for call, error, match in [
        (lambda: speedlight.grouped_matmul(x, w[:, :, :8], offs), ValueError, "x's K = 16"),
        (lambda: speedlight.grouped_matmul(x, w[0], offs), ValueError, "w must be 3-D"),
        (lambda: speedlight.grouped_matmul(x, w, offs, bias=torch.zeros(3, 9)), ValueError,
         r"bias must be \[groups, N\]"),
        (lambda: speedlight.grouped_matmul(x, w, offs, activation="relu"), ValueError,
         "activation"),
        (lambda: speedlight.grouped_matmul(x, w, offs, check_offsets="no"), TypeError,
         "check_offsets"),
        (lambda: speedlight.grouped_matmul(x, w.half(), offs), TypeError, "w has dtype"),
    ]:
        assert_rejected(call, error, match)


def test_too_many_groups_are_refused():
    x = torch.zeros(4, 16)
    w = torch.zeros(op.MAX_GROUPS + 1, 1, 16).expand(op.MAX_GROUPS + 1, 8, 16)
    offs = torch.zeros(op.MAX_GROUPS + 1, dtype=torch.int32)
    assert_rejected(lambda: speedlight.grouped_matmul(x, w, offs), ValueError, "at most 1023")


@pytest.mark.parametrize("ends", [[4, 2, 12], [9, 3, 30], [-5, 40, 2]],
                         ids=["decreasing", "past-rows", "negative-and-past"])
def test_unchecked_bad_offsets_stay_in_bounds_and_write_every_row(ends, device):
    """check_offsets=False trusts the values: the kernel clamps them as read, so every row of out
    and dx is written (poisoned memory would show as NaN) and nothing outside the tensors
    is touched; the rows are then whatever the clamped groups give."""
    x, w = _inputs(device=device)
    x.requires_grad_(True)
    offs = torch.tensor(ends, dtype=torch.int32, device=device)
    with poisoned_allocations():
        out = speedlight.grouped_matmul(x, w, offs, check_offsets=False)
        (dx,) = torch.autograd.grad(out.sum(), x)
    assert out.shape == (12, 8) and torch.isfinite(out).all()
    assert torch.isfinite(dx).all()


def test_empty_groups_get_zero_weight_gradients_and_rows_past_the_last_group_zeros(device):
    x, w = _inputs(m=20, groups=5, device=device)
    bias = seeded((5, 8), seed=3, device=device)
    x.requires_grad_(True), w.requires_grad_(True), bias.requires_grad_(True)
    # groups 0 and 3 empty; rows 14.. past the last group
    offs = torch.tensor([0, 6, 10, 10, 14], dtype=torch.int32, device=device)
    with poisoned_allocations():
        out = speedlight.grouped_matmul(x, w, offs, bias=bias, activation="silu")
        dx, dw, dbias = torch.autograd.grad(out.pow(2).sum(), (x, w, bias))
    assert torch.equal(out[14:], torch.zeros_like(out[14:]))
    assert torch.equal(dx[14:], torch.zeros_like(dx[14:]))
    for g in (0, 3):
        assert torch.equal(dw[g], torch.zeros_like(dw[g]))
        assert torch.equal(dbias[g], torch.zeros_like(dbias[g]))
    assert dw[1].abs().sum() > 0 and dbias[4].abs().sum() > 0


def test_weight_gradient_keeps_a_transposed_weights_layout(device):
    """w given as a [G, K, N] tensor transposed (torch._grouped_mm's layout) is read where
    it lies, and its gradient comes back in that layout: [G, K, N] memory."""
    x, _ = _inputs(device=device)
    w_kn = seeded((3, 16, 8), device=device, seed=1).requires_grad_(True)  # [G, K, N]
    offs = torch.tensor([4, 8, 12], dtype=torch.int32, device=device)
    out = speedlight.grouped_matmul(x, w_kn.transpose(1, 2), offs)
    ref = torch.cat([x[s:e] @ w_kn[g].detach() for g, (s, e) in
                     enumerate([(0, 4), (4, 8), (8, 12)])])
    torch.testing.assert_close(out, ref)
    (dw,) = torch.autograd.grad(out.sum(), w_kn)
    assert dw.is_contiguous()


def _launch(c):
    return capture_case(SPEC, c, "cpu", arch=90, mode="dry").launches


def _constexpr(launch, name):
    return next(a.value for a in launch.args if a.name == name)


@pytest.mark.parametrize("layout,tma", [("contiguous", True), ("transposed", True),
                                        ("strided", False)])
def test_operand_paths(layout, tma):
    """Aligned operands (row- or column-major x, w in either layout) take TMA descriptors;
    a strided x (rows 3 elements apart past the row) takes the pointer path."""
    launches = _launch(case(64, 32, 32, 4, torch.bfloat16, layout))
    fwd = [la for la in launches if la.kernel == "_grouped_matmul_kernel"]
    assert fwd and all(_constexpr(la, "TMA") == tma for la in fwd)


def test_no_host_sync_when_unchecked(device, monkeypatch):
    """With check_offsets=False neither the forward nor the backward reads a value back (what a
    CUDA graph needs): item, tolist, bool and nonzero raise if called."""
    x, w = _inputs(device=device)
    x.requires_grad_(True)
    w.requires_grad_(True)
    offs = torch.tensor([4, 8, 11], dtype=torch.int32, device=device)

    def sync(*args, **kwargs):
        raise AssertionError("a host sync")

    for name in ("item", "tolist", "__bool__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    out = speedlight.grouped_matmul(x, w, offs, activation="gelu", check_offsets=False)
    torch.autograd.grad(out.sum(), (x, w))
    monkeypatch.undo()
    with pytest.raises(AssertionError, match="a host sync"):
        monkeypatch.setattr(torch.Tensor, "__bool__", sync)
        speedlight.grouped_matmul(x, w, offs)


def test_matches_torch_grouped_mm_where_it_runs():
    """The same product as torch._grouped_mm (whose w is [G, K, N]) on the rows it writes."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no _grouped_mm")
    x = seeded((40, 32), torch.bfloat16)
    w = seeded((4, 32, 16), torch.bfloat16, seed=1)  # [G, K, N]
    offs = torch.tensor([5, 5, 21, 40], dtype=torch.int32)
    try:
        want = torch._grouped_mm(x, w, offs=offs)
    except RuntimeError as e:
        pytest.skip(f"torch._grouped_mm does not run here: {e}")
    got = speedlight.grouped_matmul(x, w.transpose(1, 2), offs)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_weight_gradient_walks_the_groups_heaviest_first(device):
    """The weight-gradient kernel's schedule: the groups by rows, most first, ties in group
    order (a stable sort on the device), so a skewed routing's hot expert starts first."""
    ends = torch.tensor([3, 3, 10, 11, 20, 20, 23], dtype=torch.int32, device=device)
    # rows per group: 3, 0, 7, 1, 9, 0, 3
    assert op.heaviest_first(ends).tolist() == [4, 2, 0, 6, 3, 1, 5]
    assert op.heaviest_first(ends).dtype == torch.int32
