"""linear_cross_entropy at an LLM's size, on a GPU: forward + backward time and peak memory
beyond the inputs and the gradients returned, for speedlight and every baseline present.

Default: 16384 tokens, hidden 4096, vocabulary 128256 (Llama 3), bf16, mean over tokens with
a tenth ignored. Baselines: eager (F.linear, then the Hugging Face loss: logits upcast to
fp32 and F.cross_entropy), torch.compile of it, F.linear_cross_entropy with its chunked
options (when this torch has it), Liger-Kernel's fused linear cross-entropy (when installed).
Writes one JSON file (--out) and prints a table. Exits 0 without a GPU, saying so.

Issue 13's bar: speedlight's extra memory at most 2 GiB and its time at most 1.0x eager's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

GiB = 2 ** 30


def _eager(h, w, t):
    return F.cross_entropy(F.linear(h, w).float(), t)


def _impls():
    import speedlight

    out = {"speedlight": lambda h, w, t: speedlight.linear_cross_entropy(h, w, t),
           "torch-eager": _eager, "torch-compile": torch.compile(_eager)}
    if hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions"):
        options = torch.nn.LinearCrossEntropyOptions()
        out["torch-fused"] = lambda h, w, t: F.linear_cross_entropy(h, w, t, options=options)
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
        out["liger"] = lambda h, w, t: liger_fused_linear_cross_entropy(h, w, t)
    except Exception as e:  # not installed, or broken
        print(f"liger: unavailable ({type(e).__name__}: {e})")
    return out


def measure(fn, h, w, t, reps: int) -> dict:
    hl, wl = h.detach().requires_grad_(), w.detach().requires_grad_()

    def step():
        loss = fn(hl, wl, t)
        gh, gw = torch.autograd.grad(loss, (hl, wl))
        return loss.detach(), gh, gw

    ref = step()  # warm-up (compiles)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        del out
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    returned = sum(x.numel() * x.element_size() for x in out)
    del out
    return {"seconds": statistics.median(times), "samples": times, "peak_bytes": peak,
            "returned_bytes": returned, "extra_bytes": peak - returned, "result": ref}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="lce.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("lce check: needs a GPU (no CUDA device here); nothing measured")
        return 0
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(args.tokens, args.hidden, device="cuda", dtype=dtype, generator=g)
    w = (torch.randn(args.vocab, args.hidden, device="cuda", dtype=dtype, generator=g)
         * args.hidden ** -0.5)
    t = torch.randint(0, args.vocab, (args.tokens,), device="cuda", generator=g)
    t[::10] = -100
    rows = {}
    for name, fn in _impls().items():
        try:
            m = measure(fn, h, w, t, args.reps)
        except Exception as e:  # out of memory, unsupported: recorded, not fatal
            rows[name] = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:300]}
            torch.cuda.empty_cache()
            continue
        loss, _, _ = m.pop("result")
        m["status"] = "ok"
        m["loss"] = float(loss)
        rows[name] = m
        torch.cuda.empty_cache()
    eager = rows.get("torch-eager", {}).get("seconds")
    print(f"linear_cross_entropy fwd+bwd, {args.tokens} tokens, hidden {args.hidden}, vocab "
          f"{args.vocab}, {args.dtype} ({torch.cuda.get_device_name()})")
    print(f"{'impl':15s} {'ms':>9s} {'x eager':>8s} {'peak GiB':>9s} {'extra GiB':>10s}  loss")
    for name, r in rows.items():
        if r["status"] != "ok":
            print(f"{name:15s} {r['status']}: {r['reason']}")
            continue
        speed = f"{eager / r['seconds']:.2f}" if eager else "-"
        print(f"{name:15s} {r['seconds'] * 1e3:9.2f} {speed:>8s} {r['peak_bytes'] / GiB:9.2f} "
              f"{r['extra_bytes'] / GiB:10.2f}  {r['loss']:.5f}")
    ours = rows.get("speedlight", {})
    verdict = {}
    if ours.get("status") == "ok":
        verdict = {"extra_memory_at_most_2GiB": ours["extra_bytes"] <= 2 * GiB,
                   "time_at_most_eager": bool(eager) and ours["seconds"] <= eager}
        print("issue 13's bar:", verdict)
    with open(args.out, "w") as f:
        json.dump({"shape": vars(args), "device": torch.cuda.get_device_name(),
                   "rows": rows, "verdict": verdict}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
