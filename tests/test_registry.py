from pathlib import Path

import pytest

from speedlight import registry

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "relu_squared.py"


def test_builtin_specs_are_complete():
    specs = registry.builtin_specs()
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    assert {"rms_norm", "softmax"} <= set(names)
    for s in specs:
        for suite in ("quick", "model", "full"):
            cases = s.cases(suite)
            assert cases, f"{s.name} has an empty {suite} suite"
            for c in cases[:50]:
                fwd = s.cost(c, "fwd")
                assert fwd.bytes >= 0 and fwd.flops >= 0
        assert len({c.id for c in s.cases("quick")}) == len(s.cases("quick")), "duplicate cases"


def test_user_spec_file_loads_and_verifies(device):
    from speedlight.verify import verify_case
    (spec,) = registry.load_spec_file(EXAMPLE)
    assert spec.name == "relu_squared"
    for case in spec.cases("quick")[:3]:
        r = verify_case(spec, case, device)
        assert r.status == "pass", r.reason


def test_select_filters_and_names_unknown_ops():
    assert [s.name for s in registry.select(["softmax"])] == ["softmax"]
    with pytest.raises(ValueError, match="unknown op.*nope.*known: rms_norm"):
        registry.select(["nope"])
    only = registry.select(None, [EXAMPLE], include_builtin=False)
    assert [s.name for s in only] == ["relu_squared"]


def test_bad_spec_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        registry.load_spec_file(tmp_path / "missing.py")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ValueError, match="defines no SPEC"):
        registry.load_spec_file(empty)


def test_the_registry_is_the_one_list_of_ops():
    """The package's exports, the patcher's kinds, profile's advice and bench's Liger
    baselines all come from registry.BUILTIN_OPS and the OpSpecs."""
    import inspect

    import speedlight
    from speedlight.patching import patcher
    from speedlight.profile import advice

    specs = registry.builtin_specs()
    assert [s.name for s in specs] == list(registry.BUILTIN_OPS)
    for s in specs:
        assert getattr(speedlight, s.name).__module__ == f"speedlight.ops.{s.name}"
        assert s.fuses and advice.describe_op(s.name) == (s.fuses, "available")
    assert set(registry.BUILTIN_OPS) <= set(speedlight.__all__)
    # norm_in_place is an option of the rms_norm kind and plan chooses among the kinds:
    # neither is a kind
    assert set(patcher.kinds()) == set(inspect.signature(patcher.apply_kinds).parameters) - {
        "model", "norm_in_place", "plan"}
    # the chain once planned as fused_linear_cross_entropy is the op linear_cross_entropy
    assert advice.describe_op("linear_cross_entropy")[1] == "available"
    with pytest.raises(ValueError, match="unknown op 'nope'; known: rms_norm"):
        registry.builtin_spec("nope")
