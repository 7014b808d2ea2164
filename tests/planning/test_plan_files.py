"""Plan files, fuzzed: every reader checks a plan whole. One fixed list of damaged plan
files (not UTF-8, not JSON, a list or a string where an object belongs, missing and
unknown fields, misspelt kinds and verdicts, NaN...); each must be refused by load_plan
with a PlanError (a ValueError) naming the file and what is wrong, ignored with a
PlanWarning by the cache (so patch(plan="auto") never fails because of one), and refused
by patch(plan=path) with that one error."""

from __future__ import annotations

import json
import types
import warnings

import pytest
import torch

from speedlight import plans


def _model(**config) -> torch.nn.Module:
    """A stand-in model: what a plan's identity reads (a config, a parameter), nothing more."""
    m = torch.nn.Linear(2, 2)
    m.config = types.SimpleNamespace(**({"model_type": "llama", "hidden_size": 8} | config))
    return m


def _doc(model, gpu: str = "NVIDIA H200") -> dict:
    key = dict(plans.key_for(model, batch=2, seq=128, compile_mode=None), gpu=gpu)
    d = {"mlp": plans.Decision("mlp", "dropped", "slower with confidence", ratio=1.1,
                               low=1.05, high=1.15, ours_s=2.2e-3, theirs_s=2e-3,
                               verified=True, module="model.layers.0.mlp"),
         "rms_norm": plans.Decision("rms_norm", "kept", "faster", ratio=0.9, low=0.85,
                                    high=0.95, ours_peak=1 << 20, theirs_peak=1 << 20)}
    return plans.Plan(key, d, True, "timed", created="2026-01-01T00:00:00+00:00").to_json()


def _set(path: str, value):
    """A mutation setting the field at a dotted path (None deletes it)."""
    def mutate(doc):
        *parents, last = path.split(".")
        for p in parents:
            doc = doc[p]
        if value is _DELETE:
            del doc[last]
        else:
            doc[last] = value
    return mutate


_DELETE = object()


def _rename_kind(new: str):
    def mutate(doc):
        doc["decisions"][new] = doc["decisions"].pop("mlp")
        doc["decisions"][new]["kind"] = new
    return mutate


def damaged(id: str, mutate, *named: str):
    """A case: how the file is damaged (a function of the document, or the file's bytes),
    and what the message must name."""
    return pytest.param(mutate, named, id=id)


DAMAGED = [
    damaged("not-utf8", b"\xff\xfe{\x00}", "not UTF-8"),
    damaged("not-json", b'{"schema": 1,', "not JSON", "line 1"),
    damaged("empty-file", b"", "not JSON"),
    damaged("a-list", b"[]", "the document is a list"),
    damaged("a-string", b'"plan"', "the document is a string"),
    damaged("schema-missing", _set("schema", _DELETE), "schema is null"),
    damaged("schema-older", _set("schema", 0), "schema is a number 0", "reads schema"),
    damaged("schema-a-string", _set("schema", "1"), "schema is a string"),
    damaged("key-missing", _set("key", _DELETE), "has no 'key'"),
    damaged("key-a-list", _set("key", []), "key is a list"),
    damaged("key-gpu-missing", _set("key.gpu", _DELETE), "key: has no 'gpu'"),
    damaged("key-batch-zero", _set("key.batch", 0), "key: batch is 0"),
    damaged("key-batch-a-string", _set("key.batch", "2"), "key: batch is a string"),
    damaged("key-unknown-field", _set("key.sm", 90), "key: has unknown field(s) 'sm'"),
    damaged("decisions-a-list", _set("decisions", []), "decisions is a list"),
    damaged("decisions-empty", _set("decisions", {}), "decisions is empty"),
    damaged("decision-a-string", _set("decisions.mlp", "kept"), "decisions: mlp is a string"),
    damaged("decision-a-list", _set("decisions.mlp", ["kept"]), "decisions: mlp is a list"),
    damaged("decision-null", _set("decisions.mlp", None), "decisions: mlp is null"),
    damaged("kind-misspelt", _rename_kind("rms_nrom"), "'rms_nrom'", "did you mean 'rms_norm'"),
    damaged("kind-unknown", _rename_kind("flash"), "unknown kind 'flash'"),
    damaged("kind-not-its-key", _set("decisions.mlp.kind", "rope"), "its kind is 'rope'"),
    damaged("verdict-misspelt", _set("decisions.mlp.verdict", "kep"), "verdict is 'kep'"),
    damaged("verdict-missing", _set("decisions.mlp.verdict", _DELETE), "has no 'verdict'"),
    damaged("purpose-unknown", _set("decisions.mlp.purpose", "speed"), "purpose is 'speed'"),
    damaged("ratio-a-string", _set("decisions.mlp.ratio", "1.1"), "ratio is a string"),
    damaged("a-nan", b"NaN", "the document is a number nan"),
    damaged("ratio-bool", _set("decisions.mlp.ratio", True), "ratio is true"),
    damaged("peak-a-float", _set("decisions.rms_norm.ours_peak", 1.5), "ours_peak is a number"),
    damaged("verified-a-string", _set("decisions.mlp.verified", "yes"), "verified is a string"),
    damaged("decision-unknown-field", _set("decisions.mlp.speedup", 2),
            "unknown field(s) 'speedup'"),
    damaged("timed-a-string", _set("timed", "yes"), "timed is a string"),
    damaged("top-unknown-field", _set("plans", []), "unknown field(s) 'plans'"),
    damaged("projected-a-list", _set("projected", []), "projected is a list"),
]


def _write(path, model, mutate) -> None:
    if isinstance(mutate, bytes):
        path.write_bytes(mutate)
        return
    doc = _doc(model)
    mutate(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("mutate,named", DAMAGED)
def test_a_damaged_plan_file_is_refused_naming_the_file_and_what_is_wrong(mutate, named, tmp_path):
    model = _model()
    path = tmp_path / "p.json"
    _write(path, model, mutate)
    with pytest.raises(plans.PlanError) as e:
        plans.load_plan(path)
    text = str(e.value)
    assert isinstance(e.value, ValueError) and "\n" not in text
    assert text.startswith(f"plan file {str(path)!r}: ")
    for part in named:
        assert part in text, text


def test_a_nan_ratio_is_refused():
    doc = _doc(_model())
    doc["decisions"]["mlp"]["ratio"] = float("nan")
    with pytest.raises(plans.PlanError, match="ratio is a number nan, expected a number or null"):
        plans.Plan.from_json(json.loads(json.dumps(doc)))


def test_the_plan_s_kinds_are_patch_s():
    from speedlight.patching.patcher import kinds
    assert plans.KINDS == kinds()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    plans.folder().mkdir(parents=True)
    return plans.folder()


def test_the_cache_ignores_every_damaged_file_with_a_warning_and_finds_the_good_one(cache):
    model = _model()
    for i, p in enumerate(DAMAGED):
        _write(cache / f"bad-{i:02d}.json", model, p.values[0])
    (cache / "folder.json").mkdir()  # a folder named like a plan
    good = plans.Plan.from_json(dict(_doc(model), key=dict(_doc(model)["key"], gpu="cpu")))
    plans.save(good)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        found = plans.cached(model)
    assert found is not None and found.key == good.key
    named = [str(w.message) for w in got if w.category is plans.PlanWarning]
    assert len(named) == len(DAMAGED) + 1
    assert all(m.startswith("speedlight: ignoring plan file ") for m in named)
    assert any("folder.json" in m and "cannot be read" in m for m in named)


def test_a_stale_plan_of_this_model_is_named_one_of_another_model_is_not(cache):
    model = _model()
    other_versions = dict(_doc(model)["key"]["versions"], torch="0.0.1")
    plans.save(plans.Plan.from_json(dict(_doc(model), key=dict(
        _doc(model)["key"], gpu="cpu", versions=other_versions))))
    plans.save(plans.Plan.from_json(_doc(_model(hidden_size=16))))  # another model's plan
    with pytest.warns(plans.PlanWarning) as got:
        assert plans.cached(model) is None
    text, = [str(w.message) for w in got]
    assert "do not apply here" in text and "versions" in text and "0.0.1" in text


def test_patch_s_default_path_never_fails_because_of_the_cache(cache, monkeypatch):
    """speedlight.patch(model) (plan="auto") on a GPU reads the cache: a cache of damaged
    files gives warnings and the hint, and patch goes on."""
    import speedlight
    from speedlight.patching import planned, unpatch

    monkeypatch.setattr(planned, "_on_gpu", lambda model: True)
    model = _model()
    for i, p in enumerate(DAMAGED):
        _write(cache / f"bad-{i:02d}.json", model, p.values[0])
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        report = speedlight.patch(model)
    unpatch(model)
    assert report.plan_note.startswith(plans.HINT)
    assert sum(w.category is plans.PlanWarning for w in got) == len(DAMAGED)


@pytest.mark.parametrize("mutate,named", [p for p in DAMAGED if p.id in (
    "not-utf8", "decisions-a-list", "kind-misspelt")])
def test_patch_with_a_damaged_plan_file_raises_one_error_naming_it(mutate, named, tmp_path):
    import speedlight

    model = _model()
    path = tmp_path / "p.json"
    _write(path, model, mutate)
    with pytest.raises(ValueError, match=f"plan file {str(path)!r}: .*{named[0]}"):
        speedlight.patch(model, plan=str(path))
    assert not hasattr(model, "_speedlight_patch")  # nothing was patched


def test_patch_with_a_damaged_plan_dict_or_a_plan_of_another_gpu(tmp_path):
    import speedlight
    from speedlight.patching import unpatch

    model = _model()
    doc = _doc(model)
    doc["decisions"] = []
    with pytest.raises(ValueError, match=r"plan \(a plan's JSON dict\): decisions is a list"):
        speedlight.patch(model, plan=doc)
    with pytest.warns(plans.PlanWarning, match="not for this model here .*gpu 'NVIDIA H200'"):
        report = speedlight.patch(model, plan=_doc(model))
    unpatch(model)
    assert "not used" in report.plan_note


@pytest.mark.parametrize("call,error,named", [
    pytest.param({"example_inputs": "the cat sat"}, TypeError, "example_inputs must be",
                 id="inputs-a-string"),
    pytest.param({"example_inputs": {1: torch.zeros(1)}}, TypeError, "str keys",
                 id="inputs-dict-keys"),
    pytest.param({"kinds": ["rms_nrom"]}, ValueError, "unknown 'rms_nrom'", id="kind-misspelt"),
    pytest.param({"kinds": "mlp"}, TypeError, "kinds must be a list", id="kinds-a-string"),
    pytest.param({"kinds": []}, ValueError, "kinds is empty", id="kinds-empty"),
])
def test_speedlight_plan_refuses_what_it_cannot_plan(call, error, named):
    import speedlight

    call = {"example_inputs": torch.zeros(1, 4, dtype=torch.long)} | call
    with pytest.raises(error, match=named):
        speedlight.plan(_model(), save=False, **call)
