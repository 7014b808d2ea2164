"""gpu-check's plan and training-step section (issue 47): every candidate of each kind
verified and timed for the built-in model and Llama-3-8B's widths, then the training step
with the planned patch beside Liger's.

    python scripts/gpu/plan_step.py --out DIR [--budget-s N]

1. plan: for each model of --models (the built-in default; llama-3-8b at its real widths on
   a GPU, scaled down on a CPU), `speedlight.plan` on its first decoder layer at --plan-batch
   x --plan-seq: every candidate of each kind (speedlight/candidates) installed alone,
   verified against float64 on the kind's unit at the model's shapes (forward and
   backward; the size is one that the float64 reference fits), the admitted ones timed with
   bench's timer against the model's own, the fastest chosen. Kinds are planned in groups
   (a kind with the kind its decision depends on), the budget (--budget-s less the
   --step-s kept for step 2) checked between groups; a group not started in time is a
   skipped row. One row per candidate goes to
   DIR/plan.jsonl, the merged plan of each model to DIR/plan-<model>.json.
2. step: `bench model`'s training step (forward, backward, AdamW) at --step-model's widths,
   --layers layers, --step-batch x --step-seq tokens: hf, liger, speedlight (all) and
   speedlight-planned on the plan of step 1 (that model's plan file), rows to
   DIR/model-step.jsonl; the planned row beside Liger's is the target (issue 47: >= 1.2x hf
   and >= Liger on an H200). A variant past the budget is a skipped row.
On a CPU (Triton interpreter; for the tests, at a tiny size) nothing is timed: the plan
verifies every candidate and the rows say unmeasured; timings are labelled not
representative. Exit 1 when a speedlight candidate fails verification or a step errors.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from speedlight import plans, results  # noqa: E402

# kinds planned together: a dependent kind with the kind its decision reads (decide.py)
GROUPS = (("rms_norm", "decoder_layer"), ("mlp",), ("rope",), ("attention",),
          ("cross_entropy", "linear_cross_entropy"))


def plan_model(name: str, args, device: torch.device, deadline: float, write) -> tuple[
        plans.Plan | None, bool]:
    """The merged plan of one model (None when no group ran) and whether a speedlight
    candidate failed verification; a row per candidate written as each group finishes."""
    import speedlight
    from speedlight.workloads import models

    gpu = device.type == "cuda"
    w = models.build(None if name == "default" else name, batch=args.plan_batch,
                     seq=args.plan_seq, train=True, dtype=torch.bfloat16 if gpu else
                     torch.float32, device=device, size="full" if gpu else "small",
                     layers=2, seed=0)
    w.model.train()
    kinds = [k for k in args.kinds.split(",") if k] if args.kinds else None
    asked = [c for c in args.candidates.split(",") if c] if args.candidates else None
    merged: plans.Plan | None = None
    failed = False
    for group in GROUPS:
        group = tuple(k for k in group if kinds is None or k in kinds)
        if not group:
            continue
        if time.perf_counter() > deadline:
            for kind in group:
                write({"step": "plan", "model": name, "kind": kind, "status": "skipped",
                       "reason": f"not started: the plan's share of the {args.budget_s:g} s "
                                 "budget was spent"})
            continue
        part = speedlight.plan(w.model, w.inputs, kinds=list(group), candidates=asked,
                               save=False, verify=True)
        for kind, d in part.decisions.items():
            for c in d.candidates:
                failed |= c["name"].startswith("speedlight") and c["status"] == "excluded"
                write({"step": "plan", "model": name, "kind": kind, "verdict": d.verdict,
                       "choice": d.choice, "candidate": c["name"], "status": c["status"],
                       "reason": c["reason"], "median_s": c["median_s"], "ratio": c["ratio"],
                       "low": c["low"], "high": c["high"], "peak_bytes": c["peak"],
                       "error_ratio": c["error_ratio"], "unit": d.module})
        if merged is None:
            merged = part
        else:
            merged.decisions.update(part.decisions)
            merged.shapes.update(part.shapes)
    del w
    if gpu:
        torch.cuda.empty_cache()
    return merged, failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for plan.jsonl, plan-*.json, "
                                                "model-step.jsonl")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="the whole section's seconds (default 240)")
    p.add_argument("--step-s", type=float, default=90.0,
                   help="of those, kept for the training step: the plan starts no group "
                        "after budget-s minus step-s (default 90)")
    p.add_argument("--models", default="default,llama-3-8b",
                   help="the models planned (default: the built-in one and llama-3-8b)")
    p.add_argument("--plan-batch", type=int, default=2)
    p.add_argument("--plan-seq", type=int, default=2048,
                   help="tokens per sequence of the plan's unit (a size whose float64 "
                        "reference fits on the GPU; default 2048)")
    p.add_argument("--kinds", default=None, help="the kinds planned (default: all)")
    p.add_argument("--candidates", default=None, help="the candidates tried (default: all)")
    p.add_argument("--step-model", default="llama-3-8b",
                   help="the model of the training step ('default': the built-in one)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--step-batch", type=int, default=4)
    p.add_argument("--step-seq", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--variants", default="hf,liger,speedlight,speedlight-planned")
    args = p.parse_args(argv)
    start = time.perf_counter()
    deadline = start + args.budget_s
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = {"tool": "gpu-plan-step", **results.environment(device),
              "representative": device.type == "cuda"}

    def write(row: dict) -> None:
        results.append_jsonl(out / "plan.jsonl", [{**common, **row}])
        print(f"plan {row['model']} {row['kind']} {row.get('candidate', '')}: {row['status']}"
              + (f" ({row['reason']})" if row.get("reason") else ""), flush=True)

    failed = False
    plan_files = {}
    plan_deadline = deadline - min(args.step_s, args.budget_s)
    for name in [m for m in args.models.split(",") if m]:
        merged, bad = plan_model(name, args, device, plan_deadline, write)
        failed |= bad
        if merged is not None:
            plan_files[name] = plans.save(merged, out / f"plan-{name}.json")
    failed |= _step(args, device, out, plan_files, deadline)
    print(f"plan step: {time.perf_counter() - start:.0f} s", flush=True)
    return 1 if failed else 0


def _step(args, device: torch.device, out: Path, plan_files: dict, deadline: float) -> bool:
    """The training step's variants; whether one errored."""
    import speedlight
    from speedlight.bench import model_step

    model = None if args.step_model == "default" else args.step_model
    plan_file = plan_files.get(args.step_model)
    variants = [v for v in args.variants.split(",") if v]
    if plan_file is None and model_step.PLANNED in variants:
        variants.remove(model_step.PLANNED)
        results.append_jsonl(out / model_step.FILE, [{
            "tool": "bench-model", "variant": model_step.PLANNED, "status": "skipped",
            "reason": f"no plan of {args.step_model} was measured in this run"}])
    gpu = device.type == "cuda"
    s = model_step.StepSettings(
        model=model, layers=args.layers, batch=args.step_batch, seq=args.step_seq,
        dtype=torch.bfloat16 if gpu else torch.float32, device=device, warmup=args.warmup,
        steps=args.steps, budget_s=max(deadline - time.perf_counter(), 1.0),
        plan=plans.load_plan(plan_file).to_json() if plan_file else "measure",
        overrides=None if gpu or model else model_step.defaults(device)["overrides"])
    rows = model_step.run_variants(s, variants, out / model_step.FILE, forced=variants,
                                   patch=speedlight.patch)
    for r in rows:
        print(f"step {r['variant']}: {r['status']}"
              + (f" {r['tokens_per_s']:.4g} tokens/s" if r["status"] == "ok" else
                 f" ({r.get('reason')})"), flush=True)
    return any(r["status"] == "error" for r in rows)


if __name__ == "__main__":
    sys.exit(main())
