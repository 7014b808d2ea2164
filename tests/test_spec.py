import math

import re

import pytest
import torch

from speedlight.spec import (TOLERANCES, Case, Cost, OpSpec, dtype_name, inject_nonfinite,
                             parse_dtype, rand_tensor)


def test_case_id_is_readable():
    c = Case("rms_norm", {"rows": 4096, "hidden": 4096}, dtype=torch.bfloat16, layout="strided")
    assert c.id == "rms_norm-rows4096-hidden4096-bf16-strided"
    assert c.label == "rows4096-hidden4096-strided"
    assert c["hidden"] == 4096
    assert c.with_(dtype=torch.float16).id == "rms_norm-rows4096-hidden4096-fp16-strided"


def test_case_flags_in_id():
    c = Case("attn", {"seq": 7}, flags={"causal": True, "weight": False, "offset": 1})
    assert c.id == "attn-seq7-fp32-causal-noweight-offset1"
    assert c.flag("causal") is True and c.flag("missing", 3) == 3


def test_case_is_hashable_and_rejects_unknown_layout():
    assert len({Case("a", {"n": 1}), Case("a", {"n": 1})}) == 1
    with pytest.raises(ValueError, match="layout"):
        Case("a", {"n": 1}, layout="diagonal")
    with pytest.raises(KeyError, match="no shape parameter"):
        Case("a", {"n": 1})["m"]


def test_cost_adds_and_reports_intensity():
    c = Cost(flops=100, bytes=50) + Cost(flops=20, bytes=10)
    assert (c.flops, c.bytes) == (120, 60)
    assert c.intensity == 2.0
    assert math.isinf(Cost(1, 0).intensity)


def test_tolerance_table_covers_every_dtype_and_is_ordered():
    f32, f16, bf16 = (TOLERANCES[d] for d in (torch.float32, torch.float16, torch.bfloat16))
    assert f32.floor < f16.floor < bf16.floor
    assert f32.ceiling < f16.ceiling < bf16.ceiling
    assert all(t.k > 1 for t in TOLERANCES.values())


def test_dtype_names_round_trip():
    for name in ("fp32", "fp16", "bf16"):
        assert dtype_name(parse_dtype(name)) == name
    assert parse_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("fp7")


def test_rand_tensor_layouts():
    c = Case("op", {"n": 5}, dtype=torch.float16, seed=3)
    a = rand_tensor((4, 5), c, "cpu")
    assert a.is_contiguous() and a.dtype == torch.float16
    assert torch.equal(a, rand_tensor((4, 5), c, "cpu")), "same case, same tensor"
    assert not torch.equal(a, rand_tensor((4, 5), c.with_(seed=4), "cpu"))
    s = rand_tensor((4, 5), c.with_(layout="strided"), "cpu")
    assert s.shape == (4, 5) and s.stride(0) > 5 and s.stride(1) == 1
    base = s.as_strided((4, s.stride(0)), (s.stride(0), 1))
    assert torch.isnan(base[:, 5:]).all(), "the padding past each row is NaN"
    t = rand_tensor((4, 5), c.with_(layout="transposed"), "cpu")
    assert t.shape == (4, 5) and t.stride(-1) != 1
    assert not torch.isnan(t).any()


def test_inject_nonfinite_places_nan_and_infs():
    c = Case("op", {"n": 50})
    x = inject_nonfinite(torch.zeros(10, 50), c)
    assert torch.isnan(x).sum() >= 1 and torch.isinf(x).sum() >= 1


def _unused(*args):
    raise AssertionError("not called by these tests")


@pytest.mark.parametrize("field,value,want", [
    ("suites", ["quick"], "suites must be a dict of suite name -> function"),
    ("grad_inputs", "x", "grad_inputs must be a tuple of argument names, got 'x'"),
    ("dtypes", ["fp32"], "dtypes must be a non-empty tuple of torch dtypes"),
    ("cost", 3, "cost must be a function"),
    ("family", None, "family must be a str"),
    ("kernels", {"_k": "fast"}, "kernels must be a dict of kernel name -> KernelDesign"),
    ("peers", ["liger"], "peers must be a dict"),
])
def test_opspec_refuses_a_wrongly_typed_field_naming_it(field, value, want):
    kwargs = dict(impl=lambda: None, reference=lambda: None, make_inputs=_unused,
                  cost=_unused, suites={"quick": lambda: []})
    with pytest.raises(TypeError, match=rf"OpSpec 'op': {re.escape(want)}"):
        OpSpec("op", **{**kwargs, field: value})


def test_opspec_rejects_unknown_suite():
    spec = OpSpec("op", impl=lambda: None, reference=lambda: None, make_inputs=_unused,
                  cost=_unused, suites={"quick": lambda: []})
    with pytest.raises(ValueError, match="no suite 'full'"):
        spec.cases("full")


def test_opspec_name_and_reference_default_to_the_public_function_and_its_reference():
    from speedlight import reference

    spec = OpSpec("softmax", impl=lambda: None, make_inputs=_unused, cost=_unused, suites={})
    assert spec.reference is reference.softmax

    def softmax():
        pass

    named = OpSpec(impl=softmax, make_inputs=_unused, cost=_unused, suites={})
    assert named.name == "softmax" and named.reference is reference.softmax
    with pytest.raises(TypeError, match="needs impl"):
        OpSpec("softmax", make_inputs=_unused, cost=_unused, suites={})
    with pytest.raises(TypeError, match="OpSpec 'my_op' has no reference"):
        OpSpec("my_op", impl=lambda: None, make_inputs=_unused, cost=_unused, suites={})


def test_kernel_designs_default_to_the_generic_design():
    from speedlight.spec import KernelDesign

    spec = OpSpec("op", impl=lambda: None, reference=lambda: None, make_inputs=_unused,
                  cost=_unused, suites={"quick": lambda: []},
                  kernels={"_k": KernelDesign(min_occupancy=0.5, bytes_ratio=1.5, why="two passes")})
    assert spec.design("_k").min_occupancy == 0.5 and spec.design("_k").why == "two passes"
    generic = spec.design("_other")
    assert generic == KernelDesign() and generic.vector_bits == 128 and not generic.spills


def test_aligned_rows_and_rows_default_to_the_first_parameter_and_widths():
    def spec(**hooks):
        return OpSpec("op", impl=lambda: None, reference=lambda: None, make_inputs=_unused,
                      cost=_unused, suites={"quick": lambda: []}, **hooks)

    aligned, odd = Case("op", {"rows": 37, "hidden": 4096}), Case("op", {"rows": 8, "hidden": 1000})
    plain = spec()
    assert plain.rows(aligned) == 37
    assert plain.aligned_rows(aligned) and not plain.aligned_rows(odd)
    assert not plain.aligned_rows(aligned.with_(layout="strided"))
    tokens = Case("op", {"batch": 2, "seq": 5, "dim": 24})
    own = spec(aligned=lambda c: c["dim"] % 8 == 0, count_rows=lambda c: c["batch"] * c["seq"])
    assert own.rows(tokens) == 10 and own.aligned_rows(tokens) and not plain.aligned_rows(tokens)
