"""From a latency to what a row reports: GB/s and TFLOP/s from the OpSpec's Cost, % of
speed-of-light on the device's ceilings, speedups over the baselines, and where the
ceilings and clocks came from.

Speed-of-light floor = max(flops / peak FLOP/s, bytes / bandwidth), on the ceilings
`speedlight probe` measured on this device and driver when cached, else the datasheet's
(the row says which). A figure above 100% cannot be a result: the Cost, the ceilings or
the timing is wrong, and the row says so instead of reporting it.
"""

from __future__ import annotations

import os
import subprocess
import time

import torch

from speedlight import hardware
from speedlight.spec import Cost
from speedlight.target import Target

SOL_BUG = ("above 100% of speed-of-light: a bug in the op's Cost, in the ceilings or in the "
           "timing, not a result")


def device_roof(tgt: Target) -> tuple[hardware.Roof | None, str]:
    """The ceilings % of SOL is computed on, and a note saying where they come from: the
    target's roof, when the target is the GPU the times are measured on."""
    if not tgt.in_use:
        if tgt.origin == "the default":
            return None, "no speed-of-light on the CPU interpreter"
        return None, (f"no speed-of-light: the target, {tgt.sku.name}, is not the device the "
                      f"times are measured on")
    if tgt.roof is None:
        return None, tgt.roof_note
    return tgt.roof, tgt.roof_note


def throughput(cost: Cost, seconds: float) -> dict:
    return {"flops": cost.flops, "bytes": cost.bytes,
            "gbps": cost.bytes / seconds / 1e9 if seconds > 0 else None,
            "tflops": cost.flops / seconds / 1e12 if seconds > 0 else None}


def speed_of_light(cost: Cost, seconds: float, roof: hardware.Roof | None, key: str,
                   roof_note: str = "") -> dict:
    """% of the floor the roof sets; a value above 100 is withheld and flagged as a bug."""
    out = {"sol_pct": None, "sol_bound": None, "sol_floor_us": None, "sol_roof": None,
           "sol_peak": key, "sol_note": roof_note, "sol_bug": None}
    if roof is None or seconds <= 0:
        return out
    floor = roof.floor_seconds(cost.flops, cost.bytes, key)
    pct = 100.0 * floor / seconds
    out.update(sol_bound=roof.bound(cost.flops, cost.bytes, key) if cost.flops else "memory",
               sol_floor_us=floor * 1e6, sol_roof=roof.source,
               sol_bandwidth=roof.bandwidth, sol_peak_flops=roof.flops.get(key))
    if pct > 100.0:
        out.update(sol_bug=SOL_BUG, sol_pct_raw=pct)
    else:
        out["sol_pct"] = pct
    return out


def speedups(ours: dict, baselines: dict[str, dict]) -> tuple[dict, dict]:
    """speedlight's speedup over each baseline (baseline median / ours) for one case and
    mode, and for every speedup withheld, why. Reported only when speedlight passed
    verification on the case and both timings exist."""
    values, why = {}, {}
    for name, row in baselines.items():
        values[name] = None
        if not ours.get("verified"):
            why[name] = f"speedlight not verified on this case ({ours.get('verify_note') or 'not run'})"
        elif ours.get("status") != "ok":
            why[name] = f"speedlight not timed: {ours.get('reason')}"
        elif row.get("status") != "ok":
            why[name] = f"{name} {row.get('status')}: {row.get('reason')}"
        else:
            values[name] = row["median_us"] / ours["median_us"]
    return values, why


# --- clocks --------------------------------------------------------------------------------

_CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
                 "temperature.gpu", "power.draw")
_clock_cache: dict = {}


def smi_id(index: int) -> str:
    """nvidia-smi's name for torch's cuda:`index`. nvidia-smi ignores CUDA_VISIBLE_DEVICES,
    which a Ray worker (or a user) sets to give a process some of a node's GPUs, so
    torch's index is turned into the entry it stands for there (an index, or a GPU UUID)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def read_clocks(device: torch.device, max_age_s: float = 10.0) -> dict:
    """SM and memory clocks (MHz), temperature and power as nvidia-smi reads them now, at
    most every max_age_s; {"note": why} when they cannot be read."""
    if device.type != "cuda":
        return {"note": "CPU: no GPU clocks"}
    index = device.index if device.index is not None else torch.cuda.current_device()
    cached = _clock_cache.get(index)
    if cached and time.monotonic() - cached[0] < max_age_s:
        return cached[1]
    try:
        out = subprocess.run(["nvidia-smi", f"--id={smi_id(index)}", "--format=csv,noheader,nounits",
                              "--query-gpu=" + ",".join(_CLOCK_FIELDS)],
                             capture_output=True, text=True, timeout=10)
        values = [v.strip() for v in out.stdout.strip().split(",")]
        if out.returncode != 0 or len(values) != len(_CLOCK_FIELDS):
            raise ValueError(out.stderr.strip() or out.stdout.strip())
        names = ("sm_mhz", "mem_mhz", "max_sm_mhz", "max_mem_mhz", "temperature_c", "power_w")
        clocks = {n: _number(v) for n, v in zip(names, values)}
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        clocks = {"note": f"nvidia-smi could not read clocks: {e}"}
    _clock_cache[index] = (time.monotonic(), clocks)
    return clocks


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text
