"""Predict every representative GPU row under benchmarks/results from the kernels at the
revision the row records, and set each prediction beside the measurement.

    python scripts/predict_rows.py                     # every run folder, every SKU
    python scripts/predict_rows.py --ops rms_norm --out /tmp/check.jsonl

For each revision the rows name, that revision's `speedlight/` is taken from git (`git
archive`, into a temporary folder) and its own inspect captures each case's launches (sized
for the row's SKU, recorded without running) and compiles them for the SKU's arch, in a
process of its own; today's inspect then reads the compiled code (loops, iterations from the
TTIR, occupancy) and today's model (speedlight/predict.py) predicts each launch on the SKU,
with the run's measured ceilings (the probe's copy bandwidth) where the rows carry them. A
direction's prediction is the sum of its launches; fwd+bwd rows the sum of both.

The model's fitted constants (predict.LAUNCH_S, predict.MEMORY_LATENCY_NS) are set from the
rows listed in FIT, and those rows are marked "fit"; every other row is "held-out": no
constant has seen it. The summary gives the median absolute error of each group and whether
each bound is the one the op's family expects. Rows the model cannot predict (a CUDA C++
kernel, whose loops have no TTIR to count) are listed with the reason. Written to
benchmarks/results/cpu/predicted-vs-measured.jsonl by default: every number in it was
computed on a CPU and is labelled predicted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from speedlight.results import environment, read_jsonl, write_atomic  # noqa: E402

# Rows whose run was measured from a revision with uncommitted changes: the run's entry in
# benchmarks/results/README.md names the revision its kernels were at.
DIRTY_RUNS = {"2026-12-04-run2": "aad001b"}
# The rows the model's constants are set from (op, case label, mode, run folder): the launch
# of a one-row case replayed from a CUDA graph (LAUNCH_S["graph"]) and, for its forward and
# backward timed with events, launched from the host (LAUNCH_S["stream"]: the row's two
# launches share it), and a memory-bound row whose loads are used where they are issued
# (MEMORY_LATENCY_NS: the latency a loaded memory system shows). Work an op does outside its
# Triton kernels (a torch reduction in a backward) is not modelled: the backward rows' error
# shows it.
FIT = {
    ("rms_norm", "rows1-hidden4096", "fwd", "2026-12-04-run1"): "launch graph",
    ("rms_norm", "rows1-hidden4096", "fwd+bwd", "2026-12-04-run1"): "launch stream",
    ("rms_norm", "rows4096-hidden4096", "fwd", "2026-12-04-run1"): "memory latency",
}
# The bound a family's kernels should show at these sizes (issue 54's targets); a row that
# measured under TINY_US (one row of a norm) is a launch's (or its latency's), whatever the op.
EXPECTED = {"attention": ("issue", "latency"), "matmul": ("tensor",), "gated_matmul": ("tensor",),
            "rms_norm": ("memory", "memory-latency"),
            "add_rms_norm": ("memory", "memory-latency")}
TINY_US = 20.0

DRIVER = r'''
import json, shutil, sys, torch
from pathlib import Path
from speedlight import registry
from speedlight.inspect.run import inspect_cases
from speedlight.target import resolve

request = json.loads(sys.stdin.read())
target = resolve(request["arch"], sku=request["sku"])
out = Path(request["out"])
import dataclasses
from speedlight.spec import Case, parse_dtype
items = []
for op, d in request["cases"]:
    spec = registry.builtin_spec(op)
    # asked as for a GPU: a case too large for the interpreter is still recorded (dry)
    spec = dataclasses.replace(spec, skip=lambda c, dev, f=spec.skip: f(c, torch.device("cuda")))
    items.append((spec, Case(d["op"], d["params"], dtype=parse_dtype(d["dtype"]),
                  layout=d.get("layout", "contiguous"), flags=d.get("flags") or {},
                  seed=d.get("seed", 0), model=d.get("model"))))
reports = inspect_cases(items, target, mode="dry")
done = []
for n, r in enumerate(reports):
    kernels = []
    for m, k in enumerate(r.kernels):
        entry = {"direction": k.launch.direction, "kernel": k.launch.kernel,
                 "error": getattr(k, "error", "") or getattr(k.compiled, "error", ""),
                 "launch": {"grid": list(k.launch.grid), "num_warps": k.launch.num_warps,
                            "num_stages": k.launch.num_stages, "index": k.launch.index,
                            "args": [a.to_json() for a in k.launch.args]}}
        c = k.compiled
        if c is not None and not entry["error"]:
            folder = out / f"{n}-{m}"
            folder.mkdir(parents=True, exist_ok=True)
            files = {}
            for stage in ("sass", "ttir", "ttgir"):
                if stage in c.files:
                    shutil.copyfile(c.files[stage], folder / f"k.{stage}")
                    files[stage] = str(folder / f"k.{stage}")
            entry.update(files=files, meta=json.loads(json.dumps(c.meta, default=str)),
                         name=c.name)
        kernels.append(entry)
    done.append({"op": r.op, "case": r.case.id, "error": r.error or getattr(r, "skipped", ""),
                 "kernels": kernels})
print(json.dumps(done))
'''


def _case(d: dict):
    from speedlight.spec import Case, parse_dtype

    return Case(d["op"], d["params"], dtype=parse_dtype(d["dtype"]),
                layout=d.get("layout", "contiguous"), flags=d.get("flags") or {},
                seed=d.get("seed", 0), model=d.get("model"))


def _revision(row: dict, run: str) -> str:
    rev = str(row.get("git", "")).replace("-dirty", "")
    return DIRTY_RUNS.get(run, rev[:12]) if str(row.get("git", "")).endswith("-dirty") else rev[:12]


def _rows(results: Path, ops: set | None) -> list[dict]:
    out = []
    for path in sorted(results.glob("*/*/**/bench.jsonl")):
        run = path.relative_to(results).parts[1]
        sku = path.relative_to(results).parts[0]
        for r in read_jsonl(path):
            if (r.get("tool") != "bench" or not r.get("representative") or r.get("status") != "ok"
                    or not str(r.get("implementation", "")).startswith("speedlight")
                    or (ops and r.get("op") not in ops) or not r.get("median_us")):
                continue
            out.append(dict(r, _run=run, _sku=sku, _file=str(path.relative_to(ROOT))))
    return out


def _materialize(rev: str, where: Path) -> Path:
    """The revision's speedlight/ package, from git, under `where`."""
    dest = where / rev
    if not dest.exists():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "--format=tar", rev, "speedlight"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        tar_path = where / f"{rev}.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as t:
            t.extractall(dest, filter="data")
    return dest


def _compile_at(tree: Path, cases: list, arch: str, sku: str, out: Path) -> list[dict]:
    """The old tree's inspect, in a process of its own, captures and compiles the cases
    (kept in `out`: a later run with the same --work folder and cases reads them again)."""
    kept = out / "compiled.json"
    if kept.exists():
        done = json.loads(kept.read_text())
        if done.get("cases") == cases and done.get("arch") == arch and done.get("sku") == sku:
            return done["reports"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tree), TRITON_INTERPRET="1")
    req = {"arch": arch, "sku": sku, "out": str(out), "cases": cases}
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(req), cwd=tree,
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the revision's inspect failed: {done.stderr.strip()[-600:]}")
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    out.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({"cases": cases, "arch": arch, "sku": sku, "reports": reports}))
    return reports


def _read_kernel(entry: dict, target, sku):
    """Today's reading of one compiled kernel of the old tree: (KernelReport, instructions,
    TTIR) or (None, why, None)."""
    from speedlight.inspect import case_report, sass
    from speedlight.inspect.compile import Compiled
    from speedlight.inspect.launches import Launch
    from speedlight.inspect.specialise import Arg
    from speedlight.spec import KernelDesign

    if entry.get("error") or "files" not in entry:
        return None, entry.get("error") or "not compiled", None
    ln = entry["launch"]
    args = [Arg(a["name"], a["kind"], a.get("value")) for a in ln["args"]]
    launch = Launch(entry["direction"], ln["index"], entry["kernel"], "", entry["kernel"], "",
                    args, tuple(ln["grid"]), {}, {}, {}, {}, num_warps=ln["num_warps"],
                    num_stages=ln["num_stages"])
    compiled = Compiled(entry["name"], target, entry["files"], entry["meta"])
    k = case_report.analyse_kernel(launch, compiled, target, sku, KernelDesign())
    return k, sass.parse(compiled.text("sass")), compiled.text("ttir")


class Row:
    """One measured row with the compiled kernels that serve it."""

    def __init__(self, row: dict, revision: str, kernels: list, why: str):
        self.row, self.revision, self.kernels, self.why = row, revision, kernels, why
        self.kind = "graph" if (row.get("timing") or {}).get("method") == "cuda-graph" \
            else "stream"
        self.fit = FIT.get((row["op"], row["case_label"], row["mode"], row["_run"]))

    def predict(self, sku, constants: dict):
        """(seconds, bound, per-kernel parts) with the model's constants, or None."""
        from speedlight.inspect import prediction

        if self.why:
            return None
        total, bounds, parts = 0.0, [], []
        for k, instrs, ttir in self.kernels:
            p, why = prediction.predict_kernel(
                k, instrs, ttir, sku, launch=self.kind, bandwidth=self.row.get("sol_bandwidth"),
                matmul_flops=self.row.get("sol_peak_flops"),
                memory_latency_ns=constants["memory_latency_ns"],
                launch_s=constants["launch_s"])
            if p is None:
                self.why = f"{k.name}: {why}"
                return None
            total += p.seconds
            bounds.append((p.seconds, p.bound))
            parts.append({"kernel": k.name, "us": round(p.us, 3), "bound": p.bound})
        return total, max(bounds)[1] if bounds else "launch", parts


def newest_ceilings(rows: list[dict]) -> None:
    """Every row of a SKU takes the newest run's probe ceilings (copy bandwidth, bf16
    matmul): they are the GPU's, not the run's, and a later probe is the better one (the
    first H200 run's matmul ceiling was measured back to back, unflushed: README)."""
    newest: dict = {}
    for r in rows:
        if r.get("sol_roof") == "measured" and r.get("sol_bandwidth"):
            if r["_sku"] not in newest or r["timestamp"] > newest[r["_sku"]]["timestamp"]:
                newest[r["_sku"]] = r
    for r in rows:
        best = newest.get(r["_sku"])
        if best is not None:
            r["sol_bandwidth"], r["sol_peak_flops"] = best["sol_bandwidth"], best["sol_peak_flops"]


def gather(rows: list[dict], work: Path) -> list[Row]:
    """Each row with its revision's kernels, compiled once per revision and read today."""
    from speedlight.target import resolve

    newest_ceilings(rows)

    by_rev: dict[tuple, list] = {}
    for r in rows:
        by_rev.setdefault((_revision(r, r["_run"]), r["_sku"]), []).append(r)
    out = []
    for (rev, sku_key), group in sorted(by_rev.items()):
        target = resolve(None, sku=sku_key)
        triton = [r for r in group if r["implementation"] == "speedlight"]
        cases = []
        for r in triton:
            if [r["op"], r["case"]] not in cases:
                cases.append([r["op"], r["case"]])
        compiled = _compile_at(_materialize(rev, work), cases, target.arch_name, sku_key,
                               work / f"{rev}-k") if cases else []
        by_case = {c["case"]: c for c in compiled}
        read: dict = {}
        for r in group:
            if r["implementation"] != "speedlight":
                out.append(Row(r, rev, [], "a CUDA C++ implementation: its loops have no TTIR "
                                             "to count iterations from"))
                continue
            got = by_case.get(_case(r["case"]).id)
            if got is None or got.get("error"):
                out.append(Row(r, rev, [], (got or {}).get("error") or
                               "the revision's inspect reported no case"))
                continue
            directions = ("fwd", "bwd") if r["mode"] == "fwd+bwd" else (r["mode"],)
            kernels, why = [], ""
            for n, entry in enumerate(got["kernels"]):
                if entry["direction"] not in directions:
                    continue
                key = (got["case"], n)
                if key not in read:
                    read[key] = _read_kernel(entry, target, target.sku)
                k, instrs, ttir = read[key]
                if k is None:
                    why = f"{entry['kernel']}: {instrs}"
                    break
                kernels.append((k, instrs, ttir))
            out.append(Row(r, rev, kernels, why))
    return out


def fit(rows: list[Row], sku) -> dict:
    """The model's constants from the FIT rows: each launch constant so its row's
    prediction meets the measurement, the memory latency by bisection on its row; over
    again until they settle."""
    from speedlight import predict

    constants = {"launch_s": dict(predict.LAUNCH_S),
                 "memory_latency_ns": predict.MEMORY_LATENCY_NS[sku.vendor]}
    for _ in range(4):  # each constant moves the others' rows a little: to a fixed point
        for what, kind in (("launch graph", "graph"), ("launch stream", "stream")):
            row = next((r for r in rows if r.fit == what), None)
            if row is None or row.predict(sku, constants) is None:
                continue
            seconds = row.predict(sku, constants)[0]
            n = len(row.kernels)
            compute = seconds - n * constants["launch_s"][kind]
            constants["launch_s"][kind] = max((row.row["median_us"] * 1e-6 - compute) / n, 0.0)
        row = next((r for r in rows if r.fit == "memory latency"), None)
        if row is not None and row.predict(sku, constants) is not None:
            constants["memory_latency_ns"] = _bisect(row, sku, constants, "memory_latency_ns",
                                                     100.0, 5000.0)
    return constants


def _bisect(row: Row, sku, constants: dict, name: str, lo: float, hi: float) -> float:
    """The value of constant `name` (the prediction grows with it) at which the row's
    prediction meets its measurement."""
    for _ in range(24):
        mid = (lo + hi) / 2
        got = row.predict(sku, dict(constants, **{name: mid}))[0]
        lo, hi = (mid, hi) if got < row.row["median_us"] * 1e-6 else (lo, mid)
    return (lo + hi) / 2


def predicted_rows(rows: list[Row], sku, constants: dict) -> list[dict]:
    out = []
    for r in rows:
        m = r.row
        row = {"tool": "predict", "op": m["op"], "case_id": m["case_id"],
               "case_label": m["case_label"], "mode": m["mode"],
               "implementation": m["implementation"], "run": m["_run"], "sku": m["_sku"],
               "rows_file": m["_file"], "revision": r.revision, "timing": r.kind,
               "measured_us": round(m["median_us"], 3),
               "role": f"fit ({r.fit})" if r.fit else "held-out", "predicted": True}
        got = r.predict(sku, constants)
        if got is not None and not r.kernels:
            r.why, got = "the revision's inspect captured no launch in this direction", None
        if got is None:
            row.update(status="unpredicted", reason=r.why)
        else:
            seconds, bound, parts = got
            us = seconds * 1e6
            row.update(status="ok", predicted_us=round(us, 3), bound=bound,
                       error=round((us - m["median_us"]) / m["median_us"], 4), kernels=parts,
                       bound_expected=bound in (("launch", "latency") if m["median_us"] < TINY_US
                                                else EXPECTED.get(m["op"], (bound,))))
        out.append(row)
    return out


def summary(rows: list[dict]) -> dict:
    rows = [r for r in rows if r.get("tool") == "predict"]
    out = {}
    for role in ("fit", "held-out"):
        errs = [abs(r["error"]) for r in rows if r.get("status") == "ok"
                and r["role"].startswith(role)]
        out[role] = {"rows": len(errs), "median_abs_error": round(statistics.median(errs), 4)
                     if errs else None}
    ok = [r for r in rows if r.get("status") == "ok"]
    out["bounds_as_expected"] = f"{sum(r['bound_expected'] for r in ok)} of {len(ok)}"
    out["unpredicted"] = sum(r.get("status") == "unpredicted" for r in rows)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--ops", default=None, help="comma-separated ops (default: every op)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu" /
                                        "predicted-vs-measured.jsonl"))
    p.add_argument("--work", default=None, metavar="DIR",
                   help="keep each revision's tree and compiled kernels here (default: a "
                        "temporary folder); a later run with the same folder compiles nothing")
    args = p.parse_args(argv)
    ops = set(args.ops.split(",")) if args.ops else None
    rows = _rows(Path(args.results), ops)
    if not rows:
        raise SystemExit("predict_rows: no representative speedlight rows found")
    from speedlight import predict
    from speedlight.target import resolve

    sku = resolve(None, sku=rows[0]["_sku"]).sku
    with tempfile.TemporaryDirectory(prefix="speedlight-predict-") as temp:
        work = Path(args.work) if args.work else Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        gathered = gather(rows, work)
        constants = fit(gathered, sku)
        out = predicted_rows(gathered, sku, constants)
    in_code = {"launch_s": predict.LAUNCH_S,
               "memory_latency_ns": predict.MEMORY_LATENCY_NS[sku.vendor]}
    print(f"fitted constants: launch graph {constants['launch_s']['graph'] * 1e6:.2f} us, "
          f"stream {constants['launch_s']['stream'] * 1e6:.2f} us, memory latency "
          f"{constants['memory_latency_ns']:.0f} ns (speedlight/predict.py holds "
          f"{in_code['launch_s']['graph'] * 1e6:.2f}, {in_code['launch_s']['stream'] * 1e6:.2f} "
          f"us and {in_code['memory_latency_ns']:.0f} ns)")
    env = environment("cpu")
    out = [dict(r, **{k: env[k] for k in ("git", "triton", "torch", "timestamp") if k in env})
           for r in out]
    out.append(dict(tool="predict-summary", predicted=True, **summary(out),
                    constants={"launch_graph_us": round(constants["launch_s"]["graph"] * 1e6, 3),
                               "launch_stream_us": round(constants["launch_s"]["stream"] * 1e6, 3),
                               "memory_latency_ns": round(constants["memory_latency_ns"], 1)},
                    fit_rows=[" ".join(k) + f": {v}" for k, v in FIT.items()],
                    **{k: env[k] for k in ("git", "triton", "torch", "timestamp") if k in env}))
    write_atomic(Path(args.out), "".join(json.dumps(r) + "\n" for r in out))
    for r in out[:-1]:
        got = (f"{r['predicted_us']:10.1f} us predicted ({r['bound']}), error {r['error']:+.0%}"
               if r["status"] == "ok" else f"no prediction: {r['reason']}")
        print(f"{r['op']:13s} {r['case_label']:55s} {r['mode']:7s} {r['run']:16s} "
              f"{r['measured_us']:10.1f} us measured  {got}  [{r['role']}]")
    print(json.dumps(out[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
