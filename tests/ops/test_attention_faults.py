"""Attention on values that lie and scores that are not finite: packed cu_seqlens and
max_seqlen checked by default and memory-safe without the check, a NaN row against SDPA's
math backend, and options of the wrong type."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import speedlight
from speedlight import reference
from speedlight.verify.harness import LaunchCounter
from tests.helpers import seeded


def _cu(*values):
    return torch.tensor(values, dtype=torch.int32)


def _packed(total, heads=2, kv_heads=1, dim=16):
    return (seeded((total, heads, dim)), seeded((total, kv_heads, dim), seed=1),
            seeded((total, kv_heads, dim), seed=2))


@pytest.mark.parametrize("cu,max_seqlen,match", [
    pytest.param(_cu(0, 5, 40), 35, r"cu_seqlens_q must start at 0, never decrease and end at "
                 r"the packed length 8", id="ends-past-the-tensor"),
    pytest.param(_cu(0, 3, 5), 3, "end at the packed length 8", id="ends-before-the-tensor"),
    pytest.param(_cu(0, 5, 3, 8), 5, "never decrease", id="decreasing"),
    pytest.param(_cu(1, 5, 8), 4, "start at 0", id="starts-at-1"),
    pytest.param(_cu(0, 2, 8), 5, r"max_seqlen_q \(5\) is below the longest sequence of "
                 r"cu_seqlens_q \(6\)", id="max-seqlen-short"),
])
def test_packed_values_are_checked_by_default(cu, max_seqlen, match):
    """The issue's repro ([0, 5, 40] over 8 rows read and wrote past the tensors) and every
    other lie a cu_seqlens or max_seqlen can tell: one ValueError before any launch."""
    q, k, v = _packed(8)
    counter = LaunchCounter()
    with counter.active(), pytest.raises(ValueError, match=match):
        speedlight.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_seqlen,
                             max_seqlen_k=max_seqlen)
    assert counter.count == 0


@pytest.mark.parametrize("cu,max_seqlen,sequences", [
    pytest.param(_cu(0, 5, 40), 35, [(0, 5), (5, 8)], id="ends-past-the-tensor"),
    pytest.param(_cu(0, 3, 5), 3, [(0, 3), (3, 5)], id="ends-before-the-tensor"),
    pytest.param(_cu(0, 6, 8), 4, [(0, 4), (6, 8)], id="sequence-past-max-seqlen"),
    pytest.param(_cu(-3, 2, 8), None, [(0, 2), (2, 8)], id="negative-start-no-max-seqlen"),
])
def test_unchecked_packed_values_stay_inside_the_tensors(cu, max_seqlen, sequences, device):
    """check_seqlens=False reads nothing on the host: each sequence is clamped into the
    packed rows and cut at max_seqlen, and rows in no sequence are zeros (lse -inf), in
    the forward and the backward."""
    q, k, v = (t.to(device).requires_grad_() for t in _packed(8))
    cu = cu.to(device)
    poison = torch.full((1 << 16,), float("nan"))  # freed memory the outputs may reuse
    del poison
    o, lse = speedlight.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                  max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen,
                                  check_seqlens=False, return_lse=True)
    do = seeded(o.shape, device=device, seed=5)
    (o * do).sum().backward()
    covered = torch.zeros(8, dtype=torch.bool)
    for a, b in sequences:
        covered[a:b] = True
        qs, ks, vs = (t.detach()[a:b].transpose(0, 1)[None].requires_grad_() for t in (q, k, v))
        want = speedlight.attention(qs, ks, vs, causal=True)
        (want * do[a:b].transpose(0, 1)[None]).sum().backward()
        torch.testing.assert_close(o[a:b], want[0].transpose(0, 1), rtol=1e-5, atol=1e-6)
        for got, w in ((q.grad, qs.grad), (k.grad, ks.grad), (v.grad, vs.grad)):
            torch.testing.assert_close(got[a:b], w[0].transpose(0, 1), rtol=1e-5, atol=1e-6)
    rest = ~covered
    for t in (o, q.grad, k.grad, v.grad):
        assert torch.equal(t[rest], torch.zeros_like(t[rest]))
    assert bool(torch.isneginf(lse[:, rest]).all())


def test_unchecked_without_max_seqlen_equals_checked(device):
    q, k, v = (t.to(device) for t in _packed(23))
    cu = _cu(0, 5, 6, 6, 23).to(device)
    checked = speedlight.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    unchecked = speedlight.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                     check_seqlens=False)
    assert torch.equal(checked, unchecked)


def test_packed_compiles_fullgraph_without_the_host_read(device):
    """check_seqlens=False with max_seqlen given: the whole call compiles as one graph
    (what CUDA graphs and compiled training steps need)."""
    torch._dynamo.reset()
    q, k, v = (t.to(device) for t in _packed(9))
    cu = _cu(0, 4, 9).to(device)

    def step(q, k, v):
        return speedlight.attention(q * 2.0, k, v, causal=True, cu_seqlens_q=cu,
                                    cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5,
                                    check_seqlens=False).sum(-1)

    q.requires_grad_()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(got, step(q, k, v))


def _sdpa_math(q, k, v, causal, do):
    """o, dq, dk, dv of SDPA's math backend in float64."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    o.backward(do.double())
    return o, q.grad, k.grad, v.grad


@pytest.mark.parametrize("where,causal,splits", [
    pytest.param("q", True, None, id="q-row-causal"),  # the issue's: dv NaN at every key
    pytest.param("q", True, 2, id="q-row-causal-split"),
    pytest.param("k", False, None, id="k-row"),
    pytest.param("q", False, None, id="q-row"),
])
def test_nan_row_is_nan_where_sdpa_math_is(where, causal, splits, device):
    """A row whose scores hold a NaN: o, dq, dk and dv NaN exactly where SDPA's math
    backend has NaN (dk and dv at every key of the kv head, masked ones too), and the
    row's lse NaN (it was -inf, the "saw no key" value, which dropped the NaN backward)."""
    q, k, v = (seeded((1, h, 12, 16), device=device, seed=i) for i, h in enumerate((4, 2, 2)))
    {"q": q, "k": k, "v": v}[where][0, 0, 3, 0] = float("nan")
    do = seeded((1, 4, 12, 16), device=device, seed=7)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, lse = speedlight.attention(q, k, v, causal=causal, num_splits=splits, return_lse=True)
    o.backward(do)
    want = _sdpa_math(q, k, v, causal, do)
    for name, got, w in zip(("o", "dq", "dk", "dv"), (o, q.grad, k.grad, v.grad), want):
        assert torch.equal(torch.isnan(got), torch.isnan(w)), f"{name}: NaN positions"
    assert torch.equal(torch.isnan(lse), torch.isnan(o).all(-1))


def test_nan_a_row_cannot_see_does_not_reach_it(device):
    """A NaN key hidden by the causal mask leaves the rows before it finite (SDPA's math
    backend, adding a -inf mask to a NaN score, makes them NaN too)."""
    q, k, v = (seeded((1, 2, 12, 16), device=device, seed=i) for i in range(3))
    k[0, 0, 6, 0] = float("nan")
    o = speedlight.attention(q, k, v, causal=True)
    assert bool(torch.isfinite(o[0, 0, :6]).all()) and bool(torch.isnan(o[0, 0, 6:]).all())
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    assert torch.equal(torch.isnan(o), torch.isnan(want))


def test_plus_inf_score_gives_nan_output_and_inf_lse(device):
    q, k, v = (seeded((1, 2, 6, 16), device=device, seed=i) for i in range(3))
    q[0, 0, 2, 0] = float("inf")  # scores +-inf: exp(inf - inf) is NaN
    o, lse = speedlight.attention(q, k, v, return_lse=True)
    _, want = reference.attention(q.double(), k.double(), v.double(), return_lse=True)
    assert bool(torch.isnan(o[0, 0, 2]).all())
    assert lse[0, 0, 2].item() == float("inf") == want[0, 0, 2].item()


@pytest.mark.parametrize("options,error,match", [
    pytest.param(dict(causal="False"), TypeError, "causal must be a bool", id="causal-str"),
    pytest.param(dict(causal=None), TypeError, "causal must be a bool", id="causal-none"),
    pytest.param(dict(return_lse=1), TypeError, "return_lse must be a bool", id="lse-int"),
    pytest.param(dict(check_seqlens="yes"), TypeError, "check_seqlens must be a bool",
                 id="check-str"),
    pytest.param(dict(num_splits=True), ValueError, "num_splits must be a positive int",
                 id="splits-bool"),
    pytest.param(dict(scale=True), TypeError, "scale must be a finite float", id="scale-bool"),
    pytest.param(dict(window=(2 ** 63, 0)), ValueError, "window sides must be", id="window-huge"),
    pytest.param(dict(max_seqlen_q=4), ValueError, "max_seqlen_q applies to packed inputs",
                 id="max-seqlen-dense"),
])
def test_wrongly_typed_option_is_refused(options, error, match):
    q = seeded((1, 2, 4, 16))
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        speedlight.attention(q, q, q, **options)
    assert counter.count == 0


@pytest.mark.parametrize("options,error,match", [
    pytest.param(dict(max_seqlen_q=1.5), TypeError, "max_seqlen_q must be an int",
                 id="max-seqlen-float"),
    pytest.param(dict(max_seqlen_k=-1), ValueError, "max_seqlen_k must be >= 0",
                 id="max-seqlen-negative"),
])
def test_packed_option_is_refused(options, error, match):
    q, k, v = _packed(8)
    cu = _cu(0, 8)
    with pytest.raises(error, match=match):
        speedlight.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, **options)
