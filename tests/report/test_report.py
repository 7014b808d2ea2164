"""`speedlight report`, the main job: end to end on the default model on this machine, the
page rendered in headless Chromium, and every number traced to the stage file it came from."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("jinja2")
pytest.importorskip("matplotlib")

from speedlight import cli
from speedlight.report import render
from speedlight.report.load import NOT_REPRESENTATIVE, load_report

# one report run serves every test here: keep them on one xdist worker, and the run for the
# whole session there (a module fixture is torn down and made again, four minutes of CPU,
# whenever the worker runs another module's test between two of these)
pytestmark = pytest.mark.xdist_group("report")

USER_SPEC = Path(__file__).resolve().parents[2] / "examples" / "relu_squared.py"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    # one seed per verified case: the verify tests draw several; here the stages are the point
    code = cli.main(["report", "--out", str(out), "--steps", "1", "--bench-budget", "10",
                     "--seeds", "1", "--spec", str(USER_SPEC)])
    return out, code


def test_report_runs_end_to_end_and_writes_every_stage(report_dir):
    out, code = report_dir
    assert code == 0, (out / "manifest.json").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    not_ok = {k: v for k, v in manifest["stages"].items() if v["status"] != "ok"}
    # the training-step comparison runs on a GPU only, and says so on a CPU
    assert list(not_ok) == ["model_step"] and "GPU only" in not_ok["model_step"]["reason"]
    for key, name in manifest["files"].items():
        assert (out / name).exists() or key in not_ok, name
    assert not (out / manifest["files"]["model_step"]).exists()
    assert (out / "index.html").exists() and (out / "summary.md").exists()
    patch = json.loads((out / "patch.json").read_text())
    assert {"rms_norm", "rope", "cross_entropy"} <= set(patch["patched"])
    check = json.loads((out / "model-check.json").read_text())
    assert check["passed"] and check["train"] and len(check["checks"]) > 10
    # the check ran on the whole patch, the decoder-layer fusion included, and says so
    layers = check["patch"]["kinds"]["decoder_layer"]
    assert layers == len(patch["patched"]["decoder_layer"]) > 0
    assert patch["layer_fusion"] == check["patch"]["layer_fusion"]
    assert check["patch"]["layer_fusion"].startswith(f"applied: {layers} decoder layer")
    fusion = f"Decoder-layer fusion {check['patch']['layer_fusion']}; the check ran on it"
    assert fusion in (out / "summary.md").read_text()
    assert fusion.replace("'", "&#39;") in (out / "index.html").read_text()


def test_a_teams_own_op_goes_through_every_stage(report_dir):
    out, _ = report_dir
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run"]["spec_files"] == [str(USER_SPEC)]
    assert "quick suite" in manifest["cases_from"]["relu_squared"]
    assert manifest["cases_from"]["rms_norm"] == "the model's shapes"
    for name in ("verify", "bench"):
        rows = [json.loads(l) for l in (out / f"{name}.jsonl").read_text().splitlines()]
        ours = [r for r in rows if r["op"] == "relu_squared"]
        assert ours and all(r["target"] == "h200" for r in rows), name
    assert any(r["status"] == "pass" for r in
               map(json.loads, (out / "verify.jsonl").read_text().splitlines())
               if r["op"] == "relu_squared")
    inspect = json.loads((out / "inspect.json").read_text())
    assert inspect["target"] == "sm_90a" and inspect["sku"] == "NVIDIA H200"
    assert any(k["op"] == "relu_squared" for k in inspect["kernels"])
    before = json.loads((out / "profile-before.json").read_text())
    assert before["target"]["key"] == "h200" and before["target"]["origin"] == "the default"
    assert before["run"]["steps"] == 1


def test_numbers_come_from_the_stage_files(report_dir):
    out, _ = report_dir
    before = json.loads((out / "profile-before.json").read_text())
    after = json.loads((out / "profile-after.json").read_text())
    md = (out / "summary.md").read_text()
    step = re.search(r"\| step time \(measured[^)]*\) \| (.+?) \| (.+?) \|", md)
    assert step.group(1) == render.fmt_time(before["summary"]["step_time_s"])
    assert step.group(2) == render.fmt_time(after["summary"]["step_time_s"])
    floors = re.search(r"\| sum of floors on .+? \| (.+?) \| (.+?) \|", md)
    assert floors.group(1) == render.fmt_time(before["summary"]["floor_s"])
    verify_rows = [json.loads(l) for l in (out / "verify.jsonl").read_text().splitlines()]
    passed = {r["case"]["id"] for r in verify_rows if r["status"] == "pass"}
    d = load_report(out)
    assert d["verify_counts"]["pass"] == len(passed) and passed
    bench_rows = [json.loads(l) for l in (out / "bench.jsonl").read_text().splitlines()]
    ours = [r for r in bench_rows if r["implementation"] == "speedlight" and r.get("median_us")]
    for r in ours:
        assert render.fmt_us(r["median_us"]) in md


def test_cpu_report_says_its_timings_are_not_representative(report_dir):
    out, _ = report_dir
    html = (out / "index.html").read_text()
    assert 'id="not-representative"' in html and "Triton interpreter" in html
    assert "not representative" in (out / "summary.md").read_text()


def test_cpu_report_gives_no_step_speedup_and_each_fact_its_own_line(report_dir):
    """On a CPU the step time's after/before is interpreter time, not a speed: it is not
    the page's first ratio; "0 failed" is not shown as a failure; summary.md keeps each
    bullet on its own line and gives a bench row that did not run its reason."""
    out, _ = report_dir
    md = (out / "summary.md").read_text()
    html = (out / "index.html").read_text()
    step = next(line for line in md.splitlines() if line.startswith("| step time"))
    assert "not a speed" in step and not re.search(r"\d\.\d+x", step), step
    assert "not a speed" in html
    assert not re.search(r'class="fail">0 failed', html)
    assert not re.search(r"[^\n]- Ops at the model's shapes", md)
    bench_rows = [json.loads(l) for l in (out / "bench.jsonl").read_text().splitlines()]
    skipped = [r for r in bench_rows if r["implementation"] == "speedlight"
               and r["status"] != "ok"]
    for r in skipped:
        assert f"{r['status']}: {r['reason']}" in md


def test_cpu_report_shows_no_per_op_speedup_from_interpreter_timings(report_dir):
    """bench.jsonl holds the interpreter's ratios, but no view shows one and no average
    takes one: the per-op tables say "not representative", the first screen and terminal
    say how many were withheld, and no speedup chart is drawn."""
    out, _ = report_dir
    bench_rows = [json.loads(l) for l in (out / "bench.jsonl").read_text().splitlines()]
    withheld = [r for r in bench_rows if r["implementation"] == "speedlight"
                and any(v is not None for v in (r.get("speedup") or {}).values())]
    assert withheld and not any(r["representative"] for r in withheld)
    md = (out / "summary.md").read_text()
    html = (out / "index.html").read_text()
    assert "Geometric-mean speedup" not in md and "Geometric-mean speedup" not in html
    line = f"- Per-op speedups: none shown; {len(withheld)} rows were timed on the Triton"
    assert line in md and line[2:] in html
    per_op = md.split("## Per-op speed")[1].split("## ")[0]
    assert per_op.count(NOT_REPRESENTATIVE) == len(withheld)
    assert not re.search(r"\d\.\d\dx", per_op), per_op
    speed = html.split('id="speed"')[1].split('id="correctness"')[0]
    assert "<svg" not in speed and "No speedup chart" in speed
    assert not re.search(r"\d\.\d\dx", speed)
    assert load_report(out)["speedup_means"] == {}


def test_charts_and_sections_are_labelled_by_what_they_show(report_dir):
    out, _ = report_dir
    html = (out / "index.html").read_text()
    time = html.split('id="time"')[1].split('id="projection"')[0]
    assert "Where the time goes</h2>" in time and "original model" in time
    assert "patched with speedlight" in time, "the chart's patched bars are not labelled"
    assert "The original model's costliest ops</h3>" in time
    assert "The original model's ops on the NVIDIA H200 roof" in html


def test_header_and_every_row_name_the_versions(report_dir):
    """torch, triton, transformers and CUDA in the header of both pages, and in every row
    of verify.jsonl and bench.jsonl, as the environment has them."""
    import torch
    import transformers
    import triton

    out, _ = report_dir
    want = {"torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__, "cuda": torch.version.cuda}
    line = render.versions_line(want)
    assert line.startswith(f"torch {torch.__version__}, triton {triton.__version__}, "
                           f"transformers {transformers.__version__}, CUDA ")
    assert line in (out / "summary.md").read_text().splitlines()[2]
    assert line in (out / "index.html").read_text()
    for name in ("verify.jsonl", "bench.jsonl"):
        for row in map(json.loads, (out / name).read_text().splitlines()):
            assert {k: row.get(k, "missing") for k in want} == want, (name, row["case_id"])


def test_summary_lists_the_stage_files_that_were_written(report_dir):
    out, _ = report_dir
    manifest = json.loads((out / "manifest.json").read_text())
    written = [s["file"] for s in manifest["stages"].values()
               if s["status"] == "ok" and s.get("file")]
    last = (out / "summary.md").read_text().rstrip().splitlines()[-1]
    assert last == "Stage files: " + ", ".join(f"[{f}]({f})" for f in written) + "."
    assert manifest["stages"]["model_step"]["status"] == "skipped"  # the last stage: no ", ."


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed "
                                             "(.ci/run installs it)")
def test_page_renders_in_headless_chromium(report_dir, tmp_path):
    out, _ = report_dir
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    url = (out / "index.html").resolve().as_uri()
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120).stdout
    for section in ("summary", "time", "bounds", "speed", "correctness", "compiler", "stages"):
        assert f'id="{section}"' in dom, section
    assert dom.count("<svg") >= 2, "the charts did not render"  # no speedup chart on a CPU
    assert "{{" not in dom and "Undefined" not in dom
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1200,2400", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000


def test_a_failed_stage_is_shown_and_fails_the_run(report_dir, tmp_path):
    out, _ = report_dir
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["stages"]["bench"] = {"title": "bench", "status": "failed", "error": "RuntimeError: boom"}
    (broken / "manifest.json").write_text(json.dumps(manifest))
    check = json.loads((broken / "model-check.json").read_text())
    check["passed"], check["failed"] = False, ["logits"]
    (broken / "model-check.json").write_text(json.dumps(check))
    render.render(broken)
    html = (broken / "index.html").read_text()
    assert "RuntimeError: boom" in html and "patched model differs from the original" in html
    assert render.has_failures(broken)


def test_cpu_report_adds_the_real_size_projection_of_the_family(report_dir):
    out, _ = report_dir
    doc = json.loads((out / "profile-projected.json").read_text())
    assert doc["run"]["model"] == "llama-3-8b" and doc["run"]["seq"] == 4096
    assert doc["measured"]["time"] == "projected" and doc["run"]["mode"] == "train"
    assert [r["target"] for r in doc["comparison"]["rows"]] == ["h100-sxm", "h200", "b200"]
    assert doc["target"]["key"] == "h200"  # the report's own target, as in every stage
    data = load_report(out)
    assert data["projection"]["floor_s"] == doc["summary"]["floor_s"]
    page = (out / "index.html").read_text()
    assert "At real size: llama-3-8b" in page and "projected floor" in page
    assert (out / "profile-projected.html").exists()

    # the plan on a CPU: nothing timed, every kind unmeasured, the projection's floors its
    # only estimate, labelled projected; no ratio anywhere
    plan = json.loads((out / "plan.json").read_text())
    assert plan["timed"] is False and plan["key"]["gpu"] == "cpu"
    assert {d["verdict"] for d in plan["decisions"].values()} == {"unmeasured"}
    assert all(d["ratio"] is None and d["ours_s"] is None for d in plan["decisions"].values())
    assert plan["projected"]["floor_s"] == doc["summary"]["floor_s"]
    assert "projected" in plan["projected"]["label"] and "llama-3-8b" in plan["projected"]["label"]
    assert [r["kind"] for r in data["plan"]["rows"]] == list(plan["decisions"])
    assert "<b>Not timed.</b>" in page and '<td class="unmeasured">unmeasured</td>' in page
    md = (out / "summary.md").read_text()
    assert "**Not timed**" in md and "| rms_norm | unmeasured | - | not timed | - |" in md
    assert plan["projected"]["label"] in md
