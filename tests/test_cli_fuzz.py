"""Bad arguments for every sub-command: each ends with exit code 1 or 2 and a message,
never a traceback, and before any work (every row here must fail fast)."""

from __future__ import annotations

import json

import pytest

from speedlight import cli


def refused(command: str, *expected: str, id: str):
    """A case: the command line, its words split at spaces, then what else the test takes."""
    return pytest.param(command.split(), *expected, id=id)


# command lines, with {d} for a scratch folder holding: afile (a file), empty/ (a folder),
# bad_spec.py (a syntax error), rows/ (a results file of JSON that are not objects)
BAD = [
    refused("nonsense", id="unknown-command"),
    refused("verify --device tpu", id="device-unknown"),
    refused("verify --ops nope", id="verify-ops"),
    refused("verify --suite huge", id="verify-suite"),
    refused("verify --seeds 0", id="verify-seeds"),
    refused("verify --max-gib abc", id="verify-max-gib-text"),
    refused("verify --max-gib -1 --ops softmax", id="verify-max-gib-negative"),
    refused("verify --spec {d}/missing.py", id="verify-spec-missing"),
    refused("verify --dtypes int8", id="verify-dtypes-int8"),
    refused("verify --spec {d}/bad_spec.py", id="verify-spec-syntax-error"),
    refused("verify --ray --ray-cpus 0", id="verify-ray-cpus"),
    refused("verify --ray-gpu each", id="verify-ray-gpu-without-ray"),
    refused("tune rms_norm --ray-cpus 2", id="tune-ray-cpus-without-ray"),
    refused("tune rms_norm --ray-timeout 5", id="tune-ray-timeout-without-ray"),
    refused("verify --ray --ray-timeout 0", id="verify-ray-timeout-zero"),
    refused("bench --ray --ray-timeout nan", id="bench-ray-timeout-nan"),
    refused("bench --ops nope", id="bench-ops"),
    refused("bench --ray --budget-s 10", id="bench-ray-with-budget"),
    refused("bench --dtypes int8", id="bench-dtypes-int8"),
    refused("bench --modes sideways", id="bench-modes"),
    refused("bench --baselines nope", id="bench-baselines"),
    refused("bench --graph maybe", id="bench-graph"),
    refused("bench --rse -1", id="bench-rse"),
    refused("bench --budget-s -5", id="bench-budget"),
    refused("bench --limit -1", id="bench-limit"),
    refused("bench --spec {d}/missing.py", id="bench-spec-missing"),
    refused("bench --cases (", id="bench-cases-regex"),
    refused("bench compare {d}/missing_a {d}/missing_b", id="compare-missing"),
    refused("bench compare {d}/rows {d}/rows", id="compare-rows-not-objects"),
    refused("inspect", id="inspect-nothing-named"),
    refused("inspect nope", id="inspect-op"),
    refused("inspect --all --case x", id="inspect-all-and-case"),
    refused("inspect softmax --case nope-rows1", id="inspect-case"),
    refused("inspect softmax --target sm_1", id="inspect-target"),
    refused("inspect softmax --sku nope", id="inspect-sku"),
    refused("inspect softmax --dtype int8", id="inspect-dtype"),
    refused("inspect softmax --jobs 0", id="inspect-jobs"),
    refused("inspect softmax --mode x", id="inspect-mode"),
    refused("profile --model nope", id="profile-model"),
    refused("profile --model {d}/afile", id="profile-model-not-a-config"),
    refused("profile --target nope", id="profile-target"),
    refused("profile --dtype int8", id="profile-dtype"),
    refused("profile --batch 0", id="profile-batch"),
    refused("profile --seq -1", id="profile-seq"),
    refused("profile --size huge", id="profile-size"),
    refused("profile --layers 0", id="profile-layers"),
    refused("profile --project --targets ,,", id="profile-targets-empty"),
    refused("profile --project --top -1", id="profile-top"),
    refused("profile --project --recipe nope", id="profile-recipe"),
    refused("profile --project --targets h200,nope", id="profile-targets-unknown"),
    refused("profile --project --shard 0 --targets h200", id="profile-shard"),
    refused("profile --project --vary x", id="profile-vary-no-values"),
    refused("profile --project --vary seq=abc", id="profile-vary-seq-text"),
    refused("profile --project --vary batch=0", id="profile-vary-batch-zero"),
    refused("profile --project --vary nofield=1", id="profile-vary-unknown-field"),
    refused("tune softmax --max-compiles 0", id="tune-max-compiles"),
    refused("tune softmax --jobs 0", id="tune-jobs"),
    refused("tune nope", id="tune-op"),
    refused("tune softmax --dtypes ,", id="tune-dtypes-empty"),
    refused("tune softmax --out {d}/afile/x", id="tune-out-unwritable"),
    refused("bench model --layers 0", id="bench-model-layers"),
    refused("bench model --seq 0", id="bench-model-seq"),
    refused("bench model --variants nope", id="bench-model-variants"),
    refused("bench model --steps 0", id="bench-model-steps"),
    refused("bench model --lr nan", id="bench-model-lr-nan"),
    refused("bench model --model nope", id="bench-model-model"),
    refused("bench model --dtype int8", id="bench-model-dtype"),
    refused("shape {d}/ok.py:f --shapes x=[2] --top -1", id="shape-top"),
    refused("shape {d}/ok.py:f --shapes x=[2]:int8x", id="shape-dtype"),
    refused("profile --project --shard 8", id="profile-shard-without-targets"),
    refused("profile --device cpu --shard 8", id="profile-shard-measured"),
    refused("profile --device cpu --recipe fp32", id="profile-recipe-measured"),
    refused("report --model nope --out {d}/report", id="report-model"),
    refused("report --target nope --out {d}/report", id="report-target"),
    refused("report --batch 0 --out {d}/report", id="report-batch"),
    refused("report --dtype int8 --out {d}/report", id="report-dtype-int8"),
    refused("report --seeds 0 --out {d}/report", id="report-seeds"),
    refused("probe --copy-gib -1", id="probe-copy-gib"),
    refused("shape {d}/missing.py:fn --shapes x=[2]", id="shape-file-missing"),
    refused("shape {d}/bad_spec.py:fn --shapes x=[2]", id="shape-file-syntax-error"),
    refused("shape {d}/afile --shapes x=[2]", id="shape-no-function"),
    refused("shape {d}/ok.py:nope --shapes x=[2]", id="shape-function-missing"),
    refused("shape {d}/ok.py:f --shapes x=[2", id="shape-shapes"),
    refused("shape {d}/ok.py:f --shapes x=[2],y=[3]", id="shape-fails-on-fake"),
    refused("shape {d}/ok.py:f --shapes x=[2] --target nope", id="shape-target"),
    refused("probe --dtypes int8", id="probe-dtypes"),
    refused("bench model --plan {d}/afile", id="bench-model-plan-not-a-plan"),
    refused("bench model --plan {d}/empty", id="bench-model-plan-a-folder"),
]

# `speedlight plan`: each refused with exit 2 and one line, before any model is built
PLAN = [
    refused("plan --model nope", "--model 'nope'", id="plan-model"),
    refused("plan --model {d}/vit.json", "not a causal language model", id="plan-not-causal-lm"),
    refused("plan --model {d}/afile", "--model", id="plan-model-not-a-config"),
    refused("plan llama-3-8b --model gemma-2-9b", "two models", id="plan-two-models"),
    refused("plan --dtype int8", "--dtype", id="plan-dtype-int8"),
    refused("plan --dtype fp8", "--dtype", id="plan-dtype-fp8"),
    refused("plan --dtype fp64", "--dtype", id="plan-dtype-fp64"),
    refused("plan --layers 0", "--layers", id="plan-layers"),
    refused("plan --batch 0", "--batch", id="plan-batch"),
    refused("plan --seq -3", "--seq", id="plan-seq"),
    refused("plan --compile nosuch", "--compile", id="plan-compile"),
    refused("plan --out {d}/empty", "is a folder", id="plan-out-a-folder"),
    refused("plan --out {d}/afile/plan.json", "is a file", id="plan-out-under-a-file"),
    refused("plan --out=", "--out is empty", id="plan-out-empty"),
    refused("plan --kinds rms_nrom", "--kinds: kinds: unknown 'rms_nrom'", id="plan-kinds"),
    refused("plan --candidates ligr", "--candidates: candidates: unknown 'ligr'",
            id="plan-candidates"),
]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything a command writes by default lands here
    (tmp_path / "afile").write_text('{"a": 1}\n')
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad_spec.py").write_text("def (\n")
    (tmp_path / "ok.py").write_text("def f(x):\n    return x * 2\n")
    (tmp_path / "layers_two.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": "two",
         "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 128}))
    (tmp_path / "typed_spec.py").write_text(  # an OpSpec whose suites is a list
        "import speedlight\nfrom speedlight.spec import OpSpec\n"
        "SPEC = OpSpec(impl=speedlight.softmax, make_inputs=lambda c, d: {}, "
        "cost=lambda c, m: None, suites=['quick'])\n")
    (tmp_path / "vit.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 32}))
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "bench.jsonl").write_text("\n".join(json.dumps(v) for v in ([1], "x", 2)))
    return tmp_path


# bad arguments whose message must also name what is wrong (the flag, field or value)
NAMED = [
    refused("bench --spec {d}/typed_spec.py --only-spec", "suites must be",
            id="bench-spec-field-type"),
    refused("shape {d}/ok.py:f --shapes x=[99999999999999999999]",
            "beyond what a tensor can hold", id="shape-dim-beyond-int64"),
    refused("shape {d}/ok.py:f --shapes x=[4294967296,4294967296]",
            "beyond what a tensor can hold", id="shape-numel-beyond-int64"),
    refused("shape {d}/ok.py:f --shapes x=[2] --spec-out {d}/afile/s.py", "--spec-out",
            id="shape-spec-out-unwritable"),
    refused("shape {d}/ok.py:f --shapes x=[2] --spec-out {d}/empty", "--spec-out",
            id="shape-spec-out-a-folder"),
    refused("profile --device cpu --out {d}/afile/x", "--out", id="profile-out-unwritable"),
    refused("verify --max-gib nan", "--max-gib must be a number of GiB more than 0",
            id="verify-max-gib-nan"),
    refused("verify --max-gib inf", "--max-gib must be a number of GiB more than 0",
            id="verify-max-gib-inf"),
    refused("bench --max-gib nan --ops softmax", "--max-gib must be more than 0",
            id="bench-max-gib-nan"),
    refused("bench --max-gib inf --ops softmax", "--max-gib must be a finite",
            id="bench-max-gib-inf"),
    # a --ray-* flag without --ray is refused whatever its value, the default's included
    refused("tune rms_norm --ray-timeout 30", "--ray-timeout only apply with --ray",
            id="tune-ray-timeout-default-without-ray"),
    refused("verify --ray-timeout nan", "--ray-timeout only apply with --ray",
            id="verify-ray-timeout-nan-without-ray"),
    refused("bench --ray-cpus 1", "--ray-cpus only apply with --ray",
            id="bench-ray-cpus-default-without-ray"),
    refused("profile --device cpu --model {d}/layers_two.json",
            "'num_hidden_layers' expected int", id="profile-config-field-type"),
    refused("profile --project --seq 16 --no-patch --vary num_key_value_heads=3",
            "num_key_value_heads=3 does not divide num_attention_heads=4",
            id="profile-vary-heads-not-dividing"),
    refused("profile --project --seq 16 --no-patch --vary num_key_value_heads=two",
            "num_key_value_heads='two' is refused", id="profile-vary-field-type"),
]


@pytest.mark.parametrize("args,named", PLAN)
def test_plan_refuses_with_exit_2_and_one_line_before_any_work(args, named, scratch, capsys,
                                                                monkeypatch):
    from speedlight.workloads import models

    real = models.build
    monkeypatch.setattr(models, "build", lambda spec, **kw: (
        real(spec, **kw) if spec not in (None, "default", "llama-3-8b") and ":" not in spec
        and not spec.endswith(".json") else pytest.fail("a model was built")))
    args = [a.replace("{d}", str(scratch)) for a in args]
    assert cli.main(args + ["--device", "cpu"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1, out.err
    assert out.err.startswith("speedlight plan: ") and named in out.err, out.err


def test_plan_refuses_a_read_only_out_before_any_work(scratch, capsys, monkeypatch):
    from speedlight import results
    from speedlight.workloads import models

    monkeypatch.setattr(models, "build", lambda *a, **k: pytest.fail("a model was built"))

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(results.tempfile, "TemporaryFile", denied)
    assert cli.main(["plan", "--device", "cpu", "--out", str(scratch / "ro" / "plan.json")]) == 2
    assert "cannot be written: Permission denied" in capsys.readouterr().err


@pytest.mark.parametrize("args", BAD)
def test_bad_argument_exits_1_or_2_with_a_message(args, scratch, capsys):
    _refused(args, scratch, capsys)


@pytest.mark.parametrize("args,named", NAMED)
def test_bad_argument_is_named(args, named, scratch, capsys):
    text = _refused(args, scratch, capsys)
    assert named in text, f"{named!r} not in: {text[-1000:]}"


def _refused(args, scratch, capsys) -> str:
    """Run the command; assert it exited 1 or 2 with a message and no traceback; the text."""
    args = [a.replace("{d}", str(scratch)) for a in args]
    try:
        code = cli.main(args)
    except SystemExit as e:  # argparse exits 2; a command's SystemExit("...") exits 1
        code = e.code if isinstance(e.code, int) else 1
        message = e.code if isinstance(e.code, str) else ""
    else:
        message = ""
    out = capsys.readouterr()
    text = out.out + out.err + message
    assert code in (1, 2), f"exit code {code}: {text[-500:]}"
    assert "Traceback" not in text, text[-2000:]
    assert text.strip(), "no message"
    return text
