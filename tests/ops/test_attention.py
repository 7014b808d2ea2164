"""What is particular to attention: masks and positions, GQA, variable length, the
split-KV decode path, strided views read in place, the log-sum-exp, argument checks,
determinism and torch.compile. Every registered op's suites run in the contract test."""

import itertools

import pytest
import torch

import speedlight
from speedlight import reference
from speedlight.ops.attention import SPEC, attention_bwd, attention_fwd
from speedlight.launch import for_target
from speedlight.spec import Case
from speedlight.verify.harness import LaunchCounter
from tests.conftest import gpu_target
from tests.helpers import assert_verified, seeded


def qkv(b, h, hkv, sq, sk, d, dtype=torch.float32, device="cpu", seed=0):
    return (seeded((b, h, sq, d), dtype, device, seed),
            seeded((b, hkv, sk, d), dtype, device, seed + 1),
            seeded((b, hkv, sk, d), dtype, device, seed + 2))


def case(b, h, hkv, sq, sk, d, dtype=torch.float32, layout="contiguous", **flags):
    return Case("attention", (("batch", b), ("heads", h), ("kv_heads", hkv), ("seq_q", sq),
                              ("seq_k", sk), ("dim", d)), dtype=dtype, layout=layout,
                flags=flags)


@pytest.mark.parametrize("c", [
    pytest.param(case(1, 2, 1, 16, 150, 128, torch.bfloat16, causal=True, splits=3, lse=True),
                 id="decode16-mqa-splits3-bf16"),
    # (one key per query would make dq and dk exactly zero, which no relative error judges)
    pytest.param(case(1, 2, 2, 20, 20, 64, torch.float16, left=1, right=0), id="two-keys-fp16"),
    pytest.param(case(1, 2, 1, 24, 24, 64, torch.bfloat16, causal=True, left=5, softcap=2.0,
                      seed=3), id="sliding-softcap-bf16"),
    pytest.param(case(2, 2, 1, 1, 33, 64, torch.float32, right=-1, left=3), id="decode-window-fp32"),
])
def test_variant_matches_float64(c, device):
    assert_verified(SPEC, c, device)


def test_positions_are_aligned_at_the_end(device):
    """Causal with seq_q < seq_k: query row r is at position r + seq_k - seq_q, so the last
    query sees every key and equals attention of that query alone over all keys."""
    q, k, v = qkv(1, 2, 2, 5, 40, 64, device=device)
    o = speedlight.attention(q, k, v, causal=True)
    last = speedlight.attention(q[:, :, -1:], k, v)
    torch.testing.assert_close(o[:, :, -1:], last, rtol=1e-5, atol=1e-6)
    first = speedlight.attention(q[:, :, :1], k[:, :, :36], v[:, :, :36])
    torch.testing.assert_close(o[:, :, :1], first, rtol=1e-5, atol=1e-6)


def test_query_that_sees_no_key_gets_zeros_and_minus_inf(device):
    q, k, v = qkv(1, 2, 1, 12, 4, 64, device=device)
    for t in (q, k, v):
        t.requires_grad_()
    o, lse = speedlight.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o[:, :, :8], torch.zeros_like(o[:, :, :8]))
    assert bool(torch.isneginf(lse[:, :, :8]).all()) and bool(torch.isfinite(lse[:, :, 8:]).all())
    (o.sum() + lse[:, :, 8:].sum()).backward()
    for t in (q, k, v):
        assert bool(torch.isfinite(t.grad).all())
    assert torch.equal(q.grad[:, :, :8], torch.zeros_like(q.grad[:, :, :8]))


def test_gqa_equals_repeated_kv_and_sums_its_group(device):
    q, k, v = qkv(1, 6, 2, 19, 23, 64, device=device)
    kr, vr = (t.repeat_interleave(3, dim=1) for t in (k, v))
    o, lse = attention_fwd(q, k, v, causal=True)
    o_rep, lse_rep = attention_fwd(q, kr, vr, causal=True)
    assert torch.equal(o, o_rep) and torch.equal(lse, lse_rep)
    do = seeded(o.shape, seed=9)
    dq, dk, dv = attention_bwd(do, q, k, v, o, lse, causal=True)
    dq_r, dk_r, dv_r = attention_bwd(do, q, kr, vr, o, lse, causal=True)
    assert torch.equal(dq, dq_r)
    torch.testing.assert_close(dk, dk_r.unflatten(1, (2, 3)).sum(2), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dv, dv_r.unflatten(1, (2, 3)).sum(2), rtol=1e-5, atol=1e-6)


def test_backward_is_deterministic(device):
    q, k, v = qkv(1, 4, 1, 33, 33, 64, torch.float16, device=device)
    o, lse = attention_fwd(q, k, v, causal=True)
    do = seeded(o.shape, torch.float16, device, seed=5)
    first = attention_bwd(do, q, k, v, o, lse, causal=True)
    second = attention_bwd(do, q, k, v, o, lse, causal=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_varlen_equals_each_sequence_alone(device):
    lens_q, lens_k = [3, 0, 1, 20], [7, 5, 1, 20]
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
                  for lens in (lens_q, lens_k))
    q = seeded((24, 4, 64), device=device)
    k, v = seeded((33, 2, 64), device=device, seed=1), seeded((33, 2, 64), device=device, seed=2)
    o, lse = speedlight.attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                  return_lse=True)
    assert lse.shape == (4, 24)
    for i in range(4):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if lens_q[i] == 0:
            continue
        dense = speedlight.attention(q[qs].transpose(0, 1)[None], k[ks].transpose(0, 1)[None],
                                     v[ks].transpose(0, 1)[None], causal=True)
        torch.testing.assert_close(o[qs], dense[0].transpose(0, 1), rtol=1e-5, atol=1e-6)


def test_split_kv_matches_one_pass(device):
    q, k, v = qkv(2, 4, 2, 3, 250, 96, device=device)
    counter = LaunchCounter()
    o1, lse1 = attention_fwd(q, k, v, causal=True, num_splits=1)
    with counter.active():
        o4, lse4 = attention_fwd(q, k, v, causal=True, num_splits=4)
    assert counter.kernels == ["_attention_fwd_kernel", "_attention_combine_kernel",
                               "_attention_fwd_faults_kernel"]
    torch.testing.assert_close(o4, o1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse4, lse1, rtol=1e-5, atol=1e-6)


def test_gpu_sized_decode_splits_on_its_own(device):
    """The launch a GPU of 132 SMs gets (launch.for_target): one query against 1100 keys
    fills the GPU only by splitting the keys; verified under the interpreter."""
    q, k, v = qkv(1, 1, 1, 1, 1100, 64, device=device)
    counter = LaunchCounter()
    with for_target(gpu_target(132)), counter.active():
        o = speedlight.attention(q, k, v, causal=True)
    assert "_attention_combine_kernel" in counter.kernels
    torch.testing.assert_close(o, reference.attention(q, k, v, causal=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_blackwell_forward_loads_k_and_v_by_tensor_descriptors(packed, device):
    """Sized for a B200 (sm_100a) the forward takes its TMA path: K and V tiles through
    descriptors made per sequence (rows past a sequence come back as zeros, never the next
    sequence's), verified under the interpreter in fp16; a row stride that is not 16-byte
    aligned (head dim 4 in fp16) takes the pointer path."""
    from speedlight.ops import attention_launch
    from speedlight.target import resolve

    taken = []
    choose = attention_launch._tma

    def recorded(*args):
        taken.append(choose(*args))
        return taken[-1]

    cu = torch.tensor([0, 17, 40, 61], dtype=torch.int32, device=device)
    for dim, tma in ((64, True), (4, False)):
        if packed:
            q, k, v = (seeded((61, h, dim), torch.float16, device, seed)
                       for seed, h in ((3, 4), (4, 2), (5, 2)))
            kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
        else:
            q, k, v = qkv(2, 4, 2, 150, 170, dim, dtype=torch.float16, device=device)
            kw = dict(causal=True)
        taken.clear()
        with for_target(resolve("sm_100a")):
            attention_launch._tma = recorded
            try:
                o = speedlight.attention(q, k, v, **kw)
            finally:
                attention_launch._tma = choose
        assert taken == [tma], (dim, taken)
        expected = reference.attention(q.double(), k.double(), v.double(), **kw)
        torch.testing.assert_close(o.double(), expected, rtol=2e-3, atol=2e-3)


def test_transposed_view_is_read_in_place(device):
    """A [batch, seq, heads, dim] tensor's .transpose(1, 2) is read without a copy, and the
    output keeps that layout (so .transpose(1, 2) of it is contiguous again)."""
    x = seeded((2, 9, 4, 64), device=device)
    q = x.transpose(1, 2)
    counter = LaunchCounter()
    with counter.active():
        o = speedlight.attention(q, q, q, causal=True)
    assert counter.kernels == ["_attention_fwd_kernel", "_attention_fwd_faults_kernel"]
    assert o.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(o, reference.attention(q, q, q, causal=True), rtol=1e-5, atol=1e-6)


def test_module_matches_function(device):
    q, k, v = qkv(1, 2, 1, 7, 7, 64, device=device)
    m = speedlight.nn.Attention(causal=True, window=(3, -1))
    assert isinstance(m, torch.nn.Module) and not list(m.parameters())
    torch.testing.assert_close(m(q, k, v), speedlight.attention(q, k, v, causal=True,
                                                                 window=(3, -1)))


def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()

    def block(q, k, v):
        return speedlight.attention(q * 2.0, k, v, causal=True, softcap=20.0).sum(-1)

    q, k, v = qkv(1, 2, 1, 9, 9, 64, device=device)
    q.requires_grad_()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    y = compiled(q, k, v)
    (gq,) = torch.autograd.grad(y.sum(), (q,))
    y_ref = block(q, k, v)
    (gq_ref,) = torch.autograd.grad(y_ref.sum(), (q,))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gq, gq_ref)


def _t(*shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype)


_CU = torch.tensor([0, 2, 5], dtype=torch.int32)


@pytest.mark.parametrize("call,error,match", [
    pytest.param(lambda: speedlight.attention(_t(1, 2, 3, 64), _t(1, 2, 3, 32), _t(1, 2, 3, 32)),
                 ValueError, "same head dim", id="head-dims"),
    pytest.param(lambda: speedlight.attention(_t(1, 3, 3, 64), _t(1, 2, 3, 64), _t(1, 2, 3, 64)),
                 ValueError, "kv heads .* must divide q heads", id="kv-heads"),
    pytest.param(lambda: speedlight.attention(_t(1, 2, 3, 300), _t(1, 2, 3, 300), _t(1, 2, 3, 300)),
                 ValueError, "head dim must be 1 to 256", id="head-dim-300"),
    pytest.param(lambda: speedlight.attention(_t(5, 2, 64), _t(5, 2, 64), _t(5, 2, 64),
                                              cu_seqlens_q=_CU.long(), cu_seqlens_k=_CU),
                 TypeError, "cu_seqlens_q must be a int32", id="cu-int64"),
    pytest.param(lambda: speedlight.attention(
        _t(5, 2, 64), _t(5, 2, 64), _t(5, 2, 64), cu_seqlens_q=torch.tensor([0, 3, 2], dtype=torch.int32),
        cu_seqlens_k=_CU), ValueError, "cu_seqlens_q must start at 0, never decrease", id="cu-decreasing"),
    pytest.param(lambda: speedlight.attention(_t(5, 2, 64), _t(5, 2, 64), _t(5, 2, 64),
                                              cu_seqlens_q=_CU),
                 ValueError, "given together", id="cu-alone"),
    pytest.param(lambda: speedlight.attention(_t(1, 2, 3, 64), _t(1, 2, 3, 64), _t(1, 2, 3, 64),
                                              window=(-2, 4)),
                 ValueError, "window sides must be >= -1", id="window-side"),
    pytest.param(lambda: speedlight.attention(_t(1, 2, 3, 64), _t(1, 2, 3, 64), _t(1, 2, 3, 64),
                                              softcap=-1.0),
                 ValueError, "softcap must be a positive", id="softcap"),
    pytest.param(lambda: speedlight.attention(_t(1, 2, 3, 64), _t(1, 2, 3, 64, dtype=torch.float16),
                                              _t(1, 2, 3, 64)),
                 TypeError, "k has dtype torch.float16 but q", id="dtypes"),
    pytest.param(lambda: speedlight.attention(_t(2, 3, 64), _t(2, 3, 64), _t(2, 3, 64)),
                 ValueError, r"q must be \[batch, heads, seq, dim\]", id="dims"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match):
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call()
    assert counter.count == 0


def test_autocast_casts_q_k_and_v_to_its_dtype(device):
    """Under torch.autocast, as torch's SDPA there: an fp32 q (promoted by a model's q_norm)
    beside bf16 k and v is attended in bf16, o in bf16, each gradient in its input's dtype."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 16, generator=g).to(device).requires_grad_()
    k, v = (torch.randn(1, 2, 5, 16, generator=g).to(device, torch.bfloat16).requires_grad_()
            for _ in range(2))
    with torch.autocast(device.type, dtype=torch.bfloat16):
        o = speedlight.attention(q, k, v, causal=True)
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert o.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(o, speedlight.attention(q.detach().bfloat16(), k, v, causal=True))
    o.float().sum().backward()
    assert (q.grad.dtype, k.grad.dtype) == (torch.float32, torch.bfloat16)
