import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def test_the_runtime_is_chosen_before_any_sub_command_is_imported(tmp_path):
    """On a CPU, triton's own language functions (tl.cdiv...) must be interpreted like the
    kernels calling them; they are, only if TRITON_INTERPRET is set before triton is first
    imported, and building the parser imports every sub-command."""
    if torch.cuda.is_available():
        pytest.skip("the GPU runs compiled kernels: nothing to interpret")
    code = ("import sys\nfrom speedlight import cli\n"
            "try:\n    cli.main(['verify', '--ops', 'nope', '--out', sys.argv[1]])\n"
            "except SystemExit:\n    pass\n"
            "import triton.language as tl\nprint(type(tl.cdiv).__name__)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "InterpretedFunction", out.stderr[-2000:]


def test_verify_interrupted_keeps_the_finished_cases_of_the_op_in_progress(tmp_path, capsys,
                                                                           monkeypatch):
    """Ctrl-C during an op: the cases already verified are in verify.jsonl, one line says
    so, and the exit status is 130 (as bench's)."""
    from speedlight.verify import harness
    real, calls = harness.verify_case, []

    def interrupted_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "verify_case", interrupted_third)
    code = cli.main(["verify", "--ops", "softmax", "--dtypes", "fp32", "--seeds", "1",
                     "--out", str(tmp_path)])
    assert code == 130
    rows = results.read_jsonl(tmp_path / "verify.jsonl")
    assert len(rows) == 2 and all(r["op"] == "softmax" for r in rows)
    out = capsys.readouterr().out.strip().splitlines()
    assert "interrupted" in out[-1] and "2 finished case" in out[-1]


@pytest.mark.parametrize("text,match", [
    pytest.param("import torch\nSPEC = (\n",
                 r"bad\.py.*line 2: SyntaxError: '\(' was never closed$",
                 id="syntax"),
    pytest.param("import torch\n\nimport speedlight_no_such_module\n",
                 r"bad\.py.*line 3.*ModuleNotFoundError: No module named "
                 r"'speedlight_no_such_module'", id="import"),
    pytest.param("x = 1\ny = 1 / 0\n", r"bad\.py.*line 2.*ZeroDivisionError", id="raises"),
])
def test_a_spec_file_that_fails_to_load_is_one_clear_line(text, match, tmp_path):
    spec = tmp_path / "bad.py"
    spec.write_text(text)
    with pytest.raises(SystemExit, match=match) as e:
        cli.main(["verify", "--spec", str(spec), "--only-spec", "--out", str(tmp_path)])
    assert "\n" not in str(e.value.code)


def test_verify_unknown_dtype_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="speedlight verify: unknown dtype 'int8'"):
        cli.main(["verify", "--ops", "softmax", "--dtypes", "int8", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_every_default_output_folder_is_git_ignored():
    """What a sub-command writes by default in the working directory (--out's default)
    is in .gitignore, so running speedlight in a clone leaves `git status` clean."""
    import argparse
    from pathlib import Path

    from speedlight import cli

    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    defaults = set()
    for p in sub.choices.values():
        for a in p._actions:
            if "--out" in a.option_strings and isinstance(a.default, str):
                defaults.add(a.default.strip("/").split("/")[0])
    assert "speedlight-shape" in defaults
    missing = sorted(d for d in defaults if f"/{d}/" not in ignored)
    assert not missing, f"not in .gitignore: {missing}"
