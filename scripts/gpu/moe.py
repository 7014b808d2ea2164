"""The mixture-of-experts block's GPU check (issue 53): verify, then time.

    python scripts/gpu/moe.py --out DIR [--budget-s N] [--device auto|cuda|cpu] [--tiny]

1. verify (a fifth of the budget): speedlight.moe_experts against the float64 reference,
   forward and every gradient, in bf16, at each of MOE_BLOCKS' widths (Mixtral-8x7B,
   Qwen3-30B-A3B, DeepSeek-V3 with its shared expert, gpt-oss-20B), 1024 tokens, skewed
   routing, the experts cut (VERIFY_EXPERTS, VERIFY_MAX_BYTES; k kept to half of them at
   most) so that the float64 reference and gradients fit: rows in DIR/verify.jsonl.
2. bench at 4096 tokens (two fifths): every block, uniform and skewed routing, fwd and
   fwd+bwd, bf16, against the Hugging Face per-expert loop (torch-eager), the same chain on
   torch._grouped_mm (torch-grouped-mm) and Liger's fused MoE (liger); each case verified
   by bench first where its float64 reference fits the device (DeepSeek-V3's does not: its
   rows say so, its paths verified in step 1).
3. bench at 32768 tokens (the rest): the same, --no-verify (no float64 at that size; its
   speedups are withheld as unverified).
Bench rows go to DIR/bench.jsonl. Each step runs within its share of the budget; a case not
started in time is a skip row with the reason, and a step with no time left is recorded as
skipped. DIR/moe.jsonl holds one row per step: status (done, skipped, error), seconds,
rows written, and the reason of a skip or an error.

--tiny: gpt-oss's and DeepSeek-V3's layouts and flags at a handful of tokens and widths,
the forward alone against the loop, a sample or two: the CPU test of this script
(tests/scripts). Every number on a CPU is not representative.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file from anywhere
    sys.path.insert(0, str(ROOT))

# the experts each verification keeps: at most 16, halved until verify's estimate of the
# case (its float64 copies and gradients included) is within VERIFY_MAX_BYTES: an H100's
# memory holds it (Mixtral-8x7B keeps 4 experts, the others 16)
VERIFY_EXPERTS = 16
VERIFY_MAX_BYTES = 40 * 2 ** 30
VERIFY_TOKENS = 1024
BASELINES = ("torch-eager", "torch-grouped-mm", "liger")
# each step's share of the budget
SHARES = {"verify": 0.2, "bench-4k": 0.4, "bench-32k": 0.4}


# --tiny: two blocks' layouts and flags (DeepSeek-V3's shared expert, gpt-oss's unit) at
# widths the interpreter runs in a fraction of a second
TINY_BLOCKS = ("deepseek-v3", "gpt-oss-20b")


def _tiny(name: str):
    import torch

    from speedlight.ops import moe_experts_cases as cases

    *_, layout, flags = cases.MOE_BLOCKS[name]
    return cases._case(4, 16, 8, 2, 1, layout, model=name, routing="skewed",
                       **flags).with_(dtype=torch.bfloat16)


def verify_cases(tiny: bool) -> list:
    """One case per block: its widths, experts cut to VERIFY_EXPERTS, skewed routing, bf16."""
    import torch

    from speedlight.ops import moe_experts_cases as cases

    if tiny:
        return [_tiny(TINY_BLOCKS[1])]
    from speedlight.ops.moe_experts import SPEC
    from speedlight.verify.harness import estimate_bytes

    out = []
    for name, (hidden, inter, experts, k, layout, flags) in cases.MOE_BLOCKS.items():
        e = min(experts, VERIFY_EXPERTS)
        while True:  # the most experts (up to 16) whose float64 verification fits
            case = cases._case(VERIFY_TOKENS, hidden, inter, e, min(k, e // 2 or 1), layout,
                               model=name, routing="skewed", **flags).with_(dtype=torch.bfloat16)
            if e <= 2 or estimate_bytes(SPEC, case) <= VERIFY_MAX_BYTES:
                break
            e //= 2
        out.append(case)
    return out


def bench_cases(tokens: int, tiny: bool) -> list:
    import torch

    from speedlight.ops import moe_experts_cases as cases

    if tiny:
        return [_tiny(TINY_BLOCKS[0])]
    return [cases.block_case(name, tokens, routing).with_(dtype=torch.bfloat16)
            for name in cases.MOE_BLOCKS for routing in ("uniform", "skewed")]


def run_verify(cases_: list, device, out: Path, deadline: float) -> int:
    from speedlight import results
    from speedlight.ops.moe_experts import SPEC
    from speedlight.verify import harness

    env = results.environment(device)
    rows = 0
    for case in cases_:
        if time.monotonic() >= deadline:
            row = {"op": SPEC.name, "case_id": case.id, "status": "skip",
                   "reason": "the script's budget for verification was spent before it"}
        else:
            r = harness.verify_case(SPEC, case, device, max_bytes=harness.default_max_bytes(
                device))
            row = dict(r.to_row(), suite="scripts/gpu/moe.py", **env)
        results.append_jsonl(out, [row])
        rows += 1
    return rows


def run_bench(cases_: list, device, out: Path, budget_s: float, verify: bool,
              tiny: bool) -> int:
    from speedlight import results
    from speedlight.bench.baselines import Baselines
    from speedlight.bench.runner import Bench, Settings
    from speedlight.bench.timer import StopRule
    from speedlight.ops.moe_experts import SPEC

    # a measurement is one large GEMM chain: 0.3 s of samples each; --tiny: the forward
    # against the loop, a sample or two (the script's flow, not a timing)
    rule = StopRule(time_cap_s=0.3)
    modes, baselines = ("fwd", "fwd+bwd"), BASELINES
    if tiny:
        rule = StopRule(min_samples=1, max_samples=2, warmup_calls=1, warmup_s=0.0)
        modes, baselines = ("fwd",), BASELINES[:1]
    settings = Settings(modes=modes, rule=rule, verify=verify)
    bench = Bench(device, settings, Baselines(baselines), suite="scripts/gpu/moe.py")
    written = [0]

    def done(spec, case, rows):
        results.append_jsonl(out, rows)
        written[0] += len(rows)

    bench.run([SPEC], lambda spec: cases_, budget_s=budget_s, on_case=done)
    return written[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the JSON lines")
    p.add_argument("--budget-s", type=float, default=600.0,
                   help="seconds for the whole check (default 600)")
    p.add_argument("--device", default="auto", help="auto (cuda if there is one), cuda, cpu")
    p.add_argument("--tiny", action="store_true",
                   help="CPU widths and a handful of tokens (the script's own test)")
    args = p.parse_args(argv)
    if not args.budget_s > 0:
        p.error(f"--budget-s must be a positive number of seconds, got {args.budget_s}")

    import torch

    from speedlight import results
    from speedlight.runtime import select_device

    device = torch.device(select_device(args.device))  # before any kernel module's import
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "moe.jsonl"
    start = time.monotonic()
    end = start + args.budget_s
    steps = [("verify", lambda share: run_verify(verify_cases(args.tiny), device,
                                                 args.out / "verify.jsonl",
                                                 time.monotonic() + share)),
             ("bench-4k", lambda share: run_bench(bench_cases(4096, args.tiny), device,
                                                  args.out / "bench.jsonl", share, True,
                                                  args.tiny)),
             ("bench-32k", lambda share: run_bench(bench_cases(32768, args.tiny), device,
                                                   args.out / "bench.jsonl", share, False,
                                                   args.tiny))]
    failed = False
    for name, step in steps:
        t0 = time.monotonic()
        row = {"step": name, "device": str(device), "torch": torch.__version__,
               "budget_s": round(SHARES[name] * args.budget_s, 1)}
        if t0 >= end:
            row.update(status="skipped", reason="the script's budget was spent before it",
                       seconds=0.0, rows=0)
        else:
            try:
                n = step(min(SHARES[name] * args.budget_s, end - t0))
                row.update(status="done", rows=n)
            except Exception as e:  # recorded with its traceback; the next step still runs
                failed = True
                row.update(status="error", rows=0, reason=f"{type(e).__name__}: {e}",
                           traceback=traceback.format_exc()[-2000:])
            row["seconds"] = round(time.monotonic() - t0, 1)
        results.append_jsonl(summary, [row])
        print(f"moe {name}: {row['status']} ({row['rows']} rows, {row['seconds']} s)"
              + (f": {row['reason']}" if row.get("reason") else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
