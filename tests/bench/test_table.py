"""The README's performance table is generated from benchmarks/results/, never typed."""

from pathlib import Path

import pytest

from speedlight import cli, results
from speedlight.bench import table

ROOT = Path(__file__).resolve().parents[2]


def _row(case, up, sol=80.0, device="NVIDIA H200", **extra):
    return {"tool": "bench", "op": "rms_norm", "implementation": "speedlight", "case_id": case,
            "mode": "fwd", "dtype": "bf16", "status": "ok", "representative": True,
            "device": device, "git": "abc123def4567", "timestamp": "2026-01-02T00:00:00+00:00",
            "sol_pct": sol, "sol_roof": "measured",
            "speedup": {"torch-eager": up, "torch-compile": up / 2, "liger": None}, **extra}


def test_the_readme_section_is_what_the_committed_files_give():
    readme = (ROOT / "README.md").read_text()
    body = table.markdown(table.collect(ROOT / "benchmarks" / "results"))
    assert table.replace_section(readme, body) == readme, (
        "README's performance table is stale: run "
        "`python -m speedlight bench table benchmarks/results --readme README.md`")


def test_without_gpu_results_it_says_so():
    cpu_only = [_row("a", 2.0, representative=False)]
    text = table.markdown(cpu_only)
    assert text.startswith("No GPU results are committed yet")
    assert "NOT representative" in table.markdown(cpu_only, include_cpu=True)


def test_geometric_means_and_median_sol_from_the_rows():
    rows = [_row("a", 2.0, 70.0), _row("b", 8.0, 90.0), _row("c", 1.0, status="error"),
            _row("d", 3.0, device="NVIDIA H100 80GB HBM3")]
    text = table.markdown(rows)
    assert "**NVIDIA H200**" in text and "**NVIDIA H100 80GB HBM3**" in text
    h200 = text.split("**NVIDIA H100")[0]
    assert "| rms_norm | fwd | bf16 | 2 of 3 | 80% | 4.00x (2) | 2.00x (2) | - |" in h200


def test_a_heterogeneous_cluster_gives_one_section_per_gpu_model():
    """A --ray sweep over two GPU models on three hosts: the same case timed on each model
    is in each model's section; hosts of one model share a section."""
    rows = [_row("a", 2.0, device="NVIDIA H200", host="node1"),
            _row("b", 4.0, device="NVIDIA H200", host="node2"),
            _row("a", 3.0, device="NVIDIA H100 80GB HBM3", host="node3")]
    text = table.markdown(rows)
    h200, h100 = text.split("**NVIDIA H100 80GB HBM3**")
    assert "**NVIDIA H200**" in h200
    assert "| rms_norm | fwd | bf16 | 2 of 2 | 80% | 2.83x (2) |" in h200
    assert "| rms_norm | fwd | bf16 | 1 of 1 | 80% | 3.00x (1) |" in h100


def test_cli_writes_and_checks_the_readme(tmp_path):
    results_dir = tmp_path / "results" / "h200"
    results.append_jsonl(results_dir / "bench.jsonl", [_row("a", 2.0)])
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{table.START}\nold\n{table.END}\n\nafter\n")
    args = ["bench", "table", str(tmp_path / "results"), "--readme", str(readme)]
    assert cli.main(args + ["--check"]) == 1
    assert cli.main(args) == 0
    text = readme.read_text()
    assert "2.00x (1)" in text and text.endswith("after\n") and "old" not in text
    assert cli.main(args + ["--check"]) == 0


def test_a_readme_without_markers_is_an_error():
    with pytest.raises(ValueError, match="no generated section"):
        table.replace_section("# nothing here\n", "body")
