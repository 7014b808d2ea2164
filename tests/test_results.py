import json
import math

import pytest

from speedlight import results


def test_append_is_atomic_and_keeps_old_rows(tmp_path):
    path = tmp_path / "r.jsonl"
    results.append_jsonl(path, [{"a": 1}])
    results.append_jsonl(path, [{"a": 2}, {"a": float("nan")}])
    rows = results.read_jsonl(path)
    assert [r["a"] for r in rows] == [1, 2, "nan"]
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


def test_interrupted_write_leaves_earlier_results_intact(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    results.append_jsonl(path, [{"run": 1}])
    before = path.read_text()

    def boom(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        results.append_jsonl(path, [{"run": 2}])
    assert path.read_text() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        results.read_jsonl(path)


def test_environment_says_where(device):
    env = results.environment(device)
    for key in ("torch", "triton", "device", "runtime", "timestamp", "git"):
        assert key in env
    assert env["runtime"] == ("cuda" if device.type == "cuda" else "cpu-interpreter")
    json.dumps(env)
