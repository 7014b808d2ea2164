"""Speed-of-light floors on a target GPU, and what bounds each op there.

floor = max(FLOPs / peak, bytes / bandwidth), on the ceilings `speedlight probe` measured
on that SKU when they are cached, else on the datasheet's. Matmul-class FLOPs (matmul,
attention, convolution) run against the tensor-core peak of their dtype (tf32 for fp32
when torch allows it); every other op's FLOPs against the fp32 CUDA-core peak.

Bound:
- launch: the op's kernels are shorter than LAUNCH_S (measured on the GPU), or its floor
  is (projected): launching it costs more than running it, and back-to-back launches of
  such kernels leave the GPU idle (CUDA graphs or fusion recover that time);
- compute / memory: which of the two terms of the floor is larger;
- none: views and allocations, which launch nothing; unknown: no cost formula.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from speedlight import hardware
from speedlight.hardware import DeviceSpec, Roof
from speedlight.profile.costs import OpCost

LAUNCH_S = 5e-6  # an eager kernel launch costs the host about this; shorter kernels starve the GPU
DEFAULT_TARGET = "h200"


class TargetError(ValueError):
    """--target names no known GPU."""


@dataclass(frozen=True)
class Target:
    spec: DeviceSpec
    roof: Roof
    measured_here: bool  # the times were measured on this SKU, so distances mean something
    note: str

    def to_json(self) -> dict:
        return {"key": self.spec.key, "name": self.spec.name, "roof_source": self.roof.source,
                "roof_device": self.roof.device, "bandwidth": self.roof.bandwidth,
                "peak_flops": dict(self.roof.flops), "measured_here": self.measured_here,
                "launch_s": LAUNCH_S, "note": self.note}


def find_ceilings(spec: DeviceSpec) -> hardware.Ceilings | None:
    """The newest ceilings `speedlight probe` cached for any device of this SKU."""
    folder = hardware.cache_dir() / "ceilings"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            c = hardware.Ceilings(**json.loads(path.read_text()))
            if hardware.spec_for_device_name(c.device_name).key == spec.key:
                found.append(c)
        except (ValueError, TypeError, KeyError, OSError):
            continue
    return max(found, key=lambda c: c.measured_at) if found else None


def resolve(name: str | None, device: torch.device, driver: str | None = None) -> Target:
    """The target of the floors: --target, else the GPU in use, else DEFAULT_TARGET."""
    here = hardware.current_device_spec() if device.type == "cuda" else None
    if name is None:
        if device.type == "cuda" and here is None:
            raise TargetError(f"no DeviceSpec for {torch.cuda.get_device_name(device)!r}; pass "
                              f"--target (one of {', '.join(hardware.DEVICES)})")
        spec = here or hardware.DEVICES[DEFAULT_TARGET]
    else:
        try:
            spec = hardware.get_device_spec(name)
        except KeyError:
            raise TargetError(f"--target {name!r}: unknown GPU; known: "
                              f"{', '.join(hardware.DEVICES)}") from None
    measured_here = here is not None and here.key == spec.key
    ceilings = None
    if measured_here and driver:
        ceilings = hardware.load_ceilings(torch.cuda.get_device_name(device), driver)
    ceilings = ceilings or find_ceilings(spec)
    roof = hardware.roof_for(spec, ceilings)
    source = ("ceilings measured by speedlight probe" if roof.source == "measured"
              else "datasheet peaks (run speedlight probe on the GPU for measured ceilings)")
    if measured_here:
        note = f"times measured on {spec.name}; floors on its {source}"
    elif device.type == "cuda":
        note = (f"times measured on {torch.cuda.get_device_name(device)}; floors projected onto "
                f"{spec.name} ({source}); no distance to the floor across devices")
    else:
        default = " (the default; --target picks another)" if name is None else ""
        note = (f"no GPU: times are CPU times (not representative); floors and bounds are "
                f"projected onto {spec.name}{default} from its {source}")
    return Target(spec, roof, measured_here, note)


def peak_key(cost: OpCost, dtype: torch.dtype | str | None) -> str:
    """Which peak of the roof an op's FLOPs run against."""
    if not cost.tensor_core:
        return "fp32"
    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    if name in ("float16", "fp16"):
        return "fp16"
    if name in ("bfloat16", "bf16"):
        return "bf16"
    if name.startswith("float8"):
        return "fp8"
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"


def floor_seconds(cost: OpCost, key: str, roof: Roof) -> float:
    if not cost.kernel:
        return 0.0
    return roof.floor_seconds(cost.flops, cost.bytes, key)


def bound(cost: OpCost | None, floor_s: float, key: str, roof: Roof,
          kernel_times: list[float] | None = None) -> str:
    """compute, memory, launch, none or unknown (see the module docstring)."""
    if cost is None:
        return "unknown"
    if not cost.kernel:
        return "none"
    if kernel_times:
        if max(kernel_times) < LAUNCH_S:
            return "launch"
    elif floor_s < LAUNCH_S:
        return "launch"
    if cost.flops == 0:
        return "memory"
    return roof.bound(cost.flops, cost.bytes, key)

