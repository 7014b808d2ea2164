"""The loop-level figures of attention's kernels at the headline case, read from their
SASS on a CPU: predicted, never timed. One JSON line per kernel: registers, spills, shared
memory, CTAs per SM, waves and `speedlight inspect`'s findings, and per loop (found by
`speedlight.inspect.loops`, this tree's reader, whatever tree compiled the kernels) the
instructions per iteration per thread, FSEL and ISETP (what a mask costs), MMA FLOPs, and
the issue cost per unit of MMA work in two units: inspect's (warp-instructions per
128 x 128 x 64 of MMA) and issue 49's (per 128 x 64 tile at head dim 128, the two GEMMs
of a forward tile, 4,194,304 FLOPs: twice inspect's figure).

    python scripts/attention_loops.py --label after --out benchmarks/results/cpu/X.jsonl
    python scripts/attention_loops.py --label before --tree /path/to/old/checkout ...

runs `speedlight inspect attention --target sm_90a --case CASE --mode dry --dump DIR`
with the tree's speedlight (PYTHONPATH=--tree) and appends its rows to --out. A loop's
kind (interior, boundary, ...) is read from its `for` statement's source line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from speedlight.inspect.loops import kernel_loops  # noqa: E402

CASE = "batch2-heads32-kv_heads8-seq_q8192-seq_k8192-dim128-causal"
ISSUE_TILE_FLOPS = 2 * (2 * 128 * 64 * 128)  # S = Q K^T and O += P V of a 128 x 64 tile


def run_inspect(tree: Path, work: Path, case: str) -> tuple[Path, list[dict]]:
    """(dump dir, inspect's JSON rows) of the case, compiled by the tree's speedlight."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "speedlight", "inspect", "attention", "--target", "sm_90a",
           "--case", case, "--mode", "dry", "--dump", str(work / "dump"), "--out",
           str(work / "out")]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"inspect failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return work / "dump", [json.loads(x) for x in (work / "out" / "inspect.jsonl").open()]


def _source(tree: Path, file: str, line: int) -> str:
    path = next((tree / "speedlight" / "kernels").rglob(Path(file).name), None)
    if path is None:
        return ""
    lines = path.read_text().splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _kind(source: str) -> str:
    for word in ("interior", "boundary", "fault"):
        if word in source:
            return word
    return "loop"


def loop_rows(tree: Path, sass: str, ttgir: str, num_warps: int) -> list[dict]:
    """Every loop that issues MMA work, with its figures."""
    out = []
    for lp in kernel_loops(sass, num_warps=num_warps, ttgir=ttgir):
        if not lp.mma_flops:
            continue
        source = _source(tree, lp.file, lp.line)
        ops = lp.opcodes
        out.append({
            "at": f"{Path(lp.file).name}:{lp.line}", "source": source, "kind": _kind(source),
            "depth": lp.depth, "steady": lp.steady, "instructions": lp.instructions,
            "FSEL": ops.get("FSEL", 0), "ISETP": ops.get("ISETP", 0),
            "UISETP": ops.get("UISETP", 0), "mma_flops": lp.mma_flops,
            "warp_instructions": lp.warp_instructions,
            "per_128x128x64_mma": round(lp.per_mma_tile, 1),
            "per_128x64_tile_d128": round(lp.warp_instructions * ISSUE_TILE_FLOPS
                                          / lp.mma_flops),
            "pipes": dict(lp.pipes), "barriers": lp.barriers, "tma_loads": lp.tma_loads,
            "top_lines": [ln.to_json(lp.instructions) for ln in lp.lines[:5]]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True, help="before / after: recorded in every row")
    ap.add_argument("--tree", type=Path, default=HERE,
                    help="the checkout whose speedlight is compiled (default: this one)")
    ap.add_argument("--case", default=CASE)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    ap.add_argument("--keep", type=Path, help="keep the dump and inspect's rows here")
    args = ap.parse_args(argv)
    tree = args.tree.resolve()
    revision = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "speedlight"],
                           capture_output=True, text=True, check=False).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        dump, rows = run_inspect(tree, work, args.case)
        files = {p.stem.split("-", 1)[1]: p for p in dump.rglob("*.sass")}
        out = []
        for r in rows:
            if r.get("level") != "kernel" or r["kernel"] not in files:
                continue
            sass = files[r["kernel"]]
            ttgir = sass.with_suffix(".ttgir")
            out.append({
                "tool": "attention_loops", "predicted": True, "label": args.label,
                "git": revision, "tree_modified": bool(dirty), "target": "sm_90a",
                "sku": r.get("sku"), "case": args.case, "direction": r["direction"],
                "kernel": r["kernel"], "grid": r["programs"], "num_warps": r["num_warps"],
                "stages": r.get("stages"), "registers": r["registers"],
                "spill_stores": r["spill_stores"], "spill_loads": r["spill_loads"],
                "smem": r["smem"], "ctas_per_sm": r["occupancy"]["blocks_per_sm"],
                "waves": r["waves"]["waves"] if r.get("waves") else None,
                "findings": [f"{f['severity']} {f['code']}: {f['text']}"
                             for f in r.get("findings", [])],
                "loops": loop_rows(tree, sass.read_text(),
                                   ttgir.read_text() if ttgir.exists() else "",
                                   r["num_warps"])})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for row in out:
            f.write(json.dumps(row) + "\n")
    for row in out:
        print(f"{row['label']:6s} {row['kernel']:32s} regs {row['registers']:3d} spill "
              f"{row['spill_stores']:3d} smem {row['smem']:6d} CTA/SM {row['ctas_per_sm']} "
              f"waves {row['waves']}")
        for lp in row["loops"]:
            print(f"    {lp['kind']:9s} {lp['at']:14s} depth {lp['depth']} {lp['instructions']:5d} "
                  f"instr/thread FSEL {lp['FSEL']:3d} ISETP {lp['ISETP']:3d} "
                  f"{lp['per_128x64_tile_d128']:6d} warp-instr/128x64 tile"
                  f"{'  steady' if lp['steady'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
