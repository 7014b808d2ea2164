"""Speed-of-light floors on a target GPU, and what bounds each op there.

floor = max(FLOPs / peak, bytes / bandwidth), on the ceilings `speedlight probe` measured
on that SKU when they are cached, else on the datasheet's (the target and its roof come
from speedlight.target). Matmul-class FLOPs (matmul, attention, convolution) run against
the tensor-core peak of their dtype (tf32 for fp32 when torch allows it); every other op's
FLOPs against the fp32 CUDA-core peak.

Bound:
- launch (overhead-bound): the op's kernels together run shorter than their launches cost,
  LAUNCH_S each (measured on the GPU: an op of three launches, a decode step's norm
  backward say, has a fixed cost of three), or its floor is shorter than one launch
  (projected): launching it costs more than running it, and back-to-back launches of such
  kernels leave the GPU idle (CUDA graphs or fusion recover that time);
- compute / memory: which of the two terms of the floor is larger;
- none: views and allocations, which launch nothing; unknown: no cost formula.
"""

from __future__ import annotations

import torch

from speedlight import target
from speedlight.hardware import Roof
from speedlight.workloads.costs import OpCost

LAUNCH_S = 5e-6  # an eager kernel launch costs the host about this; shorter kernels starve the GPU


def with_roof(tgt: target.Target) -> tuple[target.Target, str | None]:
    """The target floors go on: `tgt`, or, for a GPU in use that has neither a datasheet
    nor a probe measurement, the default SKU, with a note saying so."""
    if tgt.roof is not None:
        return tgt, None
    default = target.resolve(target.DEFAULT_SKU)
    return default, (f"{tgt.sku.name} has no roof here ({tgt.roof_note}); floors are "
                     f"projected onto {default.sku.name}, the default")


def note(tgt: target.Target, device: torch.device) -> str:
    """What the floors of a profile on `device` mean against the target."""
    source = ("ceilings measured by speedlight probe" if tgt.roof and tgt.roof.source == "measured"
              else "datasheet peaks (run speedlight probe on the GPU for measured ceilings)")
    if tgt.in_use:
        return f"times measured on {tgt.sku.name}; floors on its {source}"
    if device.type == "cuda":
        return (f"times measured on {torch.cuda.get_device_name(device)}; floors projected onto "
                f"{tgt.sku.name} ({source}); no distance to the floor across devices")
    default = " (the default; --target picks another)" if tgt.is_default else ""
    return (f"no GPU: times are CPU times (not representative); floors and bounds are "
            f"projected onto {tgt.sku.name}{default} from its {source}")


def floor_seconds(cost: OpCost, key: str, roof: Roof) -> float:
    if not cost.kernel:
        return 0.0
    return roof.floor_seconds(cost.flops, cost.bytes, key)


def launch_floor(launches: int) -> float:
    """The fixed cost of a call that launches `launches` kernels in eager mode."""
    return launches * LAUNCH_S


def bound(cost: OpCost | None, floor_s: float, key: str, roof: Roof,
          kernel_times: list[float] | None = None) -> str:
    """compute, memory, launch, none or unknown (see the module docstring)."""
    if cost is None:
        return "unknown"
    if not cost.kernel:
        return "none"
    if kernel_times:
        if sum(kernel_times) < launch_floor(len(kernel_times)):
            return "launch"
    elif floor_s < LAUNCH_S:
        return "launch"
    if cost.flops == 0:
        return "memory"
    return roof.bound(cost.flops, cost.bytes, key)

