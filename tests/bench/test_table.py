"""The README's performance table is generated from benchmarks/results/, never typed."""

import re
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
    assert "2.00x (1)" in text and text.endswith("after\n") and "\nold\n" not in text
    assert cli.main(args + ["--check"]) == 0


def test_a_readme_without_markers_is_an_error():
    with pytest.raises(ValueError, match="no generated section"):
        table.replace_section("# nothing here\n", "body")


def _step(variant, ratio, **extra):
    return {"tool": "bench-model", "variant": variant, "implementation": variant,
            "status": "ok", "representative": True, "device": "NVIDIA H200", "git": "abc123def4567",
            "timestamp": "2026-01-02T00:00:00+00:00", "model": "llama-3-8b", "layers": 4,
            "dtype": "bf16", "batch": 4, "seq": 4096, "median_s": 0.3 / ratio,
            "tokens_per_s": 16384 * ratio / 0.3, "speedup_vs_hf": ratio,
            "peak_bytes": 40 * 2 ** 30, "loss_agrees": True, **extra}


def test_each_run_is_named_with_its_date_revision_versions_and_step(tmp_path):
    """Rows in two run folders: each run's line has its date, revision and versions (the
    transformers version from the run's versions.json where its rows lack it), and the
    training step's ratios to hf come from its model-step rows."""
    run1, run2 = tmp_path / "h200" / "2026-01-02-run1", tmp_path / "h200" / "2026-02-03-run2"
    old = dict(torch="2.11.0+cu130", triton="3.6.0", cuda="13.0")
    results.append_jsonl(run1 / "bench.jsonl", [_row("a", 2.0, **old)])
    results.write_json(run1 / "versions.json", dict(old, transformers="5.17.0"))
    results.append_jsonl(run1 / "model-step" / "model-step.jsonl",
                         [_step("hf", 1.0, **old), _step("speedlight", 1.11, **old),
                          _step("liger", 1.15, **old)])
    new = dict(torch="2.15.0+cu130", triton="3.9.0", cuda="13.0", transformers="5.25.0")
    results.append_jsonl(run2 / "attention" / "bench.jsonl",
                         [_row("b", 4.0, git="fedcba9876543-dirty",
                               timestamp="2026-02-03T00:00:00+00:00", **new)])
    text = table.markdown(table.collect(tmp_path))
    assert ("| `h200/2026-01-02-run1` | 2026-01-02 | abc123def456 | 2.11.0+cu130 | 3.6.0 | "
            "5.17.0 | 13.0 |") in text
    assert ("| `h200/2026-02-03-run2` | 2026-02-03 | fedcba987654-dirty | 2.15.0+cu130 | 3.9.0 "
            "| 5.25.0 | 13.0 |") in text
    for variant, ratio in (("speedlight", 1.11), ("liger", 1.15)):
        assert re.search(rf"\| `h200/2026-01-02-run1` \| llama-3-8b, 4 layers, bf16, 4 x 4096 "
                         rf"tokens \| {variant} \| [\d.]+ ms \| [\d,]+ \| {ratio:.2f}x \|", text)
    # each op line names the run its newest rows came from
    assert re.search(r"\| rms_norm \| fwd \| bf16 \| 2 of 2 \| .* \| 2026-01-02-run1, "
                     r"2026-02-03-run2 \| - \|", text)


def test_rows_that_may_hold_host_time_are_counted_on_their_line():
    """A row whose host took longer to enqueue a call than the spin before it (the GPU
    waited on the host) is flagged; one whose spin covered the host is not."""
    waited = {"host_us": 2400.0, "lead_us": 2000.0}
    covered = {"host_us": 300.0, "lead_us": 450.0}
    rows = [_row("a", 2.0, timing=waited), _row("b", 2.0, timing=covered),
            _row("c", 2.0, timing=waited, status="error"), _row("d", 2.0)]
    assert [table.host_time(r) for r in rows] == [True, False, True, False]
    text = table.markdown(rows)
    assert re.search(r"\| rms_norm \| fwd \| bf16 \| 3 of 4 \| .* \| 1 of 3 \|\n", text)
    assert "may hold host time" in text and "timing.host_us > timing.lead_us" in text


def test_the_readme_gives_the_training_step_measured_in_the_committed_runs():
    """speedlight's and Liger's ratios to hf in the README are those of the model-step rows
    under benchmarks/results/ (read here, not typed)."""
    rows = [r for r in table.collect(ROOT / "benchmarks" / "results")
            if r.get("tool") == "bench-model" and r.get("representative") and r["status"] == "ok"]
    assert {"hf", "speedlight", "liger"} <= {r["variant"] for r in rows}
    readme = (ROOT / "README.md").read_text()
    for r in rows:
        assert re.search(rf"\| `{re.escape(r['_run'])}` \| [^|]+ \| {r['variant']} \| [\d.]+ ms \| "
                         rf"[\d,]+ \| {r['speedup_vs_hf']:.2f}x \|", readme), r["variant"]
