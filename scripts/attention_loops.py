"""The loop-level figures of attention's kernels, read from their SASS on a CPU (predicted,
never timed): per loop, instructions per iteration per thread by kind, FSEL and ISETP (the
mask), tensor-core FLOPs per iteration, and the issue cost normalized by MMA work
(warp-instructions per 128x64 tile's worth of MMA FLOPs); per kernel, registers, spills,
shared memory, CTAs per SM, waves and `speedlight inspect`'s findings.

    python scripts/attention_loops.py --label after --out benchmarks/results/cpu/X.jsonl
    python scripts/attention_loops.py --label before --tree /path/to/old/checkout ...

runs `speedlight inspect attention --target sm_90a --case CASE --mode dry --dump DIR`
with the tree's speedlight (PYTHONPATH=--tree) and appends one JSON line per kernel to
--out. A loop is a backward branch (BRA to a label above it); its body runs from the
label to the branch. The figure the issue asks for: warp-instructions per tile =
instructions per thread per iteration x 4 (the warps of a warpgroup) / the iteration's
MMA FLOPs per warpgroup x the FLOPs of a 128x64 tile at head dim 128 (two GEMMs,
4,194,304): adding warps or changing tiles does not move it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

CASE = "batch2-heads32-kv_heads8-seq_q8192-seq_k8192-dim128-causal"
TILE_FLOPS = 2 * (2 * 128 * 64 * 128)  # S = Q K^T and O += P V of one 128x64 tile, d 128
WARPS_PER_WARPGROUP = 4

_LABEL = re.compile(r"^(\.L_x_\d+):")
_LOC = re.compile(r'^\s*//## File "([^"]+)", line (\d+)')
_INSTR = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
                    r"\s*([^;]*)")
_BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_GMMA_SHAPE = re.compile(r"\.(\d+)x(\d+)x(\d+)\.")
KINDS = {  # the pipes and roles an instruction is counted under
    "mma": ("HGMMA", "HMMA", "UTCHMMA", "WARPGROUP"),
    "fma": ("FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "F2FP", "FCHK", "HADD2", "HMUL2",
            "HFMA2"),
    "mufu": ("MUFU",),
    "int": ("IMAD", "IADD3", "VIADD", "LEA", "SHF", "LOP3", "ISETP", "SEL", "IABS", "IMNMX",
            "VIMNMX", "PRMT", "MOV", "IMAD.MOV", "CS2R", "S2R", "S2UR", "UIADD3", "UMOV",
            "USHF", "ULEA", "ULOP3", "UISETP", "USEL", "UIMAD", "R2UR", "PLOP3", "P2R", "R2P",
            "VOTEU", "VOTE", "UPRMT", "USHL", "ISCADD"),
    "memory": ("LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LDGSTS", "LDGDEPBAR", "DEPBAR",
               "UTMALDG", "UTMAPF", "SYNCS", "LDC", "ULDC", "ARRIVES", "UBLKCP"),
    "sync": ("BAR", "WARPSYNC", "BSSY", "BSYNC", "NOP", "YIELD", "CCTL"),
    "shuffle": ("SHFL",),
    "branch": ("BRA", "EXIT", "RET", "CALL"),
}


def parse(listing: str) -> list[dict]:
    """Every instruction and label of a SASS listing, in order, with its source line."""
    out, loc = [], ("", 0)
    for text in listing.splitlines():
        m = _LOC.match(text)
        if m:
            loc = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = _LABEL.match(text)
        if m:
            out.append({"label": m.group(1)})
            continue
        m = _INSTR.match(text)
        if m:
            target = _BRANCH_TARGET.search(m.group(4))
            out.append({"opcode": m.group(3), "base": m.group(3).split(".")[0],
                        "target": target.group(1) if target else None, "at": loc})
    return out


def kind(base: str) -> str:
    for name, bases in KINDS.items():
        if base in bases:
            return name
    return "other"


def loops(listing: str) -> list[dict]:
    """Each backward branch's loop: its body's instruction counts per thread."""
    items = parse(listing)
    where = {it["label"]: i for i, it in enumerate(items) if "label" in it}
    out = []
    for i, it in enumerate(items):
        if it.get("base") != "BRA" or it["target"] not in where or where[it["target"]] > i:
            continue
        body = [x for x in items[where[it["target"]]:i + 1] if "opcode" in x]
        bases = Counter(x["base"] for x in body)
        flops = 0
        for x in body:
            if x["base"] == "HGMMA":
                m = _GMMA_SHAPE.search(x["opcode"])
                flops += 2 * int(m.group(1)) * int(m.group(2)) * int(m.group(3))
        lines = Counter(f"{x['at'][0]}:{x['at'][1]}" for x in body)
        per_tile = (round(len(body) * WARPS_PER_WARPGROUP / flops * TILE_FLOPS)
                    if flops else None)
        out.append({"loop_line": f"{it['at'][0]}:{it['at'][1]}", "instructions": len(body),
                    "by_kind": dict(Counter(kind(b) for b in bases.elements())),
                    "FSEL": bases["FSEL"], "ISETP": bases["ISETP"], "UISETP": bases["UISETP"],
                    "SEL": bases["SEL"], "MUFU": bases["MUFU"], "FFMA": bases["FFMA"],
                    "FMUL": bases["FMUL"], "FADD": bases["FADD"], "FMNMX": bases["FMNMX"],
                    "BAR": bases["BAR"], "HGMMA": bases["HGMMA"],
                    "mma_flops_per_warpgroup": flops, "warp_instructions_per_tile": per_tile,
                    "top_lines": lines.most_common(6)})
    return out


def _source_line(tree: Path, where: str) -> str:
    """The text of file:line of the tree's attention kernels (where the loop's branch is)."""
    name, line = where.rsplit(":", 1)
    path = tree / "speedlight" / "kernels" / "attention" / name
    if not path.exists():
        return ""
    lines = path.read_text().splitlines()
    return lines[int(line) - 1].strip() if 0 < int(line) <= len(lines) else ""


def run_inspect(tree: Path, work: Path, case: str) -> tuple[Path, list[dict], str]:
    """(dump dir, inspect's JSON rows, its text) of the case, with the tree's speedlight."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "speedlight", "inspect", "attention", "--target", "sm_90a",
           "--case", case, "--mode", "dry", "--dump", str(work / "dump"), "--out",
           str(work / "out")]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"inspect failed ({done.returncode}):\n{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in (work / "out" / "inspect.jsonl").open()]
    return work / "dump", rows, done.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True, help="before / after: recorded in every row")
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout whose speedlight is compiled (default: this one)")
    ap.add_argument("--case", default=CASE)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    ap.add_argument("--keep", type=Path, help="keep the dump and inspect's rows here")
    args = ap.parse_args(argv)
    tree = args.tree.resolve()
    revision = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "speedlight"],
                           capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        dump, rows, text = run_inspect(tree, work, args.case)
        sass = {p.name.split("-", 1)[1].rsplit(".", 1)[0]: p.read_text()
                for p in dump.rglob("*.sass")}
        out = []
        for r in rows:
            if r.get("level") != "kernel":
                continue
            found = loops(sass.get(r["kernel"], ""))
            for lp in found:
                lp["loop_source"] = _source_line(tree, lp["loop_line"])
            out.append({
                "tool": "attention_loops", "label": args.label, "git": revision,
                "tree_modified": bool(dirty), "predicted": True, "target": "sm_90a",
                "case": args.case, "direction": r["direction"], "kernel": r["kernel"],
                "grid": r["programs"], "num_warps": r["num_warps"], "stages": r.get("stages"),
                "registers": r["registers"], "spill_stores": r["spill_stores"],
                "spill_loads": r["spill_loads"], "smem": r["smem"],
                "ctas_per_sm": r["occupancy"]["blocks_per_sm"],
                "waves": r["waves"]["waves"] if r.get("waves") else None,
                "findings": [f"{f['severity']} {f['code']}: {f['text']}"
                             for f in r.get("findings", [])],
                "loops": [lp for lp in found if lp["mma_flops_per_warpgroup"]],
            })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for row in out:
            f.write(json.dumps(row) + "\n")
    for row in out:
        print(f"{row['label']:6s} {row['kernel']:32s} regs {row['registers']:3d} "
              f"spill {row['spill_stores']:3d} smem {row['smem']:6d} cta/SM "
              f"{row['ctas_per_sm']} waves {row['waves']}")
        for lp in row["loops"]:
            print(f"        loop {lp['loop_line']:16s} {lp['instructions']:5d} instr/thread  "
                  f"FSEL {lp['FSEL']:3d} ISETP {lp['ISETP']:3d}  "
                  f"{lp['warp_instructions_per_tile']} warp-instr/tile  {lp['loop_source'][:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
