"""The contract every registered op keeps, checked from its OpSpec alone.

Forward and backward against float64 on the quick suite in every dtype (through the verify
harness); NaN and Inf where the reference has them; empty input launches nothing; bad input
is named before any launch; torch.compile traces it whole; a CPU tensor without the
interpreter says how to get one; on a GPU, 64-bit offsets past 2^31 elements. A new op is
covered by registering it; tests/ops/test_<op>.py keeps only what is particular to it.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from speedlight.spec import grad_leaves, inject_nonfinite
from speedlight.verify.harness import LaunchCounter, poisoned_allocations, verify_case
from tests import compile_equal
from tests.conftest import needs_gpu
from tests.helpers import assert_verified
from tests.ops.contract import as_tuple, by_op, example, is_empty, quick_cases, tensors


@pytest.mark.parametrize("spec,case", quick_cases())
def test_quick_suite_matches_float64(spec, case, device):
    assert_verified(spec, case, device)


@pytest.mark.parametrize("spec", by_op())
def test_empty_input_launches_nothing(spec, device):
    empty = [c for c in spec.cases("quick") if is_empty(spec, c)]
    assert empty, f"{spec.name}'s quick suite has no case with an empty input"
    for case in empty:
        r = verify_case(spec, case, device)
        assert r.status == "pass", f"{case.id}: {r.status}: {r.reason}"
        assert [c.name for c in r.checks if c.name == "no_launch"], "launches were not counted"
        assert r.launches == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec", by_op())
def test_nonfinite_positions_match(spec, dtype, device):
    """NaN, +Inf and -Inf in the op's first differentiable input sit where float64 puts
    them, in every output and gradient."""
    first = spec.grad_inputs[0]

    def with_nonfinite(case, dev):
        inputs = spec.make_inputs(case, dev)
        inject_nonfinite(inputs[first], case)
        return inputs

    poisoned = dataclasses.replace(spec, make_inputs=with_nonfinite)
    assert_verified(poisoned, example(spec, dtype), device)


def _names(name: str) -> re.Pattern:
    return re.compile(rf"\b{re.escape(name)}\b")


def bad_inputs(spec, device) -> list[tuple[str, str, dict]]:
    """(argument, what is wrong, inputs) for each tensor argument of the op's example: a
    list in its place, the wrong dtype, another device."""
    good = spec.make_inputs(example(spec), device)
    out = []
    for name, t in tensors(good).items():
        wrong_dtype = torch.int32 if t.is_floating_point() else torch.float32
        out.append((name, "a list", dict(good, **{name: t.tolist()})))
        out.append((name, str(wrong_dtype), dict(good, **{name: t.to(wrong_dtype)})))
        if len(tensors(good)) > 1:
            out.append((name, "on meta", dict(good, **{name: t.to("meta")})))
    return out


@pytest.mark.parametrize("spec", by_op())
def test_bad_input_is_named_before_any_launch(spec, device):
    for name, what, inputs in bad_inputs(spec, device):
        counter = LaunchCounter()
        with counter.active(), pytest.raises((TypeError, ValueError)) as info:
            spec.impl(**inputs)
        assert _names(name).search(str(info.value)), \
            f"{spec.name}: {name} as {what} raised {info.value!r}, which does not name {name}"
        assert counter.count == 0, f"{spec.name}: {name} as {what} launched {counter.kernels}"


def _outputs_and_grads(spec, fn, inputs):
    leaves, names = grad_leaves(inputs, spec.grad_inputs)
    outs = [o for o in as_tuple(fn(**leaves)) if isinstance(o, torch.Tensor)]
    loss = sum(o.float().pow(2).sum() for o in outs if o.requires_grad)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("spec", by_op())
def test_torch_compile_fullgraph(spec, backend, device):
    """The op traced whole between two other ops, forward and backward, matches eager, and
    the graphs handed the compiler hold its custom ops (a built-in op's: those of
    tests/compile_equal.py's contract-<op> scenario)."""
    torch._dynamo.reset()
    first = spec.grad_inputs[0]

    def block(**inputs):
        inputs[first] = inputs[first] * 2.0
        return tuple(o + 1.0 if o.is_floating_point() else o
                     for o in as_tuple(spec.impl(**inputs)))

    inputs = spec.make_inputs(example(spec), device)
    held: set[str] = set()
    compiled = torch.compile(block, fullgraph=True,
                             backend=compile_equal.recording_backend(backend, held))
    got, got_grads = _outputs_and_grads(spec, compiled, inputs)
    want, want_grads = _outputs_and_grads(spec, block, inputs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grads, want_grads)
    missing = compile_equal.HOLDS.get(f"contract-{spec.name}", set()) - held
    assert not missing, f"the compiled graphs held {sorted(held)}, not {sorted(missing)}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU user gets")
@pytest.mark.parametrize("spec", by_op())
def test_cpu_tensor_without_interpreter_says_how_to_enable_it(spec, monkeypatch):
    import speedlight.runtime as common

    monkeypatch.setattr(common, "is_interpreted", lambda kernel: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        spec.impl(**spec.make_inputs(example(spec), torch.device("cpu")))


@pytest.mark.parametrize("spec", by_op())
def test_full_suite_has_a_case_past_2_to_the_31_elements(spec):
    huge = [c for c in spec.cases("full") if c.flag("huge")]
    assert huge, f"{spec.name}'s full suite flags no case `huge` (a tensor past 2^31 elements)"
    for case in huge:
        moved = spec.cost(case, "fwd").bytes // case.dtype.itemsize
        assert moved > 2 ** 31, f"{case.id} moves {moved} elements, not past 2^31"


@needs_gpu("tensors past 2^31 elements need > 4 GiB each and hours under the CPU interpreter")
@pytest.mark.parametrize("spec", by_op())
def test_64bit_indexing(spec, device):
    """The op's `huge` cases in bf16, forward and backward, against the reference in float32
    (float64 would not fit beside them): every element, the last ones past 2^31 included,
    within the bf16 ceiling of the largest reference value, and NaN where it is NaN."""
    ceiling = spec.tolerance(torch.bfloat16).ceiling
    for case in [c.with_(dtype=torch.bfloat16) for c in spec.cases("full") if c.flag("huge")]:
        inputs = spec.make_inputs(case, device)
        inputs32 = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point()
                    else v for k, v in inputs.items()}
        with poisoned_allocations():
            ours = _outputs_and_grads(spec, spec.impl, inputs)
        ref = _outputs_and_grads(spec, spec.reference, inputs32)
        pairs = list(zip(ours[0], ref[0])) + list(zip(ours[1], ref[1]))
        for i, (o, r) in enumerate(pairs):
            if r is None:
                continue
            assert torch.equal(torch.isnan(o), torch.isnan(r)), f"{case.id} #{i}: NaN positions"
            err = (o.float() - r).abs().nan_to_num(0.0).max().item()
            scale = r.abs().nan_to_num(0.0).max().item()
            assert err <= ceiling * scale, f"{case.id} #{i}: max abs error {err} of {scale}"
        del inputs, inputs32, ours, ref, pairs
        torch.cuda.empty_cache()
