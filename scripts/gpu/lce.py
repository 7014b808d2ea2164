"""gpu-check's linear_cross_entropy section (issue 52): verify, then time, memory and loss
against the peers at Llama 3's lm_head.

    python scripts/gpu/lce.py --out DIR [--budget-s N]

1. verify: speedlight verify's rule (float64 reference, k x PyTorch's own error) at a size
   the reference fits (1024 tokens, hidden 2048, vocabulary 4096, bf16, a tenth ignored),
   under each setting's budget scaled to that size, so that d_weight is summed as at the
   headline shape: 4 chunks (default), vocabulary blocks (low-memory);
2. the float64 loss of the timing inputs;
3. at 16384 tokens, hidden 4096, vocabulary 128256 (bf16), for each implementation of
   scripts/lce_check.py (speedlight's settings, torch eager, torch.compile, torch's
   F.linear_cross_entropy, Liger): the median of --reps fwd+bwd steps, the memory beyond
   inputs and returned gradients, the loss, its dtype and error against float64.
Rows go to DIR/lce.jsonl as each finishes; a step not started within --budget-s seconds
is a skipped row saying so, as are peers that cannot run here (torch.compile and Liger on
a CPU). On a CPU (Triton interpreter; for the tests, at a small size) the budgets are
scaled to the shape as in step 1 and the numbers are labelled not representative.
Exit 1 when speedlight fails verification or errors, else 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402

import lce_check  # noqa: E402
from speedlight import results  # noqa: E402

CPU_SKIPS = {"torch-compile": "torch.compile on a CPU: inductor's C++ build takes minutes and "
                              "says nothing about a GPU",
             "liger": "Liger-Kernel's Triton kernels do not run under the Triton interpreter"}


def verify_rows(settings: tuple[str, ...], tokens: int, hidden: int, vocab: int,
                device: str) -> list[dict]:
    """One row per setting: verify's verdict on a bf16 case whose budget gives it the
    headline's schedule (a case of at most 2^22 logits takes it: OpSpec.make_inputs)."""
    from speedlight.ops import linear_cross_entropy as op
    from speedlight.spec import Case
    from speedlight.verify import verify_case

    rows = []
    for setting in settings:
        flags = {"ignore": "some", **({"budget": op.LOW_MB} if setting == "low" else {})}
        case = Case("linear_cross_entropy", (("tokens", tokens), ("hidden", hidden),
                                             ("vocab", vocab)), dtype=torch.bfloat16,
                    flags=flags)
        r = verify_case(op.SPEC, case, device)
        budget = op.case_budget(case)
        plan = op.plan_schedule(tokens, vocab, hidden, torch.bfloat16, torch.bfloat16,
                                memory_budget=budget)
        rows.append({"step": "verify", "setting": setting, "case": case.id,
                     "status": r.status, "reason": r.reason, "schedule": plan.describe(),
                     "checks": {c.name: {"passed": c.passed, "ratio": c.ratio}
                                for c in r.checks}})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for lce.jsonl")
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--impls", default=",".join(lce_check.IMPLEMENTATIONS))
    p.add_argument("--verify-shape", default="1024,2048,4096",
                   help="tokens,hidden,vocab of the verified case (at most 2^22 logits)")
    p.add_argument("--verify-settings", default="default,low")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="auto: cuda where there is a GPU (default)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    device = args.device if args.device != "auto" else (
        "cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lce.jsonl"
    common = {"tool": "gpu-lce", **results.environment(torch.device(device)),
              "representative": device == "cuda"}

    def write(row: dict) -> None:
        results.append_jsonl(path, [{**common, **row}])
        what = row.get("implementation") or row.get("setting") or row.get("step")
        print(f"lce {row['step']} {what}: {row['status']}"
              + (f" ({row['reason']})" if row.get("reason") else ""), flush=True)

    failed = False
    vt, vh, vv = (int(x) for x in args.verify_shape.split(","))
    for row in verify_rows(tuple(s for s in args.verify_settings.split(",") if s), vt, vh, vv,
                           device):
        failed |= row["status"] != "pass"
        write(row)

    dtype = torch.bfloat16
    h, w, t = lce_check.inputs(args.tokens, args.hidden, args.vocab, dtype, device)
    loss64 = lce_check.float64_loss(h, w, t)
    write({"step": "float64-loss", "status": "ok", "loss": loss64})
    settings = lce_check.budgets(args.tokens, args.hidden, args.vocab, dtype,
                                 scaled=device != "cuda")
    shape = {"tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab, "dtype": "bf16"}
    rows = {}
    for name, fn in lce_check.implementations(args.impls.split(","), settings).items():
        row = {"step": "time", "implementation": name, **shape, **settings.get(name, {})}
        if device == "cpu" and name in CPU_SKIPS:
            row.update(status="skipped", reason=CPU_SKIPS[name])
        elif isinstance(fn, str):
            row.update(status="unavailable", reason=fn)
        elif time.perf_counter() - start > args.budget_s:
            row.update(status="skipped",
                       reason=f"not started: the {args.budget_s:g} s budget was spent")
        else:
            try:
                row.update(status="ok", **lce_check.measure(fn, h, w, t, args.reps))
                row["loss_error"] = abs(row["loss"] - loss64)
            except Exception as e:  # out of memory, unsupported: recorded  # noqa: BLE001
                row.update(status="error", reason=f"{type(e).__name__}: {e}"[:300])
                failed |= name.startswith("speedlight")
            if device == "cuda":
                torch.cuda.empty_cache()
        rows[name] = row
        write(row)
    print("\n".join(lce_check.table(rows, loss64)))
    targets = lce_check.verdict(rows)
    write({"step": "targets", "status": "ok", "targets": targets})
    print("issue 52's targets:", targets, f"({time.perf_counter() - start:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
