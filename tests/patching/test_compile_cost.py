"""Compiling a patched model costs no more than about 1.5x compiling the model unpatched.

Measured as the CPU time (this process and the compiler's child processes) that the first
compiled training step takes beyond a second, steady one: dynamo's trace, AOT autograd,
inductor's lowering and the C++ build of its kernels. CPU time, not wall time, so the
ratio holds on a machine whose other core is busy with other tests. Inductor's caches are
off so both compiles start cold, and the patched model compiles first, after an unrelated
warm-up compile has loaded the compiler: an order that favours the unpatched model.
"""

import resource
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds
from tests.patching.tiny_models import batch, build, vocab

LIMIT = 1.5


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _compile_seconds(model) -> float:
    """CPU seconds of the first compiled forward+backward, less a steady step's."""
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    ids, labels = batch(vocab(model))

    def step():
        start = _cpu_seconds()
        compiled(input_ids=ids, labels=labels).loss.backward()
        return _cpu_seconds() - start

    first = step()
    return first - step()


def _warm_up():
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    torch._dynamo.reset()
    torch.compile(layer, fullgraph=True)(torch.randn(2, 8, requires_grad=True)).sum().backward()


@pytest.mark.xdist_group("compile-cost")
def test_compiling_the_patched_model_costs_at_most_1_5x_the_original(monkeypatch):
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor, "fx_graph_cache", False)
    monkeypatch.setattr(inductor, "compile_threads", 1)
    _warm_up()
    model = build("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        apply_kinds(model)
    patched = _compile_seconds(model)
    original = _compile_seconds(build("llama"))
    torch._dynamo.reset()
    assert original > 0.5, f"the unpatched compile took {original:.2f} CPU s: nothing was compiled"
    assert patched <= LIMIT * original, (
        f"compiling the patched model took {patched:.1f} CPU s, "
        f"{patched / original:.2f}x the original's {original:.1f} s (limit {LIMIT}x)")
