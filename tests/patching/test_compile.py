"""A patched model compiles whole: torch.compile(fullgraph=True) traces it in one graph
with no break, for every family, in every form of input (plain rows, a 2-D padding mask,
sequences packed in one row), counted with torch._dynamo's own counters; forward and backward through AOT autograd
(backend "aot_eager", the graphs torch.compile hands inductor) for one family of each form
of patched forward, against the eager patched model; and a training step reads nothing on
the host."""

import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds
from tests import compile_equal
from tests.patching.tiny_models import (FAMILIES, NEW_FAMILIES, assert_same_gradients, batch, build,
                                        vocab)

TOL = dict(rtol=2e-4, atol=2e-5)
COMPILED = FAMILIES + NEW_FAMILIES
# one family per form of patched forward: Llama (pre-norm layer, split MLP, plain loss),
# Gemma 2 (sandwich layer, GeGLU, sliding window and softcaps), Phi-3 (gate_up_proj MLP,
# fused to one gated GEMM, and the loss from the logits: compile_equal.MODEL_KINDS),
# Granite (its layer kept, logits scaling), GLM-4 (interleaved RoPE), Qwen2-VL (multimodal
# RoPE, its own output class), Falcon-H1 (attention beside a Mamba mixer, multipliers);
# a mixture of experts' forward and backward: tests/patching/test_experts.py
TRACED = ["llama", "gemma2", "phi3", "granite", "glm4", "qwen2_vl", "falcon_h1"]
FORMS = ("rows", "padded", "packed")


def patched(family: str):
    model = build(family)
    with warnings.catch_warnings():  # the families that keep their layer say so
        warnings.simplefilter("ignore", PatchWarning)
        apply_kinds(model, **compile_equal.MODEL_KINDS.get(family, {}))
    return model


def inputs(model, form: str) -> dict:
    """A training call: two rows; two rows with right and left padding; or three
    sequences packed in one row, with the lengths a packing collator passes."""
    ids, labels = batch(vocab(model))
    if form == "rows":
        return dict(input_ids=ids, labels=labels)
    if form == "padded":
        mask = torch.ones_like(ids)
        mask[0, 8:] = 0
        mask[1, :2] = 0
        return dict(input_ids=ids, attention_mask=mask, labels=labels.masked_fill(mask == 0, -100))
    lengths = [7, 4, 11]
    cu = torch.tensor([0, 7, 11, 22], dtype=torch.int32)
    return dict(input_ids=ids.reshape(1, -1), labels=labels.reshape(1, -1),
                position_ids=torch.cat([torch.arange(n) for n in lengths])[None],
                cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths),
                max_length_k=max(lengths))


def _assert_one_graph_per_form(family: str, backend, backward: bool):
    """The patched model of `family`, compiled with fullgraph=True and `backend`, run on
    every form: asserts dynamo counted one graph per form and no break; the model, and
    each form's loss and gradients."""
    from torch._dynamo.utils import counters

    model = patched(family)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch._dynamo.reset()
    counters.clear()
    results = []
    for form in FORMS:
        out = compiled(**inputs(model, form))
        grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True) \
            if backward else ()
        results.append((out.loss.detach(), grads))
    graphs, breaks = counters["stats"]["unique_graphs"], dict(counters["graph_break"])
    assert breaks == {} and graphs == len(FORMS), (graphs, breaks)
    return model, results


# the TRACED families are traced (one graph per form, no break) by the test after this one,
# which compiles them forward and backward too
@pytest.mark.parametrize("family", [f for f in COMPILED if f not in TRACED])
def test_dynamo_traces_every_family_in_one_graph_per_form(family):
    _assert_one_graph_per_form(family, "eager", backward=False)


@pytest.mark.parametrize("family", TRACED)
def test_forward_and_backward_compile_whole_and_match_eager(family):
    """...and the graphs AOT autograd compiles hold speedlight's custom ops: those of
    compile_equal's scenario of the family (llama, phi3), any for the others."""
    held: set[str] = set()
    model, ours = _assert_one_graph_per_form(
        family, compile_equal.recording_backend("aot_eager", held), backward=True)
    missing = compile_equal.HOLDS.get(f"{family}-train", set()) - held
    assert held and not missing, f"the compiled graphs held {sorted(held)}, not {sorted(missing)}"
    torch._dynamo.reset()
    for form, (loss, grads) in zip(FORMS, ours):
        out = model(**inputs(model, form))
        expected = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
        torch.testing.assert_close(loss, out.loss.detach(), **TOL, msg=lambda m: f"{form}: {m}")
        assert_same_gradients(model, grads, expected, TOL, where=f"{form} ")


class _HostRead(Exception):
    pass


@pytest.mark.parametrize("family,form", [("llama", f) for f in FORMS] + [
    pytest.param("qwen3_moe", "padded", id="qwen3_moe-padded")])
def test_a_training_step_reads_nothing_on_the_host(family, form, monkeypatch):
    """Tensor.item, tolist, nonzero, .cpu() and int/float of a tensor raise during a
    patched forward and backward (a host sync on a GPU, and a graph break or an
    uncapturable CUDA graph under torch.compile); a mixture of experts' routed experts
    (moe_experts) included."""
    model = patched(family)
    args = inputs(model, form)

    def refuse(name):
        def read(*_, **__):
            raise _HostRead(f"{name} read a tensor on the host")
        return read

    for name in ("item", "tolist", "nonzero", "cpu", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
    monkeypatch.setattr(torch, "nonzero", refuse("torch.nonzero"))
    out = model(**args)
    out.loss.backward()
    monkeypatch.undo()
    assert torch.isfinite(out.loss) and all(
        p.grad is not None for p in model.parameters() if p.requires_grad)
