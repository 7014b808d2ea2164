"""Attention on values that lie and scores that are not finite: packed cu_seqlens and
max_seqlen checked by default and memory-safe without the check, NaN and inf against SDPA's
math backend (visible or hidden by the mask), and options of the wrong type."""

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


def _inject(tensors, where, value, index):
    tensors[where][index] = float(value)


@pytest.mark.parametrize("splits", [None, 2], ids=["one-pass", "split"])
@pytest.mark.parametrize("where,value", [(w, v) for w in ("q", "k", "v", "do")
                                         for v in ("nan", "inf", "-inf")])
def test_fault_the_mask_hides_is_nan_where_sdpa_math_is(where, value, splits, device):
    """A NaN or inf at row or key 9 of 12, which the causal mask hides from the rows
    before it: o, dq, dk and dv NaN exactly where SDPA's math backend has NaN (it adds the
    mask to the scores, so a hidden NaN or +inf score makes its row NaN, and a hidden
    pair's zero weight times a non-finite value or gradient is NaN); the flash kernels
    never visit those pairs, the fault kernels find them on the device."""
    t = {"q": seeded((1, 4, 12, 16), device=device, seed=0),
         "k": seeded((1, 2, 12, 16), device=device, seed=1),
         "v": seeded((1, 2, 12, 16), device=device, seed=2),
         "do": seeded((1, 4, 12, 16), device=device, seed=7)}
    _inject(t, where, value, (0, 0, 9, 5))
    q, k, v = (t[n].requires_grad_() for n in "qkv")
    o = speedlight.attention(q, k, v, causal=True, num_splits=splits)
    o.backward(t["do"])
    want = _sdpa_math(q, k, v, True, t["do"])
    assert bool(torch.isnan(want[0]).any() | torch.isnan(want[3]).any())
    for name, got, w in zip(("o", "dq", "dk", "dv"), (o, q.grad, k.grad, v.grad), want):
        assert torch.equal(torch.isnan(got), torch.isnan(w)), f"{name}: NaN positions"


@pytest.mark.parametrize("where", ["k", "v", "do"])
@pytest.mark.parametrize("options", [
    pytest.param(dict(window=(3, 1)), id="window"),
    pytest.param(dict(causal=True, cu_seqlens_q=_cu(0, 5, 20), cu_seqlens_k=_cu(0, 5, 20)),
                 id="packed"),
])
def test_fault_outside_a_window_or_in_a_packed_sequence(where, options, device):
    """Windows and packed sequences against the float64 reference, which adds the mask as
    the math backend does: a fault outside a row's window reaches it; one in another
    packed sequence does not (that sequence is another matrix)."""
    packed = "cu_seqlens_q" in options
    shape = (lambda h: (20, h, 16)) if packed else (lambda h: (1, h, 20, 16))
    t = {"q": seeded(shape(2), device=device, seed=0), "k": seeded(shape(1), device=device, seed=1),
         "v": seeded(shape(1), device=device, seed=2), "do": seeded(shape(2), device=device, seed=3)}
    _inject(t, where, "nan", (12, 0, 4) if packed else (0, 0, 12, 4))
    options = {n: (x.to(device) if torch.is_tensor(x) else x) for n, x in options.items()}
    q, k, v = (t[n].requires_grad_() for n in "qkv")
    o, lse = speedlight.attention(q, k, v, return_lse=True, **options)
    o.backward(t["do"])
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    o64, lse64 = reference.attention(q64, k64, v64, return_lse=True, **options)
    o64.backward(t["do"].double())
    for name, got, w in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, q.grad, k.grad, v.grad),
                            (o64, lse64, q64.grad, k64.grad, v64.grad)):
        assert torch.equal(torch.isnan(got), torch.isnan(w)), f"{name}: NaN positions"
    if packed:  # the first sequence (rows 0-4) never sees the fault
        assert bool(torch.isfinite(o[:5]).all() and torch.isfinite(q.grad[:5]).all())
    else:  # rows 0-4 (keys 0-4 for do's fault) lie outside the window of position 12
        reached = k.grad[0, 0, :5] if where == "do" else o[0, :, :5]
        assert bool(torch.isnan(reached).any())


def test_finite_inputs_stay_finite_through_the_fault_pass(device):
    """A causal call launches the fault kernel after the flash kernel; on finite inputs
    its flag is finite, so it writes nothing: o and lse finite and as the reference."""
    q, k, v = (seeded((1, 2, 12, 16), device=device, seed=i) for i in range(3))
    counter = LaunchCounter()
    with counter.active():
        o, lse = speedlight.attention(q, k, v, causal=True, return_lse=True)
    assert counter.kernels == ["_attention_fwd_kernel", "_attention_fwd_faults_kernel"]
    assert bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
    torch.testing.assert_close(o, reference.attention(q, k, v, causal=True), rtol=1e-5,
                               atol=1e-6)


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
