"""gpu-check's Gluon attention section (issue 50): verify the Gluon forward first, then time
it beside the Triton kernel, cuDNN, FlexAttention and SDPA's flash backend.

    python scripts/gpu/attention_gluon.py --out DIR [--budget-s N]

1. environment: the device, Triton's version and whether its Gluon has what the kernel
   needs (kernels/attention/gluon_api.missing);
2. verify: speedlight verify's rule (float64 reference, k x PyTorch's own error, forward
   and backward: the backward is the Triton one, reading the Gluon forward's o and lse) on
   cases the float64 reference fits (VERIFY_CASES: the headline's shape at 1024 tokens,
   causal and not, GQA, windows, softcap, head dims 64 to 256, fp16, packed sequences,
   queries fewer than keys, a transposed layout), each row saying whether the Gluon
   kernel ran (a call outside its design runs the Triton forward, which would pass too);
   then faults (FAULT_CASES): NaN and +inf in v at keys that rows of the same boundary
   block cannot see, which the Gluon forward's product spreads to them and its fault pass
   (the Triton fault kernel) must redo: o and lse as the float64 reference that masks by
   selection, NaN and inf at its positions only, and both kernels seen to run;
3. time: at the headline (TIME_CASES: batch 2, 32 heads, 8 KV heads, 8192 tokens, head dim
   128, causal and not, bf16), each implementation's median forward and backward over
   --reps calls, L2 flushed before each, with TFLOP/s from the op's cost: speedlight
   (Triton), speedlight-gluon (its rows say `verified`: every verify step passed),
   sdpa-cudnn, flex-attention, sdpa-flash.

A Gluon kernel no GPU has run may hang (an mbarrier phase never reached): every step runs
in a child process that reports as it goes, and a step silent for --step-timeout-s is
recorded as `hang`, the child killed and the next step run in a fresh one. Rows go to
DIR/attention_gluon.jsonl as each step finishes; a step not started within --budget-s
seconds is a skipped row saying so, as is what cannot run here (on a CPU: the Gluon
kernel, which the Triton interpreter does not run, and the GPU libraries). Exit 1 when
the Gluon forward fails verification, errors or hangs, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IMPLEMENTATIONS = ("speedlight", "speedlight-gluon", "sdpa-cudnn", "flex-attention",
                   "sdpa-flash")
HEADLINE = "batch2-heads32-kv_heads8-seq_q8192-seq_k8192-dim128"


def _case(b, h, hkv, sq, sk, d, dtype="bf16", layout="contiguous", **flags):
    return dict(params=[["batch", b], ["heads", h], ["kv_heads", hkv], ["seq_q", sq],
                        ["seq_k", sk], ["dim", d]], dtype=dtype, layout=layout, flags=flags)


def _packed(h, hkv, d, lens, **flags):
    joined = "_".join(map(str, lens))
    return _case(len(lens), h, hkv, sum(lens), sum(lens), d, lens_q=joined, lens_k=joined,
                 **flags)


# What the Gluon forward must get right, at sizes the float64 reference fits.
VERIFY_CASES = (
    _case(2, 8, 2, 1024, 1024, 128, causal=True, lse=True),  # the headline's shape, scaled
    _case(1, 4, 4, 1000, 1000, 128),  # not causal, a partial last block
    _case(2, 8, 2, 1024, 1024, 128, dtype="fp16", causal=True),
    _case(1, 8, 2, 1021, 1021, 64, causal=True, left=300),  # a sliding window, GQA 4
    _case(1, 2, 2, 700, 900, 128, left=100, right=50, scale=0.3),  # both sides, a scale
    _case(1, 4, 4, 1024, 1024, 256, causal=True, softcap=50.0),
    _case(1, 4, 4, 513, 513, 96, causal=True),  # head dim padded to 128 by TMA's zeros
    _case(2, 8, 2, 300, 2000, 128, causal=True, lse=True),  # queries after a cache
    _case(1, 2, 1, 200, 50, 64, causal=True, lse=True),  # rows that see no key
    _case(1, 8, 8, 512, 512, 128, layout="transposed", causal=True),
    _packed(8, 2, 128, [1, 300, 0, 777, 64, 129], causal=True, lse=True),
)
# Faults a mask hides, as (case, [key, value] in v's first kv head, column 5): key 700 of
# 1024 in the diagonal's block of rows 640-767 (+inf at 701), key 100 left of a 300-key
# window for rows 401 on.
FAULT_CASES = (
    (_case(2, 8, 2, 1024, 1024, 128, causal=True, lse=True), [[700, "nan"], [701, "inf"]]),
    (_case(1, 4, 2, 1021, 1021, 64, causal=True, left=300, lse=True), [[100, "nan"]]),
)
TIME_CASES = (_case(2, 32, 8, 8192, 8192, 128, causal=True), _case(2, 32, 8, 8192, 8192, 128))
# The CPU test's sizes (the Triton interpreter)
CPU_VERIFY_CASES = (_case(1, 2, 1, 40, 40, 64, causal=True, lse=True),)
CPU_FAULT_CASES = ((_case(1, 2, 1, 40, 40, 64, causal=True, lse=True), [[30, "nan"]]),)
CPU_TIME_CASES = (_case(1, 2, 1, 32, 32, 32, causal=True),)


# --- one step, in the child ---------------------------------------------------------------

def _spec_case(description: dict):
    import torch

    from speedlight.ops.attention import SPEC
    from speedlight.spec import Case

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        description["dtype"]]
    case = Case("attention", tuple(tuple(p) for p in description["params"]), dtype=dtype,
                layout=description["layout"], flags=dict(description["flags"]))
    return SPEC, case


def _gluon_ran(spec, case, device) -> list[str]:
    """The kernels the Gluon implementation's forward launches on the case."""
    import torch

    from speedlight.launch import watch_launches

    inputs = spec.make_inputs(case, device)
    with torch.no_grad(), watch_launches() as launched:
        spec.implementations["gluon"].fn(**inputs)
    return launched


def verify_step(description: dict, device: str) -> dict:
    from speedlight.ops import attention_gluon
    from speedlight.verify import verify_case

    spec, case = _spec_case(description)
    row = {"step": "verify", "case": case.id, "implementation": "speedlight-gluon"}
    reason = attention_gluon.gluon_unavailable(device)
    if reason:
        return dict(row, status="skipped", reason=reason)
    kernels = _gluon_ran(spec, case, device)
    r = verify_case(spec, case, device, impl="gluon")
    ran = any(k.startswith("_attention_fwd_gluon") for k in kernels)  # sm_90a's or sm_100a's
    status = r.status if ran or r.status != "pass" else "fail"
    why = r.reason or ("" if ran else "the Gluon kernel did not run (the Triton forward "
                                      "served the call)")
    return dict(row, status=status, reason=why, kernels=kernels, gluon_ran=ran,
                checks={c.name: {"passed": c.passed, "ratio": c.ratio} for c in r.checks})


def faults_step(description: dict, at: list, device: str) -> dict:
    """The Gluon forward on the case's inputs with v's first kv head faulted at `at`
    ([key, value]): o and lse judged as verify judges them (NaN and inf positions as the
    float64 reference's, which masks by selection; the rest within k x PyTorch's own
    error), and the Gluon kernel and the fault pass seen to run."""
    import torch

    from speedlight.launch import watch_launches
    from speedlight.ops import attention_gluon
    from speedlight.spec import as_outputs
    from speedlight.verify.harness import judge_outputs, references

    spec, case = _spec_case(description)
    row = {"step": "faults", "case": case.id, "implementation": "speedlight-gluon",
           "faults": at}
    reason = attention_gluon.gluon_unavailable(device)
    if reason:
        return dict(row, status="skipped", reason=reason)
    inputs = spec.make_inputs(case, device)
    for key, value in at:
        inputs["v"][0, 0, key, 5] = float(value)
    refs = references(spec, inputs)
    with torch.no_grad(), watch_launches() as kernels:
        ours = as_outputs(spec.implementations["gluon"].fn(**inputs))
    checks = judge_outputs(ours, refs, spec.tolerance(case.dtype))
    ran = any(k.startswith("_attention_fwd_gluon") for k in kernels)
    redone = "_attention_fwd_faults_kernel" in kernels
    failed = [c for c in checks if not c.passed]
    why = "; ".join([f"{c.name}: {c.reason}" for c in failed]
                    + ([] if ran else ["the Gluon kernel did not run (the Triton forward "
                                       "served the call)"])
                    + ([] if redone else ["no fault pass ran"]))
    return dict(row, status="pass" if not why else "fail", reason=why, kernels=kernels,
                gluon_ran=ran, checks={c.name: {"passed": c.passed, "ratio": c.ratio}
                                       for c in checks})


def _flush(buffer):
    buffer.zero_()


def time_step(description: dict, name: str, mode: str, reps: int, device: str) -> dict:
    """The median of `reps` calls of implementation `name` in `mode` (fwd: the forward;
    bwd: the backward from a fixed upstream gradient), L2 flushed before each."""
    import statistics

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
    leaves = {k: (v.detach().requires_grad_(mode == "bwd") if isinstance(v, torch.Tensor)
                  and v.is_floating_point() else v) for k, v in inputs.items()}
    flush = torch.empty(256 * 2 ** 20, dtype=torch.int8, device=device)
    cost = spec.cost(case, mode)

    def call():
        out = fn(**leaves)
        return out[0] if isinstance(out, tuple) else out

    if mode == "bwd":
        out = call()
        upstream = torch.randn_like(out)
        grads = [leaves[n] for n in ("q", "k", "v")]

        def run():
            torch.autograd.grad(out, grads, upstream, retain_graph=True)
    else:
        def run():
            with torch.no_grad():
                call()
    for _ in range(3):  # compile, autotune, warm up
        run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        _flush(flush)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)  # us
    median = statistics.median(samples)
    return dict(row, status="ok", median_us=median, samples_us=samples,
                tflops=cost.flops / (median * 1e-6) / 1e12)


def run_child(steps: list[dict], device: str) -> int:
    """Run each step, printing a START line before and its row (JSON) after."""
    for step in steps:
        print("START " + json.dumps(step), flush=True)
        try:
            if step["kind"] == "verify":
                row = verify_step(step["case"], device)
            elif step["kind"] == "faults":
                row = faults_step(step["case"], step["at"], device)
            elif step["kind"] == "wait":  # a step that only waits (the watchdog's tests)
                time.sleep(step["seconds"])
                row = {"step": "wait", "status": "ok"}
            else:
                row = time_step(step["case"], step["name"], step["mode"], step["reps"], device)
        except Exception as e:  # recorded; the next step goes on  # noqa: BLE001
            row = {"step": step["kind"], "status": "error",
                   "reason": f"{type(e).__name__}: {e}"[:400]}
        print("ROW " + json.dumps(row, default=str), flush=True)
    return 0


# --- the parent: steps in children, a watchdog per step ----------------------------------

def _child(steps: list[dict], device: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.Popen([sys.executable, __file__, "--child", json.dumps(steps),
                             "--device", device], stdout=subprocess.PIPE, env=env, cwd=ROOT)


# A child's start (Python, torch, CUDA) is not a step: it gets this long before its first line.
STARTUP_S = 300.0


def _lines(proc: subprocess.Popen, timeout_s: float):
    """The child's output lines as they come; None after timeout_s without a line
    (STARTUP_S before the first); ends when the child closes its output."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    pending, started = b"", False
    try:
        while True:
            if b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                started = True
                yield line.decode()
                continue
            if not sel.select(timeout=timeout_s if started else max(timeout_s, STARTUP_S)):
                yield None
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return
            pending += chunk
    finally:
        sel.close()


def run_steps(steps: list[dict], device: str, timeout_s: float, deadline: float, write) -> None:
    """Every step in order, in as few children as hangs allow; a step silent for timeout_s
    is recorded as a hang and skipped; steps not started by `deadline` are skipped rows."""
    todo = list(steps)
    while todo:
        if time.perf_counter() > deadline:
            for s in todo:
                write(dict(_describe(s), status="skipped",
                           reason="not started: the --budget-s budget was spent"))
            return
        proc = _child(todo, device)
        current, done = None, 0
        for line in _lines(proc, timeout_s):
            if line is None:  # silent for timeout_s
                if current is None:  # it never started a step
                    write(dict(_describe(todo[0]), status="error",
                               reason="the step's process said nothing"))
                else:
                    write(dict(_describe(current), status="hang",
                               reason=f"no result within {timeout_s:g} s: killed"))
                done += 1
                break
            if line.startswith("START "):
                current = json.loads(line[6:])
                if time.perf_counter() > deadline:
                    break
            elif line.startswith("ROW "):
                write(dict(_describe(current), **json.loads(line[4:])))
                current, done = None, done + 1
        else:
            if current is not None:  # the child died inside a step
                proc.wait()
                write(dict(_describe(current), status="error",
                           reason=f"the step's process exited {proc.returncode}"))
                done += 1
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        todo = todo[done:]


def _describe(step: dict) -> dict:
    if "case" not in step:
        return {"step": step["kind"]}
    out = {"step": step["kind"], "case": _label(step["case"])}
    if step["kind"] == "time":
        out.update(implementation=step["name"], mode=step["mode"])
    else:
        out["implementation"] = "speedlight-gluon"
    return out


def _label(description: dict) -> str:
    params = "-".join(f"{k}{v}" for k, v in description["params"])
    flags = "-".join(k if v is True else f"{k}={v}" for k, v in description["flags"].items())
    return "-".join(x for x in (params, description["dtype"], flags) if x)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="folder for attention_gluon.jsonl")
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--step-timeout-s", type=float, default=240.0,
                   help="a step silent this long is a hang (compiles included)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--impls", default=",".join(IMPLEMENTATIONS))
    p.add_argument("--modes", default="fwd,bwd")
    p.add_argument("--device", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:  # torch is imported by the steps that need it
        return run_child(json.loads(args.child), args.device)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not args.out:
        p.error("--out is required")
    from speedlight import results
    from speedlight.kernels.attention import gluon_api

    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "attention_gluon.jsonl"
    common = {"tool": "gpu-attention-gluon", **results.environment(torch.device(device)),
              "representative": device == "cuda"}
    failed, verified = [], []

    def write(row: dict) -> None:
        if row["step"] in ("verify", "faults"):
            verified.append(row["status"] == "pass")
        elif row["step"] == "time" and row.get("implementation") == "speedlight-gluon":
            # timed whatever verify said, labelled with it: no speedup is read from a kernel
            # that failed or was not verified
            row = dict(row, verified=bool(verified) and all(verified))
        results.append_jsonl(path, [{**common, **row}])
        if row.get("implementation") == "speedlight-gluon" and row["status"] in (
                "fail", "error", "hang"):
            failed.append(row)
        extra = (f" {row['tflops']:.0f} TFLOP/s ({row['median_us']:.0f} us)"
                 if row.get("tflops") else "")
        print(f"attention-gluon {row['step']} {row.get('implementation', '')} "
              f"{row.get('mode', '')} {row.get('case', '')}: {row['status']}{extra}"
              + (f" ({row['reason']})" if row.get("reason") else ""), flush=True)

    missing = gluon_api.missing()
    write({"step": "environment", "status": "ok" if missing is None else "unavailable",
           "reason": missing, "gluon_triton": missing is None})
    on_gpu = device == "cuda"
    verify_cases = VERIFY_CASES if on_gpu else CPU_VERIFY_CASES
    fault_cases = FAULT_CASES if on_gpu else CPU_FAULT_CASES
    time_cases = TIME_CASES if on_gpu else CPU_TIME_CASES
    steps = [{"kind": "verify", "case": c} for c in verify_cases]
    steps += [{"kind": "faults", "case": c, "at": at} for c, at in fault_cases]
    steps += [{"kind": "time", "case": c, "name": n, "mode": m, "reps": args.reps}
              for c in time_cases for m in args.modes.split(",") if m
              for n in args.impls.split(",") if n]
    run_steps(steps, device, args.step_timeout_s, start + args.budget_s, write)
    print(f"attention-gluon: {time.perf_counter() - start:.0f} s, "
          f"{len(failed)} Gluon failure(s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
