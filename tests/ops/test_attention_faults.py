"""Attention on values that lie and scores that are not finite: packed cu_seqlens and
max_seqlen checked by default and memory-safe without the check, NaN and inf against the
float64 reference, which masks by selection (a fault the mask hides reaches nothing; one
a row sees propagates), and options of the wrong type."""

import pytest
import torch

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


def _nonfinite_as_reference(got, want, name):
    """NaN, +inf and -inf at the same positions; the finite values close."""
    for kind in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(kind(got), kind(want.to(got.device))), f"{name}: {kind.__name__}"
    finite = torch.isfinite(got)
    torch.testing.assert_close(got[finite].double(), want.to(got.device)[finite], rtol=1e-4,
                               atol=1e-5, msg=name)


def _against_reference(t, **options):
    """o, lse, dq, dk, dv of speedlight and of the float64 reference (which masks by
    selection) for the tensors t (q, k, v, do); every NaN and inf where the reference has
    it. Returns speedlight's."""
    q, k, v = (t[n].clone().requires_grad_() for n in "qkv")
    o, lse = speedlight.attention(q, k, v, return_lse=True, **options)
    o.backward(t["do"])
    q64, k64, v64 = (t[n].detach().cpu().double().requires_grad_() for n in "qkv")
    o64, lse64 = reference.attention(
        q64, k64, v64, return_lse=True,
        **{n: (x.cpu() if torch.is_tensor(x) else x) for n, x in options.items()})
    o64.backward(t["do"].cpu().double())
    got = {"o": o, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    for name, want in zip(got, (o64, lse64, q64.grad, k64.grad, v64.grad)):
        _nonfinite_as_reference(got[name].detach(), want.detach(), name)
    return got


def _tensors(shape, device, where=None, value=None, index=None):
    """q, k, v, do of `shape(heads)` (2 q heads, 1 kv head), one of them faulted."""
    t = {"q": seeded(shape(2), device=device, seed=0), "k": seeded(shape(1), device=device, seed=1),
         "v": seeded(shape(1), device=device, seed=2), "do": seeded(shape(2), device=device, seed=3)}
    if where is not None:
        t[where][index] = float(value)
    return t


_DENSE = lambda h: (1, h, 12, 16)  # noqa: E731
_FAULTS = [(w, v) for w in ("q", "k", "v", "do") for v in ("nan", "inf", "-inf")]
_CLEAN = {}  # the clean run's outputs, per device


@pytest.mark.parametrize("where,value", _FAULTS)
def test_causally_masked_fault_reaches_nothing(where, value, device):
    """A NaN or inf in row or key 9 of 12: every output and gradient is NaN or inf exactly
    where the float64 reference (masking by selection) has it, and what the causal mask
    hides from the fault is as without it: rows 0-8 of o, lse and dq for a key's fault
    (keys 10-11 of dk and dv for a row's), bit for bit close to the clean run."""
    got = _against_reference(_tensors(_DENSE, device, where, value, (0, 0, 9, 5)), causal=True)
    if str(device) not in _CLEAN:
        _CLEAN[str(device)] = _against_reference(_tensors(_DENSE, device), causal=True)
    clean = _CLEAN[str(device)]
    if where in ("k", "v"):
        hidden = {"o": (..., slice(0, 9), slice(None)), "lse": (..., slice(0, 9)),
                  "dq": (..., slice(0, 9), slice(None))}
    else:
        hidden = {"dk": (..., slice(10, 12), slice(None)), "dv": (..., slice(10, 12), slice(None))}
    for name, at in hidden.items():
        assert bool(torch.isfinite(got[name][at]).all()), name
        torch.testing.assert_close(got[name][at], clean[name][at], msg=name)


@pytest.mark.parametrize("where,value,splits", [
    pytest.param("k", "nan", 2, id="k-nan-split"),
    pytest.param("v", "inf", 2, id="v-inf-split"),
    pytest.param("q", "nan", 3, id="q-nan-split3"),
])
def test_masked_fault_in_a_split_key_range(where, value, splits, device):
    """The split-KV forward and its combine: a fault in one span reaches only the rows that
    see it."""
    _against_reference(_tensors(_DENSE, device, where, value, (0, 0, 9, 5)), causal=True,
                       num_splits=splits)


@pytest.mark.parametrize("where", ["k", "v", "do"])
@pytest.mark.parametrize("options", [
    pytest.param(dict(window=(3, 1)), id="window"),
    pytest.param(dict(causal=True, cu_seqlens_q=_cu(0, 5, 20), cu_seqlens_k=_cu(0, 5, 20)),
                 id="packed"),
])
def test_fault_outside_a_window_or_in_another_sequence(where, options, device):
    """A NaN at row or key 12 of 20, under the window (3, 1) (row i sees keys i-3 to i+1:
    key 12 is seen by rows 11-15, row 12 sees keys 9-13) or in the second of two packed
    sequences: it reaches only what sees it, as the float64 reference by selection."""
    packed = "cu_seqlens_q" in options
    shape = (lambda h: (20, h, 16)) if packed else (lambda h: (1, h, 20, 16))
    t = _tensors(shape, device, where, "nan", (12, 0, 4) if packed else (0, 0, 12, 4))
    options = {n: (x.to(device) if torch.is_tensor(x) else x) for n, x in options.items()}
    got = _against_reference(t, **options)
    if packed:  # the first sequence (rows and keys 0-4) never sees the fault
        for name in got:
            first = got[name][:, :5] if name == "lse" else got[name][:5]
            assert bool(torch.isfinite(first).all()), name
    else:  # rows 0-8 see keys up to 9 at most; key 12 is seen by rows 11-15 only
        assert bool(torch.isfinite(got["o"][0, :, :8]).all())


def test_finite_inputs_launch_one_wave_of_fault_checks(device):
    """Besides the flash kernels, one fault kernel per direction, of at most one program
    per SM: on finite inputs each program reads its blocks' fault counts (all 0) and
    writes nothing, so o, lse and the gradients are the flash kernels' own."""
    from speedlight.launch import for_target
    from speedlight.ops import attention_launch
    from tests.conftest import gpu_target

    q, k, v = (seeded((1, 2, 12, 16), device=device, seed=i).requires_grad_() for i in range(3))
    counter = LaunchCounter()
    with counter.active():
        o, lse = speedlight.attention(q, k, v, causal=True, return_lse=True)
        o.sum().backward()
    assert counter.kernels == ["_attention_fwd_kernel", "_attention_fwd_faults_kernel",
                               "_attention_bwd_delta_kernel", "_attention_bwd_dkdv_kernel",
                               "_attention_bwd_dq_kernel", "_attention_bwd_faults_kernel"]
    assert bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
    torch.testing.assert_close(o, reference.attention(q, k, v, causal=True), rtol=1e-5,
                               atol=1e-6)
    with for_target(gpu_target(132)):  # 4096 query blocks of the 8K-token case: one wave
        assert attention_launch._one_wave(4096, torch.device(device)) == (132,)
        assert attention_launch._one_wave(7, torch.device(device)) == (7,)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_visible_fault_in_a_row_as_the_reference(value, device):
    """A fault in q row 3 (GQA, causal): the row's o and lse NaN (lse +inf for a +inf
    score), its dq NaN, and dk, dv NaN at the keys it sees (0-3) only: a row whose softmax
    is NaN reaches no key it cannot see."""
    t = _tensors(_DENSE, device, "q", value, (0, 0, 3, 0))
    got = _against_reference(t, causal=True)
    assert bool(torch.isnan(got["o"][0, 0, 3]).all())
    assert bool(torch.isfinite(got["dk"][0, 0, 4:]).all() and torch.isfinite(got["dv"][0, 0, 4:]).all())


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
