"""Measure what this GPU can do: the ceilings every "% of speed-of-light" figure uses.

  copy bandwidth  a device-to-device copy of a buffer far larger than L2 (>= 16x), counted
                  as bytes read + bytes written per second
  matmul rate     dense matmuls on random data per dtype: tf32 (fp32 inputs with
                  TF32 tensor cores allowed), fp16, bf16, and fp8 (e4m3 through
                  torch._scaled_mm) where the device and torch support it; the best of a
                  few shapes (8192 cubed and Llama-3-8B's MLP projections at 4096 tokens)

Each is timed exactly as bench times an op (CUDA events, warm-up, L2 flush and a lead spin
before every sample, adaptive samples) and the median taken. The first H200 run showed why
both matter: measured back to back without the flush, 8192-cubed bf16 ran at 663 TFLOP/s
while bench then timed cuBLAS at 762-791 TFLOP/s on Llama's projections, i.e. "115% of
speed-of-light"; a ceiling must be reached under the same protocol as what it divides. The result is cached per device name and driver (hardware.save_ceilings), where
bench, inspect and profile read it. This lives in bench because it is a measurement made
with bench's timer; the cache it writes is hardware's, so no other tool imports bench.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

import torch

from speedlight import hardware
from speedlight.bench.timer import CudaEventClock, GpuLead, StopRule, flush_for, measure

PROBE_RULE = StopRule(target_rse=0.005, min_samples=10, max_samples=200, time_cap_s=1.0,
                      warmup_calls=3, warmup_s=0.1)
MATMUL_DTYPES = ("tf32", "fp16", "bf16", "fp8")
# (m, n, k): a large cube, and Llama-3-8B's up and down projections at 4096 tokens (the
# shapes bench's GEMM section times); the ceiling is the best of them
MATMUL_SHAPES = ((8192, 8192, 8192), (4096, 14336, 4096), (4096, 4096, 14336))


@dataclass
class Reading:
    what: str
    value: float | None  # bytes/s or FLOP/s
    median_s: float | None = None
    p20_s: float | None = None
    p80_s: float | None = None
    size: str = ""
    note: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _time(run, device: torch.device, rule: StopRule):
    """bench's protocol: the L2 flushed and the lead spin before every timed call."""
    return measure(run, clock=CudaEventClock(device), rule=rule, flush=flush_for(device),
                   lead=GpuLead(device)).summary


def copy_bandwidth(device: torch.device, nbytes: int | None = None, rule: StopRule = PROBE_RULE) -> Reading:
    """dst.copy_(src) on `nbytes` (default: 16x the L2, at least 1 GiB, within a quarter of
    free memory): 2 * nbytes moved per copy."""
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2 ** 20)
    free = torch.cuda.mem_get_info(device)[0]
    if nbytes is None:
        nbytes = min(max(16 * l2, 2 ** 30), free // 4)
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    s = _time(lambda k: dst.copy_(src), device, rule)
    moved = 2 * n * 4
    return Reading("copy", moved / s.median, s.median, s.p20, s.p80,
                   f"{n * 4 / 2 ** 30:.2f} GiB buffer ({n * 4 / l2:.0f}x L2)")


def matmul_rate(device: torch.device, dtype: str, shapes=MATMUL_SHAPES,
                rule: StopRule = PROBE_RULE) -> Reading:
    """Dense matmul FLOP/s (2 m n k per call) on random normal data: the best of `shapes`
    ((m, n, k) triples), with the shape that reached it."""
    best = None
    for m, n, k in shapes:
        r = _matmul_rate(device, dtype, m, n, k, rule)
        if r.value is None:
            return r
        if best is None or r.value > best.value:
            best = r
    if len(shapes) > 1:
        best.note = f"best of {len(shapes)} shapes"
    return best


def _matmul_rate(device: torch.device, dtype: str, m: int, n: int, k: int,
                 rule: StopRule) -> Reading:
    g = torch.Generator(device=device).manual_seed(0)
    if dtype == "fp8":
        return _fp8_rate(device, m, n, k, g, rule)
    torch_dtype = {"tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(m, k, device=device, generator=g).to(torch_dtype)
    b = torch.randn(k, n, device=device, generator=g).to(torch_dtype)
    c = torch.empty(m, n, device=device, dtype=torch_dtype)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        s = _time(lambda i: torch.matmul(a, b, out=c), device, rule)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return Reading(dtype, 2 * m * n * k / s.median, s.median, s.p20, s.p80, f"{m}x{n}x{k}")


def _fp8_rate(device: torch.device, m: int, n: int, k: int, g: torch.Generator,
              rule: StopRule) -> Reading:
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return Reading("fp8", None, note=f"torch {torch.__version__} has no _scaled_mm / float8")
    if torch.cuda.get_device_capability(device) < (8, 9):
        return Reading("fp8", None, note="fp8 tensor cores need compute capability 8.9 or newer")
    a = torch.randn(m, k, device=device, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device, generator=g).to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device=device)
    try:
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except Exception as e:  # the device or build does not support it
        return Reading("fp8", None, note=f"torch._scaled_mm failed: {type(e).__name__}: {e}"[:300])
    s = _time(lambda i: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
              device, rule)
    return Reading("fp8", 2 * m * n * k / s.median, s.median, s.p20, s.p80,
                   f"{m}x{n}x{k} e4m3, bf16 out")


def probe(device: torch.device, *, copy_bytes: int | None = None, matmul_n: int | None = None,
          dtypes=MATMUL_DTYPES, driver: str | None = None) -> tuple[hardware.Ceilings, list[Reading]]:
    """Measure the ceilings; returns them (ready for hardware.save_ceilings) and the readings.
    `matmul_n` measures the one n x n x n shape instead of MATMUL_SHAPES."""
    from speedlight import results

    env = results.environment(device)
    readings = [copy_bandwidth(device, copy_bytes)]
    shapes = MATMUL_SHAPES if matmul_n is None else ((matmul_n,) * 3,)
    readings += [matmul_rate(device, d, shapes) for d in dtypes]
    ceilings = hardware.Ceilings(
        device_name=torch.cuda.get_device_name(device), driver=driver or env.get("driver") or "unknown",
        copy_bandwidth=readings[0].value,
        matmul_flops={r.what: r.value for r in readings[1:] if r.value is not None},
        measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        details={"readings": [r.to_json() for r in readings],
                 "torch": env.get("torch"), "cuda": env.get("cuda"), "git": env.get("git")})
    return ceilings, readings
