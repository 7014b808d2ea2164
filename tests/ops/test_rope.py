import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from speedlight.ops import rope as op
from speedlight.verify.harness import LaunchCounter
from tests.conftest import gpu_target
from tests.helpers import assert_rejected, case_maker, assert_verified, seeded

SPEC = op.SPEC


case = case_maker("rope", "batch", "seq", "heads", "kv", "dim", "rot")


def cos_sin(positions, rot_dim, dtype=torch.float32, device="cpu", interleaved=False):
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    freqs = positions.double()[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def test_guards_take_every_model_shape_as_aligned_rows():
    """inspect's guards compile the cases whose head rows are 16-byte aligned: every model
    shape (HF's transposed layout keeps head_dim contiguous); not padded rows, nor a head_dim,
    rot_dim or rotate-half second half off a multiple of 16 elements."""
    model = SPEC.cases("model")
    assert model and all(SPEC.aligned_rows(c) for c in model)
    assert SPEC.rows(model[1]) == model[1]["batch"] * model[1]["seq"]
    assert not SPEC.aligned_rows(case(2, 11, 4, 2, 64, 64, layout="strided"))
    assert not SPEC.aligned_rows(case(1, 3, 2, 2, 33, 16, bshd=True))
    assert not SPEC.aligned_rows(case(2, 5, 4, 1, 64, 24))
    assert not SPEC.aligned_rows(case(1, 5, 4, 1, 64, 48))  # the second half starts at 24
    assert SPEC.aligned_rows(case(1, 5, 4, 1, 64, 48, interleaved=True))


@pytest.mark.parametrize("shape,layout,flags", [
    pytest.param((1, 5, 32, 8, 128, 128), "transposed", {}, id="llama-gqa-one-token-programs"),
    pytest.param((1, 6, 4, 1, 256, 256), "transposed", {}, id="mqa-four-token-programs"),
    pytest.param((1, 1, 4, 1, 256, 256), "transposed", {}, id="mqa-decode-masked-k-step"),
    pytest.param((2, 3, 28, 4, 128, 128), "transposed", {"pos": True},
                 id="qwen-heads-not-a-power-of-two-pos"),
    pytest.param((1, 3, 16, 16, 256, 64), "transposed", {"interleaved": True},
                 id="gptj-interleaved-pass-through"),
    pytest.param((2, 9, 2, 1, 32, 32), "contiguous", {"bcast": True}, id="small-heads-bcast"),
])
def test_gpu_sized_launches_match_float64(shape, layout, flags, device):
    """The tiles a GPU gets (launch.for_target), verified under the interpreter: programs of
    several tokens, q's head steps then k's, a k step with masked heads."""
    from speedlight.launch import for_target

    with for_target(gpu_target(132)):
        for dtype in (torch.bfloat16, torch.float32):
            assert_verified(SPEC, case(*shape, dtype=dtype, layout=layout, **flags), device)


@pytest.mark.parametrize("shape,layout,flags", [
    pytest.param((1, 5, 6, 2, 64, 64), "transposed", {"pos": True}, id="gqa-masked-head-steps-pos"),
    pytest.param((2, 3, 4, 2, 64, 32), "contiguous", {"interleaved": True},
                 id="interleaved-pass-through"),
])
def test_amd_sized_launches_match_float64(shape, layout, flags, device):
    """On an AMD target the kernel takes q's heads and k's in two loops (SPLIT_QK: gfx942
    does not compile the one loop's pointer select): verified under the interpreter with
    the launches an MI300X gets."""
    from speedlight.launch import for_target
    from speedlight.target import resolve

    with for_target(resolve("gfx942")):
        assert_verified(SPEC, case(*shape, dtype=torch.bfloat16, layout=layout, **flags), device)


def _hf_llama_rotary(head_dim, device, dtype, batch, seq):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    config = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    emb = LlamaRotaryEmbedding(config).to(device)
    position_ids = torch.arange(seq, device=device)[None] + torch.tensor([[0], [100]],
                                                                        device=device)[:batch]
    x = torch.empty(1, dtype=dtype, device=device)
    return emb(x, position_ids)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)],
                         ids=["fp32", "bf16"])
def test_matches_hugging_face_llama(dtype, tol, device):
    """LlamaRotaryEmbedding's cos/sin, HF's apply_rotary_pos_emb, GQA, HF's q layout."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    cos, sin = _hf_llama_rotary(32, device, dtype, batch=2, seq=9)
    q = seeded((2, 9, 8, 32), dtype, device).transpose(1, 2)  # q_proj(x).view().transpose()
    k = seeded((2, 9, 2, 32), dtype, device, seed=1).transpose(1, 2)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    q_ours, k_ours = speedlight.rope(q, k, cos, sin)
    torch.testing.assert_close(q_ours, q_hf, rtol=tol, atol=tol)
    torch.testing.assert_close(k_ours, k_hf, rtol=tol, atol=tol)
    # the output keeps q's memory layout, as HF's elementwise ops do
    assert q_ours.stride() == q_hf.stride()


def test_matches_hugging_face_neox_partial_rotary(device):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox.modeling_gpt_neox import (GPTNeoXRotaryEmbedding,
                                                                apply_rotary_pos_emb)
    config = transformers.GPTNeoXConfig(hidden_size=256, num_attention_heads=4, rotary_pct=0.25,
                                        max_position_embeddings=64)
    cos, sin = GPTNeoXRotaryEmbedding(config).to(device)(
        torch.empty(1, device=device), torch.arange(7, device=device)[None])
    assert cos.shape[-1] == 16  # 0.25 of head_dim 64
    q = seeded((1, 4, 7, 64), device=device)
    k = seeded((1, 4, 7, 64), device=device, seed=1)
    for ours, hf in zip(speedlight.rope(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        torch.testing.assert_close(ours, hf, rtol=1e-6, atol=1e-6)


def test_matches_hugging_face_gptj_interleaved_cache(device):
    """GPT-J: [batch, seq, heads, dim], rotary_dim < head_dim, sincos cache at position_ids."""
    pytest.importorskip("transformers")
    from transformers.models.gptj import modeling_gptj as gptj
    rot, max_pos = 16, 50
    sincos = gptj.create_sinusoidal_positions(max_pos, rot).to(device)
    sin_half, cos_half = sincos[:, : rot // 2], sincos[:, rot // 2:]
    position_ids = torch.tensor([[3, 4, 5, 6, 7], [40, 41, 42, 43, 44]], device=device)
    q = seeded((2, 5, 4, 48), device=device)
    k = seeded((2, 5, 4, 48), device=device, seed=1)

    def hf(x):  # GPT-J's attention: rotate the first rotary_dim dims, pass the rest
        sin, cos = sin_half[position_ids], cos_half[position_ids]
        return torch.cat([gptj.apply_rotary_pos_emb(x[..., :rot], sin, cos), x[..., rot:]], -1)

    cos_cache = cos_half.repeat_interleave(2, -1)
    sin_cache = sin_half.repeat_interleave(2, -1)
    q_ours, k_ours = speedlight.rope(q, k, cos_cache, sin_cache, position_ids, unsqueeze_dim=2,
                                     interleaved=True)
    torch.testing.assert_close(q_ours, hf(q), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_ours, hf(k), rtol=1e-6, atol=1e-6)


def test_position_ids_equal_gathered_cos_sin(device):
    cache_cos, cache_sin = cos_sin(torch.arange(64), 32, device=device)
    position_ids = torch.tensor([[5, 0, 63, 17]], device=device)
    q = seeded((3, 4, 4, 32), device=device)
    k = seeded((3, 4, 2, 32), device=device, seed=1)
    with_ids = speedlight.rope(q, k, cache_cos, cache_sin, position_ids, unsqueeze_dim=2)
    gathered = speedlight.rope(q, k, cache_cos[position_ids], cache_sin[position_ids],
                               unsqueeze_dim=2)
    for a, b in zip(with_ids, gathered):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rotation_preserves_pair_and_head_norms(device):
    """Each (i, i + rot/2) pair turns by an angle: its norm, and so the head's, is kept; the
    pass-through dims are copied."""
    q = seeded((2, 4, 9, 48), device=device)
    k = seeded((2, 2, 9, 48), device=device, seed=1)
    cos, sin = cos_sin(torch.arange(9)[None] + 300, 32, device=device)
    q_rot, _ = speedlight.rope(q, k, cos, sin)
    half = 16

    def pair_norms(x):
        return x[..., :half].pow(2) + x[..., half:2 * half].pow(2)
    torch.testing.assert_close(pair_norms(q_rot), pair_norms(q), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1), rtol=1e-5, atol=1e-5)
    assert torch.equal(q_rot[..., 32:], q[..., 32:])
    assert not torch.allclose(q_rot[..., :32], q[..., :32])  # it did rotate


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_rotating_by_minus_theta_undoes_it(interleaved, device):
    q = seeded((1, 3, 5, 16), device=device)
    k = seeded((1, 1, 5, 16), device=device, seed=1)
    cos, sin = cos_sin(torch.arange(5)[None] * 7, 16, device=device, interleaved=interleaved)
    q_rot, k_rot = speedlight.rope(q, k, cos, sin, interleaved=interleaved)
    q_back, k_back = speedlight.rope(q_rot, k_rot, cos, -sin, interleaved=interleaved)
    torch.testing.assert_close(q_back, q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_back, k, rtol=1e-5, atol=1e-5)


def test_backward_is_one_launch_and_unused_output_gets_no_gradient(device):
    q = seeded((1, 4, 6, 32), device=device).requires_grad_()
    k = seeded((1, 2, 6, 32), device=device, seed=1).requires_grad_()
    cos, sin = cos_sin(torch.arange(6)[None], 32, device=device)
    counter = LaunchCounter()
    with counter.active():
        q_rot, _ = speedlight.rope(q, k, cos, sin)
        (q_rot * 3.0).sum().backward()
    assert counter.count == 2
    assert torch.equal(k.grad, torch.zeros_like(k))
    q64 = q.detach().double().requires_grad_()
    (reference.rope(q64, k.detach().double(), cos.double(), sin.double())[0] * 3.0).sum().backward()
    torch.testing.assert_close(q.grad.double(), q64.grad, rtol=1e-6, atol=1e-6)


def test_broadcast_upstream_gradient(device):
    """q_rot.sum() hands the backward a stride-0 gradient; the kernel reads it as it is."""
    q = seeded((2, 3, 4, 16), device=device).requires_grad_()
    k = seeded((2, 1, 4, 16), device=device, seed=1).requires_grad_()
    cos, sin = cos_sin(torch.arange(4)[None] + 9, 16, device=device)
    q_rot, k_rot = speedlight.rope(q, k, cos, sin)
    (q_rot.sum() + k_rot.sum()).backward()
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    q_ref, k_ref = reference.rope(q64, k64, cos.double(), sin.double())
    (q_ref.sum() + k_ref.sum()).backward()
    torch.testing.assert_close(q.grad.double(), q64.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k.grad.double(), k64.grad, rtol=1e-6, atol=1e-6)


def test_float32_cos_sin_with_bfloat16_q(device):
    """An fp32 cos/sin cache with bf16 q, k: fp32 arithmetic, outputs in q's dtype."""
    q = seeded((1, 4, 6, 32), torch.bfloat16, device)
    k = seeded((1, 2, 6, 32), torch.bfloat16, device, seed=1)
    cos, sin = cos_sin(torch.arange(6)[None] + 1000, 32, torch.float32, device)
    q_rot, k_rot = speedlight.rope(q, k, cos, sin)
    assert q_rot.dtype == k_rot.dtype == torch.bfloat16
    q_ref, k_ref = reference.rope(q.float(), k.float(), cos, sin)
    # within one bf16 rounding of the fp32 result
    torch.testing.assert_close(q_rot.float(), q_ref, rtol=2.0 ** -8, atol=1e-6)
    torch.testing.assert_close(k_rot.float(), k_ref, rtol=2.0 ** -8, atol=1e-6)


def test_module_is_apply_rotary_pos_emb(device):
    cos, sin = cos_sin(torch.arange(5)[None], 16, device=device)
    q = seeded((2, 5, 4, 16), device=device)
    k = seeded((2, 5, 2, 16), device=device, seed=1)
    module = snn.ApplyRotary()
    assert dict(module.state_dict()) == {}
    for a, b in zip(module(q, k, cos, sin, unsqueeze_dim=2),
                    reference.rope(q, k, cos, sin, unsqueeze_dim=2)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert "interleaved=True" in repr(snn.ApplyRotary(interleaved=True))


def _compile_case(device, with_positions):
    q = seeded((2, 4, 5, 32), device=device).requires_grad_()
    k = seeded((2, 2, 5, 32), device=device, seed=1).requires_grad_()
    if with_positions:
        cos, sin = cos_sin(torch.arange(40), 32, device=device)
        pos = torch.tensor([[1, 2, 3, 4, 5], [30, 31, 32, 33, 34]], device=device)
    else:
        cos, sin = cos_sin(torch.arange(5)[None] + 11, 32, device=device)
        pos = None
    return q, k, cos, sin, pos


@pytest.mark.parametrize("backend,with_positions", [
    pytest.param("aot_eager", True, id="aot_eager-position_ids"),
    pytest.param("inductor", True, id="inductor-position_ids"),
])
def test_torch_compile_fullgraph_with_position_ids(backend, with_positions, device):
    """The contract test compiles rope without positions; the gather of a cache too."""
    torch._dynamo.reset()

    def attention_prologue(q, k, cos, sin, pos):
        q_rot, k_rot = speedlight.rope(q * 0.5, k, cos, sin, pos)
        return (q_rot @ k_rot.repeat_interleave(2, dim=1).transpose(-1, -2)).tanh()

    q, k, cos, sin, pos = _compile_case(device, with_positions)
    compiled = torch.compile(attention_prologue, fullgraph=True, backend=backend)
    y = compiled(q, k, cos, sin, pos)
    gq, gk = torch.autograd.grad(y.sum(), (q, k))
    y_ref = attention_prologue(q, k, cos, sin, pos)
    gq_ref, gk_ref = torch.autograd.grad(y_ref.sum(), (q, k))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gq, gq_ref)
    torch.testing.assert_close(gk, gk_ref)


def _qk(device, dtype=torch.float32, q_shape=(2, 4, 5, 32), k_shape=(2, 2, 5, 32)):
    return torch.ones(q_shape, dtype=dtype, device=device), torch.ones(k_shape, device=device)


def _cs(device, shape=(2, 5, 32), dtype=torch.float32):
    return (torch.ones(shape, dtype=dtype, device=device),
            torch.ones(shape, dtype=dtype, device=device))


@pytest.mark.parametrize("call,error,match", [
    pytest.param(lambda d: speedlight.rope(*_qk(d, torch.int64), *_cs(d)), TypeError,
                 "q must be a float32, float16 or bfloat16 tensor.*int64", id="integer-q"),
    pytest.param(lambda d: speedlight.rope(*_qk(d, torch.float16), *_cs(d)), TypeError,
                 "k has dtype torch.float32 but q has torch.float16", id="qk-dtype-mismatch"),
    pytest.param(lambda d: speedlight.rope(*_qk(d, k_shape=(2, 2, 5, 16)), *_cs(d)), ValueError,
                 "one head_dim: q has 32, k has 16", id="head-dim-mismatch"),
    pytest.param(lambda d: speedlight.rope(*_qk(d, k_shape=(1, 2, 5, 32)), *_cs(d)), ValueError,
                 "same batch and seq", id="batch-mismatch"),
    pytest.param(lambda d: speedlight.rope(*_qk(d, k_shape=(2, 2, 6, 32)), *_cs(d)), ValueError,
                 "same batch and seq", id="seq-mismatch"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d, (2, 5, 31))), ValueError,
                 "must be even, positive and at most head_dim=32", id="rot-dim-odd"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d, (2, 5, 34))), ValueError,
                 "must be even, positive and at most head_dim=32", id="rot-dim-too-big"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d, (2, 4, 32))), ValueError,
                 r"cos and sin must have shape \[2 or 1, 5 or 1, rot_dim\]",
                 id="cos-seq-mismatch"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d), unsqueeze_dim=3), ValueError,
                 "unsqueeze_dim must be 1", id="unsqueeze-dim"),
    pytest.param(lambda d: speedlight.rope(*_qk(d, q_shape=(4, 5, 32)), *_cs(d)), ValueError,
                 "q must have 4 dims", id="q-3d"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d, (40, 32)),
                                           torch.tensor([[0, 1, 2, 3, 40]] * 2, device=d)),
                 ValueError, r"position_ids must lie in \[0, 40\).*\[0, 40\]",
                 id="position-out-of-range"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d, (40, 32)),
                                           torch.zeros(2, 5, device=d)),
                 TypeError, "position_ids must be a 64- or 32-bit integer tensor",
                 id="float-position-ids"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d),
                                           torch.zeros(2, 5, dtype=torch.long, device=d)),
                 ValueError, "cos and sin must be a cache", id="position-ids-without-cache"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d, (40, 32)),
                                           torch.zeros(2, 4, dtype=torch.long, device=d)),
                 ValueError, r"position_ids must have shape \[2 or 1, 5\]",
                 id="position-ids-shape"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), torch.ones(2, 5, 32, device=d,
                                                               requires_grad=True),
                                           torch.ones(2, 5, 32, device=d)),
                 ValueError, "cos requires grad.*cos.detach()", id="cos-requires-grad"),
    pytest.param(lambda d: speedlight.rope(*_qk(d), *_cs(d), interleaved=1), TypeError,
                 "interleaved must be a bool", id="interleaved-not-bool"),
    pytest.param(lambda d: speedlight.rope([1.0], *_qk(d)[1:], *_cs(d)), TypeError,
                 "q must be a torch.Tensor", id="q-not-tensor"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    assert_rejected(lambda: call(device), error, match)


def test_out_of_range_position_reads_nothing_and_gives_nan(device):
    """The launcher (no host check, as on a GPU) must not read past the cache."""
    cos, sin = cos_sin(torch.arange(8), 16, device=device)
    q = seeded((1, 3, 2, 16), device=device)
    k = seeded((1, 3, 1, 16), device=device, seed=1)
    pos = torch.tensor([[2, 8, -1]], device=device)
    q_rot, k_rot = op.rope_fwd(q, k, cos, sin, pos)
    assert torch.isnan(q_rot[0, 1:]).all() and torch.isnan(k_rot[0, 1:]).all()
    expected = reference.rope(q[:, :1], k[:, :1], cos, sin, pos[:, :1], unsqueeze_dim=2)
    torch.testing.assert_close(q_rot[:, :1], expected[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("broken,flags", [
    pytest.param(lambda kw: dict(kw, sin=-kw["sin"]), {}, id="rotates-the-wrong-way"),
    pytest.param(lambda kw: dict(kw, interleaved=not kw["interleaved"]), {"interleaved": True},
                 id="wrong-pairs"),
    pytest.param(lambda kw: dict(kw, position_ids=torch.zeros_like(kw["position_ids"])),
                 {"pos": True}, id="ignores-position-ids"),
])
def test_harness_fails_a_broken_rope(broken, flags, device):
    """The suite's inputs tell a wrong rotation from a right one."""
    import dataclasses
    from speedlight.verify import verify_case
    bad = dataclasses.replace(SPEC, impl=lambda **kw: reference.rope(**broken(kw)))
    r = verify_case(bad, case(2, 5, 4, 2, 32, 32, **flags), device)
    assert r.status == "fail", r.reason
