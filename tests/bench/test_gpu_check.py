"""scripts/gpu-check.sh runs end to end on the CPU with a tiny suite: the same steps a GPU
machine runs, everything in one folder, the summary last."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from speedlight import results

ROOT = Path(__file__).resolve().parents[2]
TOY = str(Path(__file__).with_name("toy_specs.py"))


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel, standing in for a carried peer baseline."""
    name = "sl_wheel_marker"
    dist = f"{name}-0.1.dist-info"
    files = {f"{name}.py": "MARK = 1\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    folder.mkdir(parents=True)
    path = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_gpu_check_on_cpu_with_a_tiny_suite(tmp_path):
    out = tmp_path / "out"
    _wheel(tmp_path / "whl")
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, WHEEL_DIR=str(tmp_path / "whl"),
               WHEEL_SITE=str(tmp_path / "site"), SPEEDLIGHT_CACHE=str(tmp_path / "cache"),
               # the interpreter's start-up and a loaded CI machine: lines no GPU needs
               SETUP_S="240", VERIFY_S="240")
    env.pop("TRITON_INTERPRET", None)  # the script's speedlight picks the runtime itself
    spec = f"--spec {TOY} --only-spec --dtypes fp32"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--device", "cpu", "--ops", "toy_scale",
         "--bench-suite", "quick", "--verify-args", f"{spec} --seeds 1",
         "--bench-args", f"{spec} --baselines torch-eager --time-cap 0.01 --max-samples 3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("nvidia-smi.txt", "versions.json", "setup.log", "verify.jsonl", "bench.jsonl",
                 "summary.txt", "sections.txt"):
        assert (out / name).is_file(), name
    assert "no CUDA GPU" in (out / "setup.log").read_text()
    versions = json.loads((out / "versions.json").read_text())
    assert {"torch", "triton", "git", "liger-kernel"} <= set(versions)
    verify = results.read_jsonl(out / "verify.jsonl")
    assert verify and all(r["status"] == "pass" for r in verify)
    bench = results.read_jsonl(out / "bench.jsonl")
    assert {r["op"] for r in bench} == {"toy_scale"}
    assert all(r["representative"] is False for r in bench)
    assert (tmp_path / "site" / "sl_wheel_marker.py").is_file(), "the carried wheel was not installed"
    # every section is accounted for: the ones --ops leaves out as skipped, with the reason
    sections = {line.split("|")[0]: line.split("|") for line in
                (out / "sections.txt").read_text().splitlines()}
    assert set(sections) == set(table()) | {"plots"}
    for name in ("setup", "verify", "bench", "plots"):
        assert sections[name][1] == "ok", sections[name]
    for name in set(table()) - {"setup", "verify", "bench"}:
        assert sections[name][1] == "skipped" and "line is 0" in sections[name][5], name
    # the summary is printed last: the section table, then the bench table
    tail = proc.stdout[proc.stdout.index("gpu-check summary"):]
    assert "| toy_scale | fwd | fp32 |" in tail and "NOT representative" in tail
    summary = (out / "summary.txt").read_text()
    assert "gpu-check summary" in summary and "| toy_scale | fwd | fp32 |" in summary


def table() -> dict[str, tuple[int, str]]:
    """gpu-check.sh's budget table: section -> (seconds, what it runs)."""
    text = (ROOT / "scripts" / "gpu-check.sh").read_text()
    body = text.split('BUDGET_TABLE="', 1)[1].split('"', 1)[0]
    rows = [line.split(None, 2) for line in body.strip().splitlines()]
    return {name: (int(seconds), what) for name, seconds, what in rows}


def test_the_budget_table_fits_8_minutes_and_names_scripts_that_exist():
    sections = table()
    assert sum(seconds for seconds, _ in sections.values()) <= 480
    assert list(sections)[:2] == ["setup", "verify"], "verification comes before any timing"
    for name, (seconds, what) in sections.items():
        script = what.split(":")[0]
        if script.startswith("scripts/gpu/"):
            assert (ROOT / script).is_file(), f"{name}: {script} is missing"
            assert f"run_script {name} {script.rsplit('/', 1)[1]}" in (
                ROOT / "scripts" / "gpu-check.sh").read_text(), name
