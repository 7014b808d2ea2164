"""The one list of candidates: bench's baselines are drawn from it, each name adapts the
same way for bench and patch, torch's own F.rms_norm computes the reference's RMSNorm."""

from __future__ import annotations

import pytest
import torch

from speedlight import candidates, registry
from speedlight.bench import baselines
from speedlight.spec import Case


def test_bench_s_baselines_are_the_candidates_bar_speedlight_and_the_model():
    from speedlight.bench import gemm_baselines

    named = set(candidates.BY_NAME) - {candidates.SPEEDLIGHT, candidates.MODEL}
    assert set(baselines.KNOWN) == named | set(gemm_baselines.NAMES)
    assert len(candidates.BY_NAME) == len(candidates.CANDIDATES)
    assert "sdpa-math" in baselines.KNOWN and "sdpa-math" not in baselines.BASELINES


def test_every_kind_patch_knows_has_speedlight_and_the_model_among_its_candidates():
    from speedlight.patching.patcher import kinds

    for kind in kinds():
        assert {candidates.SPEEDLIGHT, candidates.MODEL} <= set(candidates.for_kind(kind))
    assert candidates.for_kind("attention")[2:] == (*candidates.SDPA, candidates.FLEX,
                                                    candidates.FLASH_ATTN)
    with pytest.raises(ValueError, match="unknown candidate 'nope'"):
        candidates.adapt("nope", registry.builtin_spec("rms_norm"), None, {}, "cpu")


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["llama", "gemma"])
def test_torch_fused_rms_norm_matches_the_reference(offset):
    spec = registry.builtin_spec("rms_norm")
    x = torch.randn(3, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(8, dtype=torch.bfloat16, requires_grad=True)
    inputs = {"x": x, "weight": w, "eps": 1e-6, "offset": offset}
    fn, mutates = candidates.adapt(candidates.TORCH_FUSED, spec, Case("rms_norm", {}), inputs,
                                   "cpu")
    assert not mutates
    got, want = fn(**inputs), spec.reference(**inputs)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    g = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, (x, w), g)
    want_grads = torch.autograd.grad(want, (x, w), g)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_a_candidate_that_has_no_form_of_the_case_says_why():
    spec = registry.builtin_spec("cross_entropy")
    with pytest.raises(candidates.Unsupported, match="no fused function of cross_entropy"):
        candidates.adapt(candidates.TORCH_FUSED, spec, None, {}, "cpu")
    with pytest.raises(candidates.Unsupported, match="not attention"):
        candidates.adapt("sdpa-math", spec, None, {}, "cpu")
    with pytest.raises(candidates.Unsupported, match="built by its caller"):
        candidates.adapt(candidates.MODEL, spec, None, {}, "cpu")
