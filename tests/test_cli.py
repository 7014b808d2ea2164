import json
from pathlib import Path

import pytest

from speedlight import cli, results

ROOT = Path(__file__).resolve().parent.parent
BROKEN_SPEC = '''
import dataclasses, torch
from speedlight.ops import softmax as op
def wrong(x, dim=-1):
    return op.softmax(x * 1.001, dim)
SPEC = dataclasses.replace(op.SPEC, name="wrong_softmax", impl=wrong, grad_inputs=())
'''


def test_verify_writes_rows_and_exits_zero(tmp_path, capsys):
    code = cli.main(["verify", "--ops", "softmax", "--dtypes", "fp32", "--seeds", "1",
                     "--target", "sm_80", "--out", str(tmp_path)])
    assert code == 0
    rows = results.read_jsonl(tmp_path / "verify.jsonl")
    assert rows and all(r["op"] == "softmax" and r["status"] == "pass" for r in rows)
    assert {"device", "torch", "triton", "git", "timestamp", "case_id"} <= set(rows[0])
    assert all(r["target"] == "a100-sxm" for r in rows)
    out = capsys.readouterr().out
    assert "speedlight verify" in out and "passed" in out
    assert "target NVIDIA A100-SXM4-80GB (sm_80, 108 SMs; --target sm_80" in out


def test_verify_exits_one_on_a_wrong_kernel(tmp_path, capsys):
    spec = tmp_path / "wrong.py"
    spec.write_text(BROKEN_SPEC)
    code = cli.main(["verify", "--spec", str(spec), "--only-spec", "--dtypes", "fp32",
                     "--seeds", "1", "--out", str(tmp_path)])
    assert code == 1
    assert "FAIL" in capsys.readouterr().out


def test_verify_user_example(tmp_path):
    code = cli.main(["verify", "--spec", str(ROOT / "examples" / "relu_squared.py"),
                     "--only-spec", "--dtypes", "fp16", "--seeds", "1", "--out", str(tmp_path)])
    assert code == 0


def test_unknown_op_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown op"):
        cli.main(["verify", "--ops", "nope", "--out", str(tmp_path)])


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "verify" in capsys.readouterr().out
