"""Attention forward's issue cost per tile, read from SASS on a CPU (predicted, never
timed): the Gluon kernels (sm_90a, sm_100a) beside the Triton kernel, at the headline
case (batch 2, 32 heads, 8 KV heads, 8192 tokens, head dim 128, causal, bf16).

    python scripts/attention_gluon_loops.py --out benchmarks/results/cpu/attention-gluon-loops-REV.jsonl
    python scripts/attention_gluon_loops.py --label before ...  (copied into an older tree)

Each kernel is captured dry and compiled as `speedlight inspect attention --impl ...
--target ...` does. Per role, its main loop is the innermost loop (a backward branch
and the code from its label) holding the role's work: HGMMA or UTCHMMA (the MMA issuer),
MUFU (softmax), UTMALDG (the producer); the Triton kernel has one loop (a branch back
from code past the function's EXIT, where an mbarrier wait retries, is no loop). A loop's
instructions per thread per iteration are counted whole and on the interior path (a
predicated forward branch inside the body that skips code, the boundary mask, taken).
The figure, as for the Triton kernel: warp-instructions per tile = the warp-instructions
every role issues for one iteration / the MMA FLOPs of that iteration x TILE_FLOPS (the
two GEMMs of a 128 x 64 tile at head dim 128), so neither warps nor tile shapes move it.
A role's warps: 4 per warpgroup (consumers, softmax, the Triton kernel's 8 as launched), 1
for the producer and MMA warps. Per kernel also its whole SASS (instructions, and the
global atomics RED / ATOMG: what a count outside the loops costs) and, with --label, which
tree it is (before / after a change, the script copied into the older tree).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CASE = "batch2-heads32-kv_heads8-seq_q8192-seq_k8192-dim128-causal"
TILE_FLOPS = 2 * (2 * 128 * 64 * 128)  # S = Q K^T and O += P V of one 128x64 tile, d 128

_LABEL = re.compile(r"^(\.L_x_\d+):")
_INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.\w+)*)"
                    r"\s*([^;]*)")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


_LOC = re.compile(r'^\s*//## File "([^"]+)", line (\d+)')


def parse(listing: str) -> list[dict]:
    """Labels and instructions of a SASS listing, in order, each instruction with its
    source (file name, line) from nvdisasm's line info."""
    out, at = [], ("", 0)
    for text in listing.splitlines():
        m = _LOC.match(text)
        if m:
            at = (Path(m.group(1)).name, int(m.group(2)))
            continue
        m = _LABEL.match(text)
        if m:
            out.append({"label": m.group(1)})
            continue
        m = _INSTR.match(text)
        if m:
            target = _TARGET.search(m.group(3))
            out.append({"base": m.group(2).split(".")[0], "predicated": bool(m.group(1)),
                        "target": target.group(1) if target else None, "at": at})
    return out


def mask_lines() -> set[tuple[str, int]]:
    """The source lines of the boundary mask: the body of `if masked:` in the Gluon
    kernels' _softmax_step (kernels/attention/gluon_common.py)."""
    path = ROOT / "speedlight" / "kernels" / "attention" / "gluon_common.py"
    lines = path.read_text().splitlines()
    start = next(i for i, t in enumerate(lines) if t.strip() == "if masked:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    out = set()
    for i in range(start + 1, len(lines)):
        if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent:
            break
        out.add((path.name, i + 1))
    return out


def innermost_loop(items: list[dict], holds: str) -> dict | None:
    """The smallest loop (backward branch to a label above it) whose body holds an
    instruction `holds`: its instruction count, the count on its interior path (the code
    a predicated forward branch inside the body skips when that code is the boundary mask,
    mask_lines, left out) and opcode counts."""
    where = {it["label"]: i for i, it in enumerate(items) if "label" in it}
    best = None
    for i, it in enumerate(items):
        if it.get("base") != "BRA" or where.get(it["target"], i + 1) > i:
            continue
        span = items[where[it["target"]]:i + 1]
        body = [x for x in span if "base" in x]
        # a body holding the function's EXIT is no loop: the branch back from an
        # out-of-line mbarrier retry block (placed after the exits) to where it resumes
        if not any(x["base"] == holds for x in body) or any(x["base"] == "EXIT" for x in body):
            continue
        if best is None or len(body) < len(best[0]):
            best = (body, span)
    if best is None:
        return None
    body, span = best
    inner = {x["label"]: k for k, x in enumerate(span) if "label" in x}
    masks, skipped = mask_lines(), set()
    for k, x in enumerate(span):
        if x.get("base") == "BRA" and x["predicated"] and inner.get(x["target"], -1) > k:
            region = range(k + 1, inner[x["target"]])
            if any(span[r].get("at") in masks for r in region):
                skipped.update(region)
    interior = sum(1 for k, x in enumerate(span) if "base" in x and k not in skipped)
    return {"instructions": len(body), "interior": interior,
            "opcodes": dict(Counter(x["base"] for x in body).most_common(16))}


# role -> (the instruction its loop holds, warps issuing it), per kernel
ROLES = {
    "_attention_fwd_kernel": {"program": ("HGMMA", None)},
    "_attention_fwd_gluon_kernel": {"consumer": ("HGMMA", 4), "producer": ("UTMALDG", 1)},
    "_attention_fwd_gluon_sm100_kernel": {"softmax": ("MUFU", 4), "mma": ("UTCHMMA", 1),
                                          "producer": ("UTMALDG", 1)},
}
# instances of a role per program (both consumers / softmax warpgroups run the loop)
COPIES = {"consumer": 2, "softmax": 2}


def figures(kernel: str, sass: str, constexprs: dict, num_warps: int) -> dict:
    """Per role its loop, and the kernel's warp-instructions per tile (whole and interior).
    MMA FLOPs per iteration from the tiles: 2 GEMMs of rows x BLOCK_N x BLOCK_D per
    consumer (the Triton kernel's BLOCK_M rows once)."""
    items = parse(sass)
    n, d = constexprs["BLOCK_N"], constexprs["BLOCK_D"]
    rows = {"_attention_fwd_kernel": constexprs.get("BLOCK_M"),
            "_attention_fwd_gluon_kernel": 64, "_attention_fwd_gluon_sm100_kernel": 128}[kernel]
    consumers = 1 if kernel == "_attention_fwd_kernel" else 2
    flops = consumers * 2 * (2 * rows * n * d)
    roles, whole, interior = {}, 0, 0
    for role, (holds, warps) in ROLES[kernel].items():
        loop = innermost_loop(items, holds)
        if loop is None:
            roles[role] = None
            continue
        warps = warps or num_warps
        copies = COPIES.get(role, 1)
        roles[role] = {**loop, "warps": warps, "copies": copies}
        whole += loop["instructions"] * warps * copies
        interior += loop["interior"] * warps * copies
    return {"roles": roles, "mma_flops_per_iteration": flops,
            "warp_instructions_per_tile": round(whole / flops * TILE_FLOPS),
            "warp_instructions_per_tile_interior": round(interior / flops * TILE_FLOPS)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    p.add_argument("--case", default=CASE)
    p.add_argument("--label", default="", help="recorded in every row (before / after)")
    args = p.parse_args(argv)
    import torch

    from speedlight import results
    from speedlight.inspect.compile import TritonCompiler
    from speedlight.inspect.run import inspect_cases
    from speedlight.ops.attention import SPEC
    from speedlight.target import resolve
    from speedlight.inspect.command import find_case

    case = find_case(SPEC, args.case, torch.bfloat16)
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    gluon = dataclasses.replace(SPEC, impl=SPEC.implementations["gluon"].fn)
    compiler = TritonCompiler()
    rows = []
    for arch, impl, spec in (("sm_90a", "triton", SPEC), ("sm_90a", "gluon", gluon),
                             ("sm_100a", "gluon", gluon)):
        target = resolve(arch)
        [report] = inspect_cases([(spec, case)], target, compiler=compiler, mode="dry",
                                 backward=False, impl=impl)
        for k in report.kernels:
            if k.launch.kernel not in ROLES or not k.ok:
                continue
            consts = {a.name: a.value for a in k.launch.args if a.kind == "constexpr"}
            sass = k.compiled.text("sass")
            ops = Counter(x["base"] for x in parse(sass) if "base" in x)
            rows.append({"tool": "attention_gluon_loops", "predicted": True, "git": revision,
                         "label": args.label,
                         "triton": results.environment(torch.device("cpu")).get("triton"),
                         "target": arch, "impl": impl, "case": case.id,
                         "kernel": k.launch.kernel, "num_warps": k.num_warps,
                         "registers": k.registers, "spill_stores": k.spill_stores,
                         "sass_instructions": sum(ops.values()),
                         "atomics": {n: ops[n] for n in ("RED", "ATOMG", "ATOM") if ops[n]},
                         "smem": k.smem, "partitions": [list(x) for x in k.partitions],
                         "setmaxnreg": list(k.setmaxnreg),
                         "tiles": {n: consts[n] for n in ("BLOCK_M", "BLOCK_N", "BLOCK_D",
                                                          "STAGES") if n in consts},
                         **figures(k.launch.kernel, sass, consts,
                                   k.launch.num_warps)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for row in rows:
        print(f"{row['label']:6s} {row['target']} {row['impl']:6s} {row['kernel']:34s} "
              f"regs {row['registers']} spill {row['spill_stores']} "
              f"sass {row['sass_instructions']} atomics {row['atomics']} "
              f"{row['warp_instructions_per_tile']:5d} warp-instr/tile "
              f"({row['warp_instructions_per_tile_interior']} interior)  "
              + "  ".join(f"{r}: {v['instructions']}/{v['interior']} x{v['warps']}x{v['copies']}"
                          for r, v in row["roles"].items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
