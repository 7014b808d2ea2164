"""Rendering a report folder from its stage files alone: speedups appear only for rows timed
on a GPU, and their means take only those (rows written here, no report run)."""

import json

import pytest

pytest.importorskip("jinja2")

from speedlight import pipeline, results
from speedlight.report import render
from speedlight.report.load import NOT_REPRESENTATIVE, load_report


def _bench_row(case, speedup, representative, implementation="speedlight"):
    return {"tool": "bench", "op": "rms_norm", "implementation": implementation,
            "case_id": case, "mode": "fwd", "status": "ok", "median_us": 10.0,
            "verified": True, "representative": representative,
            "speedup": {"torch-eager": speedup} if implementation == "speedlight" else None}


def _folder(tmp_path, rows):
    results.write_json(tmp_path / pipeline.MANIFEST,
                       {"stages": {"bench": {"title": "bench", "file": "bench.jsonl",
                                             "status": "ok"}}, "files": pipeline.FILES})
    results.append_jsonl(tmp_path / "bench.jsonl", rows)
    return tmp_path


def test_gpu_rows_show_their_speedups_and_cpu_rows_none(tmp_path):
    folder = _folder(tmp_path, [_bench_row("a", 2.0, True), _bench_row("b", 8.0, True),
                                _bench_row("c", 1.62, False),
                                _bench_row("a", None, True, implementation="torch-eager")])
    d = load_report(folder)
    assert d["speedup_means"] == {"torch-eager": {"fwd": pytest.approx(4.0)}}
    assert d["speedups_withheld"] == 1
    by_case = {b["case"]: b for b in d["bench"]}
    assert by_case["c"]["speedup"] == {} and by_case["c"]["speedup_withheld"] == NOT_REPRESENTATIVE
    assert by_case["a"]["speedup"] == {"torch-eager": 2.0} and not by_case["a"]["speedup_withheld"]
    render.render(folder)
    md = (folder / "summary.md").read_text()
    assert "Geometric-mean speedup over torch-eager: fwd 4.00x." in md
    assert "| a | fwd | 10 us | torch-eager 2.00x |" in md and "1.62x" not in md
    assert f"| c | fwd | 10 us | {NOT_REPRESENTATIVE} |" in md
    assert md.rstrip().endswith("Stage files: [bench.jsonl](bench.jsonl).")
    assert "1.62x" not in (folder / "index.html").read_text()


def test_a_row_without_the_representative_field_shows_no_speedup(tmp_path):
    row = _bench_row("a", 3.0, None)
    del row["representative"]
    d = load_report(_folder(tmp_path, [row]))
    assert d["speedup_means"] == {} and d["bench"][0]["speedup_withheld"] == NOT_REPRESENTATIVE
    json.dumps(d["bench"])
