"""speedlight.patch(model, <kind>=<candidate>): another implementation than speedlight's
kernel, put in by the kind's own mechanism, runs (its calls counted), trains the model as
its own modules do, and unpatch restores the model exactly."""

from __future__ import annotations

import warnings

import pytest
import torch

from speedlight import candidates
from speedlight.patching import installs, unpatch
from speedlight.patching.patcher import apply_kinds, kinds
from tests.patching import tiny_models

OFF = {k: False for k in kinds()}


def _step(model, ids, labels):
    for p in model.parameters():
        p.grad = None
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out.loss.detach(), [p.grad for p in model.parameters()]


@pytest.fixture(scope="module")
def llama():
    model = tiny_models.build("llama")
    model.train()
    ids, labels = tiny_models.batch(tiny_models.vocab(model), batch=1, seq=8)
    return model, ids, labels, _step(model, ids, labels)


@pytest.fixture
def counted(monkeypatch):
    """Calls of every function candidates.adapt hands out, and of forced SDPA (the
    torch-compile candidate runs in tests/planning/test_plan.py, chosen by a plan)."""
    calls = {"adapted": 0, "forced_sdpa": 0}
    adapt = candidates.adapt

    def counting_adapt(*a, **k):
        fn, mutates = adapt(*a, **k)

        def fn_counted(*args, **kwargs):
            calls["adapted"] += 1
            return fn(*args, **kwargs)
        return fn_counted, mutates

    from speedlight.candidates import attention
    forced = attention.forced_sdpa

    def forced_counted(name):
        calls["forced_sdpa"] += 1
        return forced(name)
    monkeypatch.setattr(candidates, "adapt", counting_adapt)
    monkeypatch.setattr(attention, "forced_sdpa", forced_counted)
    return calls


@pytest.mark.parametrize("kind,name,counter", [
    pytest.param("rms_norm", "torch-fused", "adapted", id="rms_norm-F.rms_norm"),
    pytest.param("cross_entropy", "liger", "adapted", id="loss-liger"),
    pytest.param("linear_cross_entropy", "torch-fused", "adapted", id="fused-loss-F"),
    pytest.param("attention", "sdpa-math", "forced_sdpa", id="attention-sdpa-math"),
])
def test_a_candidate_runs_in_the_model_and_unpatch_restores_it(llama, counted, kind, name,
                                                               counter):
    if name == "liger":
        pytest.importorskip("liger_kernel")
    model, ids, labels, (loss0, grads0) = llama
    attn, loss_function = model.config._attn_implementation_internal, model.loss_function
    report = apply_kinds(model, plan=None, **(OFF | {kind: name}))
    try:
        assert report.patched[kind] and all(name in p for p in report.patched[kind]), report
        assert not report.not_patched, report
        loss, grads = _step(model, ids, labels)
        assert counted[counter] > 0, f"{name} never ran"
        torch.testing.assert_close(loss, loss0, atol=1e-5, rtol=1e-5)
        for g, g0 in zip(grads, grads0):
            torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    finally:
        unpatch(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.config._attn_implementation_internal == attn
    assert model.loss_function is loss_function
    loss, grads = _step(model, ids, labels)
    assert torch.equal(loss, loss0) and all(torch.equal(g, g0) for g, g0 in zip(grads, grads0))


def test_a_candidate_that_cannot_run_here_is_refused_with_the_reason(llama):
    model = llama[0]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        report = apply_kinds(model, plan=None, **(OFF | {"attention": "sdpa-cudnn"}))
    unpatch(model)
    assert "attention" not in report.patched
    assert report.not_patched == [("attention (sdpa-cudnn)", "SDPA's cudnn backend runs on CUDA "
                                                             "GPUs")]


@pytest.mark.parametrize("kind,value", [("rms_norm", "nope"), ("decoder_layer", "liger"),
                                        ("attention", "torch-fused"), ("mlp", 2)])
def test_a_kind_s_keyword_takes_only_its_candidates(llama, kind, value):
    with pytest.raises(ValueError, match=f"{kind} must be True, False.* got {value!r}"):
        apply_kinds(llama[0], plan=None, **{kind: value})
    assert not hasattr(llama[0], "_speedlight_patch")


def test_speedlight_s_other_implementations_are_names_too():
    assert "speedlight-cuda" in installs.names_for("rms_norm")
    assert installs.chosen("rms_norm", "model") is None
    assert installs.chosen("mlp", "fused") == candidates.SPEEDLIGHT
