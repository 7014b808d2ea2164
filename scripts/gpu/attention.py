"""gpu-check's attention section (issue 49 item 6): verify speedlight's attention first, then
time it at the headline beside every attention implementation the plan knows.

    python scripts/gpu/attention.py --out DIR [--budget-s N]

1. verify: speedlight verify's rule (float64 reference, k x PyTorch's own error, forward
   and backward) on cases the float64 reference fits (VERIFY_CASES: the headline's shape
   at 1024 tokens, causal and not, GQA, a window on both sides, softcap, head dims 64 to
   256, fp16, packed sequences, queries after a cache, rows that see no key, a transposed
   layout, decode with a split key range), at the tiles the GPU runs;
2. masks: a NaN placed where the causal mask hides it from most rows, in a boundary block
   (a key and a query row of a diagonal block): o, dq, dk and dv must be NaN exactly where
   the float64 reference, which masks by selection, has NaN (issue 44 item 2; the fault
   kernels' exact pass on the GPU);
3. time: at the headline (batch 2, 32 heads, 8 KV heads, 8192 tokens, head dim 128,
   causal and not, bf16), each implementation's median forward, backward (from a fixed
   upstream gradient) and forward + backward over --reps calls, L2 flushed before each,
   TFLOP/s from the op's cost: speedlight, sdpa-flash, sdpa-cudnn, sdpa-efficient,
   flex-attention.

Rows go to DIR/attention.jsonl as each step finishes; a step not started within --budget-s
seconds is a skipped row saying so, as is what cannot run here (on a CPU the timings, and
the GPU libraries). The CPU runs tiny cases (a test runs it). Exit 1 when speedlight fails
a verify or a mask step, else 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IMPLEMENTATIONS = ("speedlight", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex-attention")
MODES = ("fwd", "bwd", "fwd+bwd")


def _case(b, h, hkv, sq, sk, d, dtype="bf16", layout="contiguous", **flags):
    return dict(params=(("batch", b), ("heads", h), ("kv_heads", hkv), ("seq_q", sq),
                        ("seq_k", sk), ("dim", d)), dtype=dtype, layout=layout, flags=flags)


def _packed(h, hkv, d, lens, **flags):
    joined = "_".join(map(str, lens))
    return _case(len(lens), h, hkv, sum(lens), sum(lens), d, lens_q=joined, lens_k=joined,
                 **flags)


VERIFY_CASES = (
    _case(2, 8, 2, 1024, 1024, 128, causal=True, lse=True),  # the headline's shape, scaled
    _case(1, 4, 4, 1000, 1000, 128),  # not causal, a partial last block
    _case(2, 8, 2, 1024, 1024, 128, dtype="fp16", causal=True),
    _case(1, 8, 2, 1021, 1021, 64, causal=True, left=300),  # a sliding window, GQA 4
    _case(1, 2, 2, 700, 900, 128, left=100, right=50, scale=0.3),  # both sides, a scale
    _case(1, 4, 4, 1024, 1024, 256, causal=True, softcap=50.0),
    _case(1, 4, 4, 513, 513, 96, causal=True),  # head dim padded by the descriptors' zeros
    _case(2, 8, 2, 300, 2000, 128, causal=True, lse=True),  # queries after a cache
    _case(1, 2, 1, 200, 50, 64, causal=True, lse=True),  # rows that see no key
    _case(1, 8, 8, 512, 512, 128, layout="transposed", causal=True),
    _case(2, 8, 2, 4, 4096, 128, causal=True, lse=True),  # decode: the split key range
    _packed(8, 2, 128, [1, 300, 0, 777, 64, 129], causal=True, lse=True),
)
MASK_CASE = (1, 8, 2, 1024, 128)  # batch, heads, kv heads, tokens, head dim
TIME_CASES = (_case(2, 32, 8, 8192, 8192, 128, causal=True), _case(2, 32, 8, 8192, 8192, 128))
# The CPU test's sizes (the Triton interpreter)
CPU_VERIFY_CASES = (_case(1, 2, 1, 40, 40, 64, causal=True, lse=True),)
CPU_MASK_CASE = (1, 2, 1, 24, 16)
CPU_TIME_CASES = (_case(1, 2, 1, 32, 32, 32, causal=True),)


def _spec_case(description: dict):
    import torch

    from speedlight.ops.attention import SPEC
    from speedlight.spec import Case

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        description["dtype"]]
    return SPEC, Case("attention", description["params"], dtype=dtype,
                      layout=description["layout"], flags=dict(description["flags"]))


def verify_step(description: dict, device: str) -> dict:
    from speedlight.verify import verify_case

    spec, case = _spec_case(description)
    r = verify_case(spec, case, device)
    return {"step": "verify", "case": case.id, "implementation": "speedlight",
            "status": r.status, "reason": r.reason,
            "checks": {c.name: {"passed": c.passed, "ratio": c.ratio} for c in r.checks}}


def mask_step(shape: tuple, device: str) -> dict:
    """A NaN in v at a key the causal diagonal hides from the rows before it, and one in q
    at a row, both inside one boundary block: NaN positions of o, dq, dk, dv as float64's."""
    import torch

    import speedlight
    from speedlight import reference

    b, h, hkv, n, d = shape
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(b, hh, n, d, generator=g).to(device, torch.bfloat16)
                   for hh in (h, hkv, hkv, h))
    v[0, 0, n // 2 + 5, 3] = float("nan")
    q[0, 0, n // 2 - 7, 1] = float("nan")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = speedlight.attention(*leaves, causal=True)
    o.backward(do)
    got = (o, *(t.grad for t in leaves))
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o64 = reference.attention(*ref, causal=True)
    o64.backward(do.double())
    want = (o64, *(t.grad for t in ref))
    wrong = [name for name, a, w in zip(("o", "dq", "dk", "dv"), got, want)
             if not torch.equal(torch.isnan(a), torch.isnan(w))]
    return {"step": "mask", "case": f"batch{b}-heads{h}-kv_heads{hkv}-seq{n}-dim{d}-causal-nan",
            "implementation": "speedlight", "status": "fail" if wrong else "pass",
            "reason": f"NaN positions differ from float64's in {', '.join(wrong)}" if wrong
            else ""}


def time_step(description: dict, name: str, mode: str, reps: int, device: str) -> dict:
    """The median of `reps` calls of implementation `name` in `mode`, L2 flushed before
    each (fwd: the forward; bwd: the backward from a fixed upstream gradient; fwd+bwd:
    both)."""
    import torch

    from speedlight import candidates

    spec, case = _spec_case(description)
    row = {"step": "time", "case": case.id, "implementation": name, "mode": mode}
    if device != "cuda":
        return dict(row, status="skipped", reason="timings are taken on a GPU only (the "
                                                  "Triton interpreter's say nothing of one)")
    inputs = spec.make_inputs(case, device)
    try:
        fn, _ = candidates.adapt(name, spec, case, inputs, device)
    except candidates.Unsupported as e:
        return dict(row, status="unavailable", reason=str(e))
    train = mode != "fwd"
    leaves = {k: (v.detach().requires_grad_(train) if isinstance(v, torch.Tensor)
                  and v.is_floating_point() else v) for k, v in inputs.items()}
    grads = [leaves[n] for n in ("q", "k", "v")]

    def call():
        out = fn(**leaves)
        return out[0] if isinstance(out, tuple) else out

    if mode == "bwd":
        out = call()
        upstream = torch.randn_like(out)

        def run():
            torch.autograd.grad(out, grads, upstream, retain_graph=True)
    elif mode == "fwd+bwd":
        upstream = torch.randn_like(call())

        def run():
            torch.autograd.grad(call(), grads, upstream)
    else:
        def run():
            with torch.no_grad():
                call()
    for _ in range(3):  # compile, autotune, warm up
        run()
    torch.cuda.synchronize()
    flush = torch.empty(256 * 2 ** 20, dtype=torch.int8, device=device)
    samples = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)  # us
    flops = sum(spec.cost(case, m).flops for m in (("fwd", "bwd") if mode == "fwd+bwd"
                                                   else (mode,)))
    median = statistics.median(samples)
    return dict(row, status="ok", median_us=median, samples_us=samples,
                tflops=flops / (median * 1e-6) / 1e12)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for attention.jsonl")
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--impls", default=",".join(IMPLEMENTATIONS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    import torch

    from speedlight import results

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "attention.jsonl"
    common = {"tool": "gpu-attention", **results.environment(torch.device(device)),
              "representative": device == "cuda"}
    failed = []

    def write(row: dict) -> None:
        results.append_jsonl(path, [{**common, **row}])
        if row["step"] in ("verify", "mask") and row["status"] in ("fail", "error"):
            failed.append(row)
        extra = (f" {row['tflops']:.0f} TFLOP/s ({row['median_us']:.0f} us)"
                 if row.get("tflops") else "")
        print(f"attention {row['step']} {row.get('implementation', '')} {row.get('mode', '')} "
              f"{row.get('case', '')}: {row['status']}{extra}"
              + (f" ({row['reason']})" if row.get("reason") else ""), flush=True)

    on_gpu = device == "cuda"
    steps = [("verify", c) for c in (VERIFY_CASES if on_gpu else CPU_VERIFY_CASES)]
    steps.append(("mask", MASK_CASE if on_gpu else CPU_MASK_CASE))
    steps += [("time", (c, n, m)) for c in (TIME_CASES if on_gpu else CPU_TIME_CASES)
              for m in args.modes.split(",") if m for n in args.impls.split(",") if n]
    for kind, what in steps:
        if time.perf_counter() - start > args.budget_s:
            label = (_spec_case(what if kind != "time" else what[0])[1].id
                     if kind != "mask" else "mask")
            write({"step": kind, "case": label, "status": "skipped",
                   "reason": "not started: the --budget-s budget was spent"})
            continue
        try:
            if kind == "verify":
                row = verify_step(what, device)
            elif kind == "mask":
                row = mask_step(what, device)
            else:
                row = time_step(*what, args.reps, device)
        except Exception as e:  # recorded; the next step goes on  # noqa: BLE001
            row = {"step": kind, "status": "error", "reason": f"{type(e).__name__}: {e}"[:400]}
        write(row)
    print(f"attention: {time.perf_counter() - start:.0f} s, {len(failed)} failure(s)",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
