"""`speedlight report --out DIR` over an earlier report: the new report is built beside the
old one and replaces it only when whole, so an interrupted run leaves the old one as it
was, and no file speedlight did not write is ever deleted."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("jinja2")

from speedlight import cli, pipeline, registry
from speedlight.pipeline import model_check
from speedlight.profile import command as profile_command

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--no-bench", "--no-inspect", "--no-projection"]


def _old_report(folder: Path) -> dict[str, str]:
    """An earlier report's files (what speedlight writes), with recognizable contents."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {name: f'{{"old": "{name}"}}\n' for name in pipeline.FILES.values()}
    files[pipeline.MANIFEST] = json.dumps({"stages": {}, "files": pipeline.FILES, "old": 1})
    files["index.html"] = "<html>the old report</html>"
    files["summary.md"] = "the old report\n"
    for name, text in files.items():
        (folder / name).write_text(text)
    return files


def _contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir()}


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]


def test_an_interrupted_run_leaves_the_earlier_report_whole(tmp_path, monkeypatch, capsys):
    out = tmp_path / "report"
    old = _old_report(out)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(profile_command, "profile_workload", interrupted)
    assert cli.main(["report", "--out", str(out), *QUICK]) == 130
    assert _contents(out) == old
    assert _leftovers(out) == [], "the partial report is removed"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "interrupted" in last and str(out) in last


def test_a_finished_run_replaces_the_earlier_report_entirely(tmp_path, monkeypatch):
    """No stage file of the old run survives beside the new run's (bench.jsonl here, a
    stage the new run skips), and nothing is left beside the folder."""
    out = tmp_path / "report"
    _old_report(out)

    def failing(*args, **kwargs):
        raise RuntimeError("profile failed on purpose")

    monkeypatch.setattr(profile_command, "profile_workload", failing)
    monkeypatch.setattr(model_check, "check_models", failing)
    monkeypatch.setattr(registry, "builtin_specs", lambda: [])
    code = cli.main(["report", "--out", str(out), *QUICK])
    assert code == 1  # the failed stage is reported, and the report is still whole
    manifest = json.loads((out / pipeline.MANIFEST).read_text())
    assert "old" not in manifest and manifest["stages"]["profile_before"]["status"] == "failed"
    assert manifest["stages"]["bench"]["status"] == "skipped"
    assert not (out / pipeline.FILES["bench"]).exists()
    assert "the old report" not in (out / "index.html").read_text()
    assert _leftovers(out) == []


def test_a_folder_holding_other_files_is_refused_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr(profile_command, "profile_workload",
                        lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(SystemExit, match=r"--out .*mine.* holds files speedlight did not "
                                         r"write \(notes.txt\)") as e:
        cli.main(["report", "--out", str(out)])
    assert "\n" not in str(e.value.code)
    assert _contents(out) == {"notes.txt": "mine"} and _leftovers(out) == []


def test_an_unknown_dtype_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match=r"speedlight report: unknown dtype 'int8'") as e:
        cli.main(["report", "--dtype", "int8", "--out", str(tmp_path / "r")])
    assert "\n" not in str(e.value.code)
    assert not (tmp_path / "r").exists() and _leftovers(tmp_path / "r") == []


def test_a_killed_run_leaves_the_old_report_or_the_new_one_whole(tmp_path):
    """SIGKILL a real `speedlight report` once it has started building: the folder still
    holds the whole old report (or, had it finished, the whole new one)."""
    out = tmp_path / "report"
    old = _old_report(out)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "speedlight", "report", "--out", str(out),
                             "--device", "cpu", "--steps", "1", *QUICK],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not _leftovers(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _leftovers(out), "the run never started building beside the old report"
        time.sleep(0.5)  # a moment into the stages
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    now = _contents(out)
    if now != old:  # it finished before the kill: then the new report is whole
        manifest = json.loads(now[pipeline.MANIFEST])
        assert "old" not in manifest and "index.html" in now
