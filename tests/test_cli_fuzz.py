"""Bad arguments for every sub-command: each ends with exit code 1 or 2 and a message,
never a traceback, and before any work (every row here must fail fast)."""

from __future__ import annotations

import json

import pytest

from speedlight import cli

# arguments, with {d} for a scratch folder holding: afile (a file), empty/ (a folder),
# bad_spec.py (a syntax error), rows/ (a results file of JSON that are not objects)
BAD = [
    pytest.param(["nonsense"], id="unknown-command"),
    pytest.param(["verify", "--device", "tpu"], id="device-unknown"),
    pytest.param(["verify", "--ops", "nope"], id="verify-ops"),
    pytest.param(["verify", "--suite", "huge"], id="verify-suite"),
    pytest.param(["verify", "--seeds", "0"], id="verify-seeds"),
    pytest.param(["verify", "--max-gib", "abc"], id="verify-max-gib-text"),
    pytest.param(["verify", "--max-gib", "-1", "--ops", "softmax"], id="verify-max-gib-negative"),
    pytest.param(["verify", "--spec", "{d}/missing.py"], id="verify-spec-missing"),
    pytest.param(["verify", "--dtypes", "int8"], id="verify-dtypes-int8"),
    pytest.param(["verify", "--spec", "{d}/bad_spec.py"], id="verify-spec-syntax-error"),
    pytest.param(["verify", "--ray", "--ray-cpus", "0"], id="verify-ray-cpus"),
    pytest.param(["verify", "--ray-gpu", "each"], id="verify-ray-gpu-without-ray"),
    pytest.param(["tune", "rms_norm", "--ray-cpus", "2"], id="tune-ray-cpus-without-ray"),
    pytest.param(["tune", "rms_norm", "--ray-timeout", "5"], id="tune-ray-timeout-without-ray"),
    pytest.param(["verify", "--ray", "--ray-timeout", "0"], id="verify-ray-timeout-zero"),
    pytest.param(["bench", "--ray", "--ray-timeout", "nan"], id="bench-ray-timeout-nan"),
    pytest.param(["bench", "--ops", "nope"], id="bench-ops"),
    pytest.param(["bench", "--ray", "--budget-s", "10"], id="bench-ray-with-budget"),
    pytest.param(["bench", "--dtypes", "int8"], id="bench-dtypes-int8"),
    pytest.param(["bench", "--modes", "sideways"], id="bench-modes"),
    pytest.param(["bench", "--baselines", "nope"], id="bench-baselines"),
    pytest.param(["bench", "--graph", "maybe"], id="bench-graph"),
    pytest.param(["bench", "--rse", "-1"], id="bench-rse"),
    pytest.param(["bench", "--budget-s", "-5"], id="bench-budget"),
    pytest.param(["bench", "--limit", "-1"], id="bench-limit"),
    pytest.param(["bench", "--spec", "{d}/missing.py"], id="bench-spec-missing"),
    pytest.param(["bench", "--cases", "("], id="bench-cases-regex"),
    pytest.param(["bench", "compare", "{d}/missing_a", "{d}/missing_b"], id="compare-missing"),
    pytest.param(["bench", "compare", "{d}/rows", "{d}/rows"], id="compare-rows-not-objects"),
    pytest.param(["inspect"], id="inspect-nothing-named"),
    pytest.param(["inspect", "nope"], id="inspect-op"),
    pytest.param(["inspect", "--all", "--case", "x"], id="inspect-all-and-case"),
    pytest.param(["inspect", "softmax", "--case", "nope-rows1"], id="inspect-case"),
    pytest.param(["inspect", "softmax", "--target", "sm_1"], id="inspect-target"),
    pytest.param(["inspect", "softmax", "--sku", "nope"], id="inspect-sku"),
    pytest.param(["inspect", "softmax", "--dtype", "int8"], id="inspect-dtype"),
    pytest.param(["inspect", "softmax", "--jobs", "0"], id="inspect-jobs"),
    pytest.param(["inspect", "softmax", "--mode", "x"], id="inspect-mode"),
    pytest.param(["profile", "--model", "nope"], id="profile-model"),
    pytest.param(["profile", "--model", "{d}/afile"], id="profile-model-not-a-config"),
    pytest.param(["profile", "--target", "nope"], id="profile-target"),
    pytest.param(["profile", "--dtype", "int8"], id="profile-dtype"),
    pytest.param(["profile", "--batch", "0"], id="profile-batch"),
    pytest.param(["profile", "--seq", "-1"], id="profile-seq"),
    pytest.param(["profile", "--size", "huge"], id="profile-size"),
    pytest.param(["profile", "--layers", "0"], id="profile-layers"),
    pytest.param(["profile", "--project", "--targets", ",,"], id="profile-targets-empty"),
    pytest.param(["profile", "--project", "--top", "-1"], id="profile-top"),
    pytest.param(["profile", "--project", "--recipe", "nope"], id="profile-recipe"),
    pytest.param(["profile", "--project", "--targets", "h200,nope"], id="profile-targets-unknown"),
    pytest.param(["profile", "--project", "--shard", "0", "--targets", "h200"], id="profile-shard"),
    pytest.param(["profile", "--project", "--vary", "x"], id="profile-vary-no-values"),
    pytest.param(["profile", "--project", "--vary", "seq=abc"], id="profile-vary-seq-text"),
    pytest.param(["profile", "--project", "--vary", "batch=0"], id="profile-vary-batch-zero"),
    pytest.param(["profile", "--project", "--vary", "nofield=1"], id="profile-vary-unknown-field"),
    pytest.param(["tune", "softmax", "--max-compiles", "0"], id="tune-max-compiles"),
    pytest.param(["tune", "softmax", "--jobs", "0"], id="tune-jobs"),
    pytest.param(["tune", "nope"], id="tune-op"),
    pytest.param(["tune", "softmax", "--dtypes", ","], id="tune-dtypes-empty"),
    pytest.param(["tune", "softmax", "--out", "{d}/afile/x"], id="tune-out-unwritable"),
    pytest.param(["bench", "model", "--layers", "0"], id="bench-model-layers"),
    pytest.param(["bench", "model", "--seq", "0"], id="bench-model-seq"),
    pytest.param(["bench", "model", "--variants", "nope"], id="bench-model-variants"),
    pytest.param(["bench", "model", "--steps", "0"], id="bench-model-steps"),
    pytest.param(["bench", "model", "--lr", "nan"], id="bench-model-lr-nan"),
    pytest.param(["bench", "model", "--model", "nope"], id="bench-model-model"),
    pytest.param(["bench", "model", "--dtype", "int8"], id="bench-model-dtype"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[2]", "--top", "-1"], id="shape-top"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[2]:int8x"], id="shape-dtype"),
    pytest.param(["profile", "--project", "--shard", "8"], id="profile-shard-without-targets"),
    pytest.param(["profile", "--device", "cpu", "--shard", "8"], id="profile-shard-measured"),
    pytest.param(["profile", "--device", "cpu", "--recipe", "fp32"], id="profile-recipe-measured"),
    pytest.param(["report", "--model", "nope", "--out", "{d}/report"], id="report-model"),
    pytest.param(["report", "--target", "nope", "--out", "{d}/report"], id="report-target"),
    pytest.param(["report", "--batch", "0", "--out", "{d}/report"], id="report-batch"),
    pytest.param(["report", "--dtype", "int8", "--out", "{d}/report"], id="report-dtype-int8"),
    pytest.param(["probe", "--copy-gib", "-1"], id="probe-copy-gib"),
    pytest.param(["shape", "{d}/missing.py:fn", "--shapes", "x=[2]"], id="shape-file-missing"),
    pytest.param(["shape", "{d}/bad_spec.py:fn", "--shapes", "x=[2]"], id="shape-file-syntax-error"),
    pytest.param(["shape", "{d}/afile", "--shapes", "x=[2]"], id="shape-no-function"),
    pytest.param(["shape", "{d}/ok.py:nope", "--shapes", "x=[2]"], id="shape-function-missing"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[2"], id="shape-shapes"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[2],y=[3]"], id="shape-fails-on-fake"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[2]", "--target", "nope"], id="shape-target"),
    pytest.param(["probe", "--dtypes", "int8"], id="probe-dtypes"),
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
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "bench.jsonl").write_text("\n".join(json.dumps(v) for v in ([1], "x", 2)))
    return tmp_path


# bad arguments whose message must also name what is wrong (the flag, field or value)
NAMED = [
    pytest.param(["bench", "--spec", "{d}/typed_spec.py", "--only-spec"], "suites must be",
                 id="bench-spec-field-type"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[99999999999999999999]"],
                 "beyond what a tensor can hold", id="shape-dim-beyond-int64"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[4294967296,4294967296]"],
                 "beyond what a tensor can hold", id="shape-numel-beyond-int64"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[2]", "--spec-out", "{d}/afile/s.py"],
                 "--spec-out", id="shape-spec-out-unwritable"),
    pytest.param(["shape", "{d}/ok.py:f", "--shapes", "x=[2]", "--spec-out", "{d}/empty"],
                 "--spec-out", id="shape-spec-out-a-folder"),
    pytest.param(["profile", "--device", "cpu", "--out", "{d}/afile/x"], "--out",
                 id="profile-out-unwritable"),
    pytest.param(["profile", "--device", "cpu", "--model", "{d}/layers_two.json"],
                 "'num_hidden_layers' expected int", id="profile-config-field-type"),
    pytest.param(["profile", "--project", "--seq", "16", "--no-patch", "--vary",
                  "num_key_value_heads=3"], "num_key_value_heads=3 does not divide "
                 "num_attention_heads=4", id="profile-vary-heads-not-dividing"),
    pytest.param(["profile", "--project", "--seq", "16", "--no-patch", "--vary",
                  "num_key_value_heads=two"], "num_key_value_heads='two' is refused",
                 id="profile-vary-field-type"),
]


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
