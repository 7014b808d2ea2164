import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speedlight import results


def test_append_keeps_old_rows(tmp_path):
    path = tmp_path / "r.jsonl"
    results.append_jsonl(path, [{"a": 1}])
    results.append_jsonl(path, [{"a": 2}, {"a": float("nan")}])
    rows = results.read_jsonl(path)
    assert [r["a"] for r in rows] == [1, 2, "nan"]
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"], "nothing left beside it"


_WRITER = """
import sys
from speedlight import results
path, name = sys.argv[1], sys.argv[2]
for i in range(150):
    results.append_jsonl(path, [{"writer": name, "i": i, "pad": "x" * (i * 37 % 3000)}])
"""


def test_two_writer_processes_lose_no_row(tmp_path):
    """Two processes appending one row at a time to one file: all 300 rows, each whole."""
    path = tmp_path / "r.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(results.__file__).resolve().parents[1])}
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), name], env=env)
               for name in "ab"]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    rows = results.read_jsonl(path)
    assert len(rows) == 300
    for name in "ab":
        assert [r["i"] for r in rows if r["writer"] == name] == list(range(150))


def test_append_does_not_rewrite_the_file(tmp_path, monkeypatch):
    """Appending is O(new rows): the earlier rows are neither read nor written again."""
    path = tmp_path / "r.jsonl"
    results.append_jsonl(path, [{"i": i} for i in range(1000)])
    written = []
    real_write = os.write
    monkeypatch.setattr(results.os, "write",
                        lambda fd, b: written.append(len(b)) or real_write(fd, b))
    monkeypatch.setattr(Path, "read_text", lambda *a, **k: pytest.fail("read the whole file"))
    results.append_jsonl(path, [{"i": 1000}])
    assert sum(written) == len('{"i": 1000}\n')


def test_interrupted_write_leaves_earlier_results_intact(tmp_path, monkeypatch):
    """A writer interrupted mid-line leaves the earlier rows as they were; readers skip the
    torn last line and say so; the next append drops it and starts on a whole line."""
    path = tmp_path / "r.jsonl"
    results.append_jsonl(path, [{"run": 1}])
    before = path.read_text()
    real_write = os.write

    def torn(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "write", torn)
    with pytest.raises(KeyboardInterrupt):
        results.append_jsonl(path, [{"run": 2, "pad": "x" * 100}])
    monkeypatch.setattr(results.os, "write", real_write)
    assert path.read_text().startswith(before) and path.read_text() != before
    with pytest.warns(results.TornLineWarning, match=r"r.jsonl:2: skipped a torn last line"):
        assert results.read_jsonl(path) == [{"run": 1}]
    results.append_jsonl(path, [{"run": 3}])
    assert results.read_jsonl(path) == [{"run": 1}, {"run": 3}]


def test_a_last_line_without_newline_that_parses_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')  # written by hand, no final newline
    assert results.read_jsonl(path) == [{"a": 1}, {"a": 2}]
    results.append_jsonl(path, [{"a": 3}])
    assert results.read_jsonl(path) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        results.read_jsonl(path)


def test_environment_says_where_and_with_which_versions(device):
    import triton

    env = results.environment(device)
    for key in ("torch", "triton", "transformers", "cuda", "device", "runtime", "timestamp",
                "git"):
        assert key in env
    assert env["runtime"] == ("cuda" if device.type == "cuda" else "cpu-interpreter")
    assert (env["torch"], env["triton"], env["cuda"]) == (torch.__version__, triton.__version__,
                                                          torch.version.cuda)
    transformers = pytest.importorskip("transformers")
    assert env["transformers"] == transformers.__version__
    json.dumps(env)
