"""linear_cross_entropy at an LLM's size: forward + backward time, memory beyond the inputs
and the gradients returned, and the loss, for speedlight's settings and every peer present.

Default: 16384 tokens, hidden 4096, vocabulary 128256 (Llama 3), bf16, mean over tokens with
a tenth ignored. Implementations:
  speedlight             the default memory budget (1 GiB: 4 chunks of 4096 tokens here)
  speedlight-low         memory_budget=250 MB (vocabulary blocks, the logits computed again)
  speedlight-low-chunks  the same budget with explicit chunks (d_weight rounded once per
                         chunk, 17 here: faster, less accurate; shown for the trade-off)
  torch-eager            F.linear, then Hugging Face's loss (logits upcast, F.cross_entropy)
  torch-compile          torch.compile of torch-eager
  torch-fused            F.linear_cross_entropy (torch >= 2.13), where this torch has it
  liger                  Liger-Kernel's fused linear cross-entropy, where installed
Each row: median seconds of >= 20 steps (CUDA events), the peak memory beyond what was
allocated before the step less the gradients returned (torch.cuda.max_memory_allocated; on
a CPU the peak of tracked allocations, followed through speedlight's custom ops), the loss,
its dtype and its error against the float64 loss of the same inputs. Writes one JSON file
(--out) and prints a table with issue 52's targets; scripts/gpu/lce.py runs these same
measurements as gpu-check's section (verify first, a time budget, JSON lines).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GB = 1e9
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
IMPLEMENTATIONS = ("speedlight", "speedlight-low", "speedlight-low-chunks", "torch-eager",
                   "torch-compile", "torch-fused", "liger")


def _eager(h, w, t):
    return F.cross_entropy(F.linear(h, w).float(), t)


def budgets(tokens: int, hidden: int, vocab: int, dtype: torch.dtype, scaled: bool) -> dict:
    """speedlight's settings as linear_cross_entropy arguments: the default and low-memory
    budgets, and the low budget with its chunks made explicit (in-place). scaled: the
    budgets that give this shape the headline shape's schedules (its chunk counts), as
    verify's small cases take them (on a CPU, where the headline does not fit)."""
    from speedlight.ops import linear_cross_entropy_schedule as S

    out = {}
    for name, budget in (("speedlight", None), ("speedlight-low", S.LOW_MEMORY_BUDGET)):
        if scaled:
            budget = S.budget_like(S.headline(budget, dtype), tokens, vocab, hidden, dtype)
        out[name] = {"memory_budget": budget}
    low = out["speedlight-low"]["memory_budget"]
    plan = S.plan_schedule(tokens, vocab, hidden, dtype, dtype, memory_budget=low)
    out["speedlight-low-chunks"] = {"memory_budget": low, "chunk_size": plan.chunk_tokens}
    return out


def implementations(names, settings: dict) -> dict:
    """name -> fn(h, w, t) or the reason it cannot run here."""
    import speedlight

    out = {}
    for name in names:
        if name in settings:
            out[name] = (lambda kw: lambda h, w, t: speedlight.linear_cross_entropy(
                h, w, t, **kw))(settings[name])
        elif name == "torch-eager":
            out[name] = _eager
        elif name == "torch-compile":
            out[name] = torch.compile(_eager)
        elif name == "torch-fused":
            if hasattr(F, "linear_cross_entropy") and hasattr(torch.nn,
                                                                "LinearCrossEntropyOptions"):
                options = torch.nn.LinearCrossEntropyOptions()
                out[name] = lambda h, w, t: F.linear_cross_entropy(h, w, t, ignore_index=-100,
                                                                   options=options)
            else:
                out[name] = f"torch {torch.__version__} has no F.linear_cross_entropy"
        elif name == "liger":
            try:
                from liger_kernel.transformers.functional import (
                    liger_fused_linear_cross_entropy,
                )
                out[name] = lambda h, w, t: liger_fused_linear_cross_entropy(h, w, t)
            except Exception as e:  # not installed, or broken  # noqa: BLE001
                out[name] = f"liger-kernel unavailable ({type(e).__name__}: {e})"
        else:
            raise ValueError(f"unknown implementation {name!r}: one of {IMPLEMENTATIONS}")
    return out


def inputs(tokens: int, hidden: int, vocab: int, dtype: torch.dtype, device: str):
    """Unit hidden states, an lm_head whose logits have unit spread, a tenth ignored."""
    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(tokens, hidden, device=device, dtype=dtype, generator=g)
    w = torch.randn(vocab, hidden, device=device, dtype=dtype, generator=g) * hidden ** -0.5
    t = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    t[::10] = -100
    return h, w, t


def float64_loss(h, w, t, rows: int = 1024) -> float:
    """The mean loss of F.linear(h, w) in float64, a block of rows at a time."""
    total, count = 0.0, 0
    w64 = w.double()
    for s in range(0, h.shape[0], rows):
        logits = h[s:s + rows].double() @ w64.t()
        tt = t[s:s + rows]
        total += float(F.cross_entropy(logits, tt, ignore_index=-100, reduction="sum"))
        count += int((tt != -100).sum())
    return total / count if count else 0.0


def _tracked_peak(step):
    """(result, peak bytes of the allocations made inside step) on a CPU: the tests'
    tensor-lifetime tracker, which also sees inside speedlight's custom ops."""
    from tests.ops.test_linear_cross_entropy import LiveBytes

    with LiveBytes() as mem:
        out = step()
    return out, mem.peak


def measure(fn, h, w, t, reps: int) -> dict:
    """Median time of fwd + bwd over reps steps after one warm-up, the extra memory of one
    more, and the loss."""
    cuda = h.device.type == "cuda"
    hl, wl = h.detach().requires_grad_(), w.detach().requires_grad_()

    def step():
        loss = fn(hl, wl, t)
        gh, gw = torch.autograd.grad(loss, (hl, wl))
        return loss.detach(), gh, gw

    ref = step()  # warm-up (compiles)
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            start.record()
            out = step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            out = step()
            times.append(time.perf_counter() - t0)
        del out
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        method = "torch.cuda.max_memory_allocated"
    else:
        out, peak = _tracked_peak(step)
        method = "peak of tracked allocations (CPU)"
    returned = sum(x.numel() * x.element_size() for x in out[1:])
    loss = ref[0]
    return {"seconds": statistics.median(times), "samples": times, "peak_bytes": peak,
            "returned_bytes": returned, "extra_bytes": peak - returned, "memory": method,
            "loss": float(loss), "loss_dtype": str(loss.dtype).replace("torch.", "")}


def verdict(rows: dict) -> dict:
    """Issue 52's targets, where the rows they compare exist: the default at most 0.95x
    torch.compile's median with at most 1.1 GB extra; the low-memory setting at most
    0.25 GB extra and faster than Liger's median."""
    ok = {k: r for k, r in rows.items() if r.get("status") == "ok"}
    out = {}
    if "speedlight" in ok:
        out["default_extra_at_most_1.1GB"] = ok["speedlight"]["extra_bytes"] <= 1.1 * GB
        if "torch-compile" in ok:
            out["default_at_most_0.95x_compile"] = (
                ok["speedlight"]["seconds"] <= 0.95 * ok["torch-compile"]["seconds"])
    if "speedlight-low" in ok:
        out["low_extra_at_most_0.25GB"] = ok["speedlight-low"]["extra_bytes"] <= 0.25 * GB
        if "liger" in ok:
            out["low_faster_than_liger"] = (
                ok["speedlight-low"]["seconds"] < ok["liger"]["seconds"])
    return out


def table(rows: dict, loss64: float | None) -> list[str]:
    base = rows.get("torch-compile", {}).get("seconds")
    lines = [f"{'impl':22s} {'ms':>9s} {'x compile':>9s} {'extra MB':>9s}  loss (dtype, "
             f"error vs float64)"]
    for name, r in rows.items():
        if r.get("status") != "ok":
            lines.append(f"{name:22s} {r.get('status')}: {r.get('reason', '')}")
            continue
        ratio = f"{r['seconds'] / base:.2f}" if base else "-"
        err = f", {abs(r['loss'] - loss64):.2g}" if loss64 is not None else ""
        lines.append(f"{name:22s} {r['seconds'] * 1e3:9.2f} {ratio:>9s} "
                     f"{r['extra_bytes'] / 1e6:9.1f}  {r['loss']:.5f} ({r['loss_dtype']}{err})")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--impls", default=",".join(IMPLEMENTATIONS))
    p.add_argument("--out", default="lce.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("lce check: needs a GPU (no CUDA device here); nothing measured "
              "(scripts/gpu/lce.py runs on a CPU at a small size)")
        return 0
    dtype = DTYPES[args.dtype]
    h, w, t = inputs(args.tokens, args.hidden, args.vocab, dtype, "cuda")
    loss64 = float64_loss(h, w, t)
    settings = budgets(args.tokens, args.hidden, args.vocab, dtype, scaled=False)
    rows = {}
    for name, fn in implementations(args.impls.split(","), settings).items():
        if isinstance(fn, str):
            rows[name] = {"status": "unavailable", "reason": fn}
            continue
        try:
            rows[name] = {"status": "ok", **settings.get(name, {}),
                          **measure(fn, h, w, t, args.reps)}
        except Exception as e:  # out of memory, unsupported: recorded, not fatal  # noqa: BLE001
            rows[name] = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:300]}
        torch.cuda.empty_cache()
    print(f"linear_cross_entropy fwd+bwd, {args.tokens} tokens, hidden {args.hidden}, vocab "
          f"{args.vocab}, {args.dtype} ({torch.cuda.get_device_name()}); float64 loss "
          f"{loss64:.6f}")
    print("\n".join(table(rows, loss64)))
    targets = verdict(rows)
    print("issue 52's targets:", targets)
    with open(args.out, "w") as f:
        json.dump({"shape": vars(args), "device": torch.cuda.get_device_name(),
                   "loss_float64": loss64, "rows": rows, "verdict": targets}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
