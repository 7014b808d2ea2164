"""How long `speedlight inspect OP` takes on this machine, op by op (issue 32 item 1: every
kernel of forward and backward compiled and reported in at most 60 s per op on a CPU, cold
Triton cache). These are the tool's own run times, not kernel timings: nothing here runs
on a GPU or says how fast a kernel is.

Each op's default case (`inspect OP`, no --case) runs in a fresh process with an empty
TRITON_CACHE_DIR, once per --target; one JSON line per (op, target) is written with its
wall and CPU seconds (the process and its compile workers), the exit status, the case, the
mode each case was captured in, and the kernels reported per direction.

    python scripts/inspect_times.py --out benchmarks/results/cpu/inspect-times.jsonl
    python scripts/inspect_times.py --ops attention,matmul --targets sm_100a
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _revision() -> str:
    """The checkout's commit, with -dirty when files differ from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True).stdout.strip()
    except OSError:
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def _kernels(rows: list[dict]) -> dict:
    """The kernels reported, per direction ("(error)" after one that did not compile)."""
    out = {"fwd": [], "bwd": []}
    for r in rows:
        if r.get("level") == "kernel":
            out.setdefault(r["direction"], []).append(r["kernel"] + (" (error)" if r.get("error")
                                                                     else ""))
    return out


def time_op(op: str, target: str | None, extra: list[str]) -> dict:
    """One cold run of `speedlight inspect op` in a child process."""
    with tempfile.TemporaryDirectory(prefix="speedlight-times-") as tmp:
        env = dict(os.environ, TRITON_CACHE_DIR=str(Path(tmp) / "triton"))
        env.pop("TRITON_INTERPRET", None)
        cmd = [sys.executable, "-m", "speedlight", "inspect", op, "--out", str(Path(tmp) / "out"),
               *(["--target", target] if target else []), *extra]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        path = Path(tmp) / "out" / "inspect.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    cases = [r for r in rows if r.get("level") == "case"]
    directions = [r for r in rows if r.get("level") == "bytes"]
    first = next(iter(rows), {})
    return {
        "what": "speedlight inspect run time on a CPU (the tool, not a kernel timing)",
        "op": op, "target": target or "default", "args": extra,
        "case": first.get("case_id"), "sku": first.get("sku"), "arch": first.get("target"),
        "exit": proc.returncode, "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "user_s": round(after.ru_utime - before.ru_utime, 1),
        "kernels": _kernels(rows),
        "not_inspected": [{"status": r["status"], "reason": r["reason"]} for r in cases],
        "bytes": [{k: d.get(k) for k in ("direction", "compulsory_bytes", "measured_bytes",
                                         "ratio", "measured_on", "size_compulsory_bytes")}
                  for d in directions],
        "note": next((r.get("note") for r in rows if r.get("level") == "kernel"), None),
        "stderr_tail": proc.stderr.strip().splitlines()[-3:] if proc.returncode else [],
        "git": _revision(), "host": platform.node(), "cpus": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=None, help="comma-separated ops (default: every registered op)")
    p.add_argument("--targets", default="default,sm_100a",
                   help="comma-separated --target values; 'default' passes none (default: "
                        "default,sm_100a)")
    p.add_argument("--out", default=None, help="append the JSON lines here (else stdout only)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more inspect arguments")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from speedlight import registry

    ops = args.ops.split(",") if args.ops else [s.name for s in registry.builtin_specs()]
    extra = [x for x in args.extra if x != "--"]
    over = 0
    for op in ops:
        for target in args.targets.split(","):
            row = time_op(op, None if target == "default" else target, extra)
            line = json.dumps(row)
            print(f"{op:22s} {row['target']:8s} wall {row['wall_s']:6.1f} s  cpu "
                  f"{row['cpu_s']:6.1f} s  exit {row['exit']}  fwd {len(row['kernels']['fwd'])} "
                  f"bwd {len(row['kernels']['bwd'])}", flush=True)
            over += row["wall_s"] > 60 or row["exit"] != 0
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
