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
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "bench.jsonl").write_text("\n".join(json.dumps(v) for v in ([1], "x", 2)))
    return tmp_path


@pytest.mark.parametrize("args", BAD)
def test_bad_argument_exits_1_or_2_with_a_message(args, scratch, capsys):
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
