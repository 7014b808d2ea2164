"""speedlight plan: the decision rule driven by a stand-in timer, the plan's cache key and
staleness, patch(plan=...) applying a plan, and a real `speedlight plan` on a CPU, where
nothing is timed."""

from __future__ import annotations

import json

import pytest
import torch

from speedlight import plans
from speedlight.planning import decide
from speedlight.planning.decide import KindTrial, Timing, Tried


def _samples(median: float, n: int = 40, spread: float = 0.002) -> list[float]:
    """n samples around median, evenly spread by +-spread (relative)."""
    return [median * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]


def _trial(kind: str, ours: float | dict, theirs: float = 1.0, verified: bool = True,
           spread: float = 0.002) -> KindTrial:
    """The model's own at `theirs`, candidates at `ours` (speedlight alone for a number;
    name -> median for a dict), all verified unless verified=False."""
    ours = {"speedlight": ours} if not isinstance(ours, dict) else ours
    tried = [Tried(n, "admitted", "verified", Timing(_samples(m, spread=spread)), 1.0)
             if verified else Tried(n, "excluded", "failed verification: rel L2 error 0.5 "
                                                   "> 0.01", None, 50.0)
             for n, m in ours.items()]
    return KindTrial(kind, Timing(_samples(theirs, spread=spread)), tried)


@pytest.mark.parametrize("ours, verdict, why", [
    pytest.param(0.90, "kept", "faster with confidence", id="faster-kept"),
    pytest.param(1.10, "dropped", "slower with confidence", id="slower-dropped"),
    pytest.param(0.99, "dropped", "tie keeps the model's own", id="gain-under-2pct-tie"),
    pytest.param(1.00, "dropped", "tie keeps the model's own", id="equal-tie"),
])
def test_a_time_kind_is_kept_only_when_faster_with_confidence(ours, verdict, why):
    d = decide.decide(_trial("mlp", ours))
    assert (d.verdict, d.purpose) == (verdict, "time")
    assert d.choice == ("speedlight" if verdict == "kept" else "model")
    assert why in d.reason
    assert d.low < d.ratio < d.high
    assert d.ratio == pytest.approx(ours)


def test_the_fastest_confident_candidate_is_chosen_and_every_one_is_listed():
    d = decide.decide(_trial("rms_norm", {"speedlight": 0.9, "liger": 0.8, "torch-fused": 0.85,
                                          "torch-compile": 1.2}))
    assert (d.verdict, d.choice) == ("kept", "liger") and d.ratio == pytest.approx(0.8)
    status = {c["name"]: c["status"] for c in d.candidates}
    assert status == {"model": "admitted", "speedlight": "admitted", "liger": "chosen",
                      "torch-fused": "admitted", "torch-compile": "admitted"}
    slow = next(c for c in d.candidates if c["name"] == "torch-compile")
    assert slow["ratio"] == pytest.approx(1.2) and slow["low"] > 1


def test_a_wide_interval_holding_one_is_a_tie_even_at_a_5pct_gain():
    d = decide.decide(_trial("rope", 0.95, spread=0.5))
    assert d.verdict == "dropped" and d.low < 1 < d.high and d.choice == "model"


def test_a_candidate_failing_verification_is_never_chosen_whatever_its_time():
    d = decide.decide(_trial("attention", 0.2, verified=False))
    assert d.verdict == "dropped" and "no candidate passed verification (speedlight: " \
        "failed verification: rel L2" in d.reason
    assert d.ratio is None and d.candidates[1]["error_ratio"] == 50.0


def test_the_fused_loss_is_kept_for_memory_unless_slower_than_the_margin():
    assert decide.decide(_trial("linear_cross_entropy", 1.05)).verdict == "kept"
    slow = decide.decide(_trial("linear_cross_entropy", 1.3))
    assert slow.purpose == "memory" and slow.verdict == "dropped"


def test_nothing_timed_is_unmeasured_and_counts_the_candidates():
    trial = KindTrial("rms_norm", None, [Tried("speedlight", "offered"),
                                         Tried("liger", "not offered", "no weight")])
    d = decide.decide(trial)
    assert (d.verdict, d.choice) == ("unmeasured", None)
    assert d.reason == "nothing timed; candidates: 1 offered, 1 not offered"


def test_dependent_kinds_are_decided_together():
    # decoder_layer wins on its own but fuses speedlight's norms: dropped when rms_norm
    # chose another candidate (or the model's own)
    for rms in (1.2, {"speedlight": 0.9, "liger": 0.8}):
        out = decide.decide_all({"decoder_layer": _trial("decoder_layer", 0.8),
                                 "rms_norm": _trial("rms_norm", rms)})
        assert out["rms_norm"].choice != "speedlight"
        assert out["decoder_layer"].verdict == "dropped"
        assert "rms_norm chose" in out["decoder_layer"].reason
        assert list(out) == ["decoder_layer", "rms_norm"]  # the order asked
    # the fused loss is timed against the loss that stays: speedlight's cross_entropy (0.5)
    trials = {"cross_entropy": _trial("cross_entropy", 0.5),
              "linear_cross_entropy": _trial("linear_cross_entropy", 0.6)}
    out = decide.decide_all(trials)
    assert out["cross_entropy"].verdict == "kept"
    assert out["linear_cross_entropy"].ratio == pytest.approx(0.6 / 0.5)
    assert out["linear_cross_entropy"].verdict == "dropped"  # 20% slower than that loss
    assert "to the loss that stays (cross_entropy: speedlight)" in \
        out["linear_cross_entropy"].candidates[0]["reason"]


# --- the plan's key, the cache and patch(plan=...) -------------------------------------------

@pytest.fixture
def tiny():
    from speedlight.workloads import models
    return models.build(None, batch=1, seq=8, train=True, dtype=torch.float32,
                        device=torch.device("cpu"), layers=1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    return tmp_path


def _plan(model, verdicts: dict[str, str], **key) -> plans.Plan:
    decisions = {k: plans.Decision(k, v, "stand-in", ratio=0.9 if v != "unmeasured" else None,
                                   low=0.85, high=0.95) for k, v in verdicts.items()}
    return plans.Plan(dict(plans.key_for(model, batch=1, seq=8, compile_mode=None), **key),
                      decisions, True, "stand-in", created="2026-01-01T00:00:00+00:00")


def test_a_stale_plan_is_not_used(tiny, cache):
    fresh = _plan(tiny.model, {"mlp": "dropped"})
    plans.save(fresh)
    assert plans.cached(tiny.model).key == fresh.key
    other_versions = dict(fresh.key["versions"], torch="0.0.1")
    for stale in ({"gpu": "NVIDIA H100 80GB HBM3"}, {"versions": other_versions}):
        for p in cache.glob("plans/*.json"):
            p.unlink()
        path = plans.save(_plan(tiny.model, {"mlp": "dropped"}, **stale))
        assert plans.cached(tiny.model) is None
        assert next(iter(stale)) in plans.mismatch(plans.load_plan(path), tiny.model)


def test_patch_applies_a_plan_and_says_why_per_kind(tiny, cache):
    import speedlight
    from speedlight.patching import unpatch

    path = plans.save(_plan(tiny.model, {"mlp": "dropped", "rms_norm": "kept",
                                         "rope": "unmeasured"}), cache / "p.json")
    report = speedlight.patch(tiny.model, plan=str(path), attention=False,
                              linear_cross_entropy=False, cross_entropy=False)
    try:
        assert "mlp" not in report.patched and report.count("rms_norm") > 0
        assert report.plan["mlp"].startswith("dropped by measurement (time x0.900")
        assert report.plan["rms_norm"].startswith("kept by measurement")
        assert report.plan["rope"].startswith("applied unmeasured")
        assert report.plan["decoder_layer"] == "applied unmeasured (no measured plan)"
        assert "plan:" in str(report)
    finally:
        unpatch(tiny.model)
    stale = _plan(tiny.model, {"mlp": "dropped"}, gpu="another GPU")
    with pytest.warns(plans.PlanWarning, match="not for this model here"):
        report = speedlight.patch(tiny.model, plan=stale.to_json(), attention=False)
    try:
        assert report.count("mlp") > 0 and "not used" in report.plan_note
    finally:
        unpatch(tiny.model)
    with pytest.raises(ValueError, match="example_inputs"):
        speedlight.patch(tiny.model, plan="measure")


def test_every_candidate_verified_a_planted_wrong_one_excluded_the_fastest_installed(
        tiny, cache, monkeypatch):
    """capture, install each candidate of rms_norm alone, verify against float64, time with
    a stand-in timer, unpatch: torch.compile's region is the fastest (the timer says so), a
    planted wrong torch-fused (1% off) is excluded with its error ratio, Liger (whose norm
    the interpreter cannot run) excluded with its error; patch(plan=...) then installs the
    compiled region and unpatch restores the model."""
    import speedlight
    from speedlight import candidates
    from speedlight.patching import installs, unpatch

    monkeypatch.setattr(installs, "COMPILE_OPTIONS", {"backend": "eager"})  # no codegen on a CPU
    adapt = candidates.adapt

    def planted(name, *a, **k):
        fn, mutates = adapt(name, *a, **k)
        if name != candidates.TORCH_FUSED:
            return fn, mutates
        return (lambda **inputs: fn(**inputs) * 1.01), mutates
    monkeypatch.setattr(candidates, "adapt", planted)
    speeds = {"model": 1.0, "speedlight": 0.9, "torch-compile": 0.8, "torch-fused": 0.5}
    sides = []

    def timer(step, prepare, kind, name):
        prepare(0)
        step(0)
        sides.append(name)
        return _samples(speeds[name])

    result = speedlight.plan(tiny.model, tiny.inputs, kinds=["rms_norm"], timer=timer)
    d = result.decisions["rms_norm"]
    assert sides == ["model", "speedlight", "torch-compile"]  # only the admitted are timed
    assert (d.verdict, d.choice) == ("kept", "torch-compile") and d.ratio == pytest.approx(0.8)
    assert d.module == "model.layers.0.input_layernorm"
    rows = {c["name"]: c for c in d.candidates}
    assert rows["torch-fused"]["status"] == "excluded" and rows["torch-fused"]["error_ratio"] > 10
    assert rows["torch-fused"]["reason"].startswith("failed verification: output: ")
    assert rows["speedlight"]["status"] == "admitted" and rows["speedlight"]["error_ratio"] < 10
    assert rows["speedlight-cuda"]["status"] == "not offered"
    assert not hasattr(tiny.model, "_speedlight_patch")  # unpatched again
    assert all(p.grad is None for p in tiny.model.parameters())  # no gradient left behind
    doc = json.loads(plans.path_for(result.key).read_text())
    assert doc["decisions"]["rms_norm"]["choice"] == "torch-compile"

    plan = plans.Plan.from_json(dict(doc, key=dict(doc["key"], gpu="cpu")))
    before = tiny.model(**tiny.inputs).loss
    report = speedlight.patch(tiny.model, plan=plan, **{k: False for k in plans.KINDS
                                                        if k != "rms_norm"})
    try:
        assert all(p.endswith("(torch-compile)") for p in report.patched["rms_norm"])
        assert report.plan["rms_norm"].startswith("kept by measurement (torch-compile: time x0.800")
        torch.testing.assert_close(tiny.model(**tiny.inputs).loss, before)
    finally:
        unpatch(tiny.model)
    assert not any("forward" in m.__dict__ for m in tiny.model.modules())


def test_speedlight_plan_on_a_cpu_times_nothing_and_says_so(cache, capsys):
    from speedlight import cli

    out = cache / "plan.json"
    assert cli.main(["plan", "--device", "cpu", "--model", "default", "--batch", "1", "--seq",
                     "8", "--layers", "1", "--kinds", "rms_norm,attention", "--candidates",
                     "torch-fused,sdpa-math,sdpa-cudnn", "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "nothing is timed" in printed and "projected" in printed
    doc = json.loads(out.read_text())
    assert doc["timed"] is False and doc["key"]["gpu"] == "cpu"
    assert {d["verdict"] for d in doc["decisions"].values()} == {"unmeasured"}
    assert all(d["ratio"] is None for d in doc["decisions"].values())
    # every candidate asked for discovered and verified, or not offered with the reason
    status = {(k, c["name"]): c["status"] for k, d in doc["decisions"].items()
              for c in d["candidates"]}
    assert status == {("rms_norm", "model"): "admitted", ("rms_norm", "torch-fused"): "admitted",
                      ("attention", "model"): "admitted", ("attention", "sdpa-math"): "admitted",
                      ("attention", "sdpa-cudnn"): "not offered"}
    assert "projected" in doc["projected"]["label"] and doc["projected"]["floor_s"] > 0
    assert list(cache.glob("plans/*.json"))  # written to the cache too


def test_a_plan_measured_on_fewer_layers_applies_to_the_deeper_model(tiny):
    """Only the first decoder layer's units are timed: the layer count is not in the key."""
    from speedlight.workloads import models
    deeper = models.build(None, batch=1, seq=8, train=True, dtype=torch.float32,
                          device=torch.device("cpu"), layers=2)
    assert deeper.model.config.num_hidden_layers != tiny.model.config.num_hidden_layers
    assert plans.mismatch(_plan(tiny.model, {"mlp": "dropped"}), deeper.model) is None
    deeper.model.config.intermediate_size += 64  # a layer's own width still tells them apart
    assert plans.mismatch(_plan(tiny.model, {"mlp": "dropped"}), deeper.model).startswith("config")


# --- the plan in the report and in `bench model` ----------------------------------------------

def _gpu_plan(model) -> plans.Plan:
    """A stand-in for a plan timed on a GPU: rms_norm kept, mlp dropped, rope unmeasured."""
    mib = 2 ** 20
    row = dict.fromkeys(plans.CANDIDATE_FIELDS)
    candidates = [dict(row, name="model", status="admitted", reason="the model's own",
                       median_s=1e-3, peak=4 * mib),
                  dict(row, name="speedlight", status="chosen", reason="verified",
                       median_s=0.9e-3, ratio=0.9, low=0.85, high=0.95, peak=3 * mib,
                       error_ratio=1.5),
                  dict(row, name="liger", status="excluded", error_ratio=12.0,
                       reason="failed verification: output: rel L2 error 0.1 > 0.01"),
                  dict(row, name="sdpa-cudnn", status="not offered",
                       reason="SDPA's cudnn backend runs on CUDA GPUs")]
    d = {"rms_norm": plans.Decision("rms_norm", "kept", "faster with confidence, 10.0% gain",
                                    ratio=0.9, low=0.85, high=0.95, ours_s=0.9e-3, theirs_s=1e-3,
                                    ours_peak=3 * mib, theirs_peak=4 * mib, verified=True,
                                    module="model.layers.0.input_layernorm",
                                    choice="speedlight", candidates=candidates),
         "mlp": plans.Decision("mlp", "dropped", "slower with confidence: the original stays",
                               ratio=1.1, low=1.05, high=1.15, ours_s=2.2e-3, theirs_s=2e-3,
                               ours_peak=8 * mib, theirs_peak=8 * mib, verified=True,
                               module="model.layers.0.mlp", choice="model"),
         "rope": plans.Decision("rope", "unmeasured", "no unit of this kind")}
    key = dict(plans.key_for(model, batch=1, seq=8, compile_mode=None), gpu="NVIDIA H200")
    return plans.Plan(key, d, True, "timed on NVIDIA H200: one decoder layer's units",
                      created="2026-01-01T00:00:00+00:00")


def test_the_report_renders_the_plan_table_from_plan_json(tiny, tmp_path):
    pytest.importorskip("jinja2")
    from speedlight import results
    from speedlight.pipeline import FILES, MANIFEST
    from speedlight.report import render

    results.write_json(tmp_path / FILES["plan"], _gpu_plan(tiny.model).to_json())
    results.write_json(tmp_path / MANIFEST, {"stages": {}, "files": FILES, "run": {}})
    render.render(tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "## Which kinds to patch: the plan" in md and "timed on NVIDIA H200" in md
    assert ("| rms_norm | kept | speedlight | 0.900 | [0.850, 0.950] | 900 us | 1 ms | 3 MiB / "
            "4 MiB | faster with confidence, 10.0% gain |") in md
    assert ("| mlp | dropped | model | 1.100 | [1.050, 1.150] | 2.2 ms | 2 ms | 8 MiB / 8 MiB |"
            in md)
    assert "| rope | unmeasured | - | - | - | - | - | - / - | no unit of this kind |" in md
    assert "- Plan: timed on NVIDIA H200: kept rms_norm; dropped mlp; 1 unmeasured." in md
    # every candidate, with its time, ratio, interval, peak memory and verdict
    assert "| rms_norm | model | admitted | 1 ms | - | - | 4 MiB | - | the model's own |" in md
    assert ("| rms_norm | speedlight | chosen | 900 us | 0.900 | [0.850, 0.950] | 3 MiB | 1.5 | "
            "verified |") in md
    assert ("| rms_norm | liger | excluded | - | - | - | - | 12 | failed verification: output: "
            "rel L2 error 0.1 > 0.01 |") in md
    assert "| rms_norm | sdpa-cudnn | not offered |" in md
    html = (tmp_path / "index.html").read_text()
    assert 'id="plan"' in html and '<td class="dropped">dropped</td>' in html
    assert '<td class="not-offered">not offered</td>' in html
    assert "[1.050, 1.150]" in html and "plan.json" in html and "not timed" not in html
    # a plan.json that is not a valid plan is named, not shown
    results.write_json(tmp_path / FILES["plan"], {"schema": 2, "decisions": []})
    render.render(tmp_path)
    assert "not shown: plan.json: has no 'key'" in (tmp_path / "summary.md").read_text()


def test_bench_model_s_planned_variant_patches_exactly_the_kinds_the_plan_keeps(tiny, tmp_path):
    """speedlight (planned) beside speedlight (all): with a stand-in plan that drops mlp, the
    planned variant patches every kind the all variant does but mlp, and its row says so."""
    import speedlight
    from speedlight.bench import model_step
    from speedlight.patching import unpatch

    everything = set(speedlight.patch(tiny.model, plan=None).patched)
    unpatch(tiny.model)
    plan = _gpu_plan(tiny.model)
    plan.key["gpu"] = "cpu"  # the plan applies where it runs: this CPU
    s = model_step.StepSettings(model=None, layers=1, batch=1, seq=8, dtype=torch.float32,
                                device=torch.device("cpu"), warmup=0, steps=1,
                                plan=plan.to_json())
    row, = model_step.run_variants(s, [model_step.PLANNED], tmp_path / "m.jsonl",
                                   forced=[model_step.PLANNED], patch=speedlight.patch)
    assert row["status"] == "ok", row.get("reason")
    assert "mlp" in everything and set(row["patched"]) == everything - {"mlp"}
    assert row["plan"]["mlp"].startswith("dropped by measurement (time x1.100")
    assert row["plan"]["rms_norm"].startswith("kept by measurement")
    assert row["plan"]["rope"].startswith("applied unmeasured")
    assert "the plan given" in row["plan_note"] and "dropped: mlp" in " ".join(row["notes"])
    # bench model lists every candidate of the plan behind the row
    assert [c["name"] for c in row["candidates"]["rms_norm"]] == ["model", "speedlight", "liger",
                                                                  "sdpa-cudnn"]
    from speedlight import results
    console = results.make_console(200)
    with console.capture() as got:
        console.print(model_step.plan_candidates_table([row]))
    text = got.get()
    assert "rms_norm" in text and "excluded" in text and "[0.850, 0.950]" in text
