"""The one answer to "which GPU are we talking about": SKU, arch, SM count, roof, and which
peak of the roof an op's arithmetic runs against.

Every tool (verify, bench, inspect, profile and the report) resolves its target here, from
the same two flags:

  --target  a SKU (h200, h100-sxm, h100, a100, b200, l4, mi300x, mi355x), an arch (sm_90a,
            sm_80, sm_100a, or AMD's gfx942, gfx950: the arch's flagship SKU, see
            FLAGSHIP), or native (the GPU in use);
  --sku     with an arch, the SKU whose SM count sizes launches and whose roof the floors
            are on (sm_90a --sku h100-sxm); alone, that SKU.

Without either: the GPU in use, else DEFAULT_SKU (H200), and the Target says so. An
unknown name is a TargetError (a ValueError) whose message lists every SKU and arch, the
same in every tool.

The roof is what `speedlight probe` measured on that SKU when cached (the GPU in use and
its driver first, else the newest measurement of the SKU), else the datasheet's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import torch

from speedlight import hardware
from speedlight.hardware import DeviceSpec, Roof

DEFAULT_SKU = "h200"
# The SKU an arch names when --sku does not say: the largest part of that generation.
FLAGSHIP = {(8, 0): "a100-sxm", (8, 9): "l4", (9, 0): "h200", (10, 0): "b200",
            "gfx942": "mi300x", "gfx950": "mi355x"}
# Op families whose FLOPs run on tensor cores (OpSpec.family); every other op's FLOPs run
# on the CUDA cores in fp32.
TENSOR_CORE_FAMILIES = ("compute-bound", "matmul", "attention")


class TargetError(ValueError):
    """--target / --sku name no known GPU, or ask for one that is not here."""


def arch_name(arch: int | str) -> str:
    """sm_90a for 90: Triton compiles for the arch-specific variant from 9.0 on; an AMD
    arch is its LLVM target already (gfx942)."""
    if isinstance(arch, str):
        return arch
    return f"sm_{arch}{'a' if arch >= 90 else ''}"


def sku_arch(spec: DeviceSpec) -> int | str:
    """The arch a SKU's kernels compile for: its compute capability as an int (90), or an
    AMD SKU's gfx target ("gfx942")."""
    return spec.gfx or 10 * spec.compute_capability[0] + spec.compute_capability[1]


@dataclass(frozen=True)
class Target:
    """The GPU a tool talks about.

    sku: its datasheet (for a GPU in use with no datasheet here, what torch reports of it);
    arch: the compute capability kernels are compiled for (90 for sm_90a), or an AMD
    GPU's gfx target ("gfx942"), normally the SKU's; roof: the ceilings floors are computed on (None: neither a datasheet nor a
    measurement exists); in_use: it is the GPU this process runs on, so times measured here
    are times on the target; native: inspect reads the binaries the GPU in use compiled;
    origin: how it was chosen ("--target h100", "the GPU in use", "the default").
    """

    sku: DeviceSpec
    arch: int | str
    roof: Roof | None
    in_use: bool
    origin: str
    native: bool = False
    roof_note: str = ""
    sources: dict = field(default_factory=dict)

    @property
    def arch_name(self) -> str:
        return arch_name(self.arch)

    @property
    def vendor(self) -> str:
        """amd for a gfx arch, else nvidia."""
        return "amd" if isinstance(self.arch, str) else "nvidia"

    @property
    def warp_size(self) -> int:
        """Lanes of a warp (NVIDIA, 32) or wavefront (AMD Instinct, 64)."""
        return 64 if self.vendor == "amd" else 32

    @property
    def sm_word(self) -> str:
        """What the target calls a multiprocessor: SM, or an AMD compute unit (CU)."""
        return "CU" if self.vendor == "amd" else "SM"

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(9, 0) for sm_90a; an AMD GPU's gfx major and minor as HIP reports them
        ((9, 4) for gfx942), from its SKU."""
        if self.vendor == "amd":
            return self.sku.compute_capability
        return divmod(self.arch, 10)

    @property
    def limits(self) -> hardware.ArchLimits | hardware.AmdArchLimits:
        """What one SM (an AMD CU) of the compiled arch holds (occupancy is computed from
        it)."""
        if self.vendor == "amd":
            return hardware.arch_limits(self.arch)
        return hardware.arch_limits(self.compute_capability)

    @property
    def sm_count(self) -> int:
        return self.sku.sm_count

    @property
    def is_default(self) -> bool:
        return self.origin == "the default"

    def describe(self) -> str:
        """One line for a tool's output: which GPU, why, and where its roof comes from."""
        why = {"the default": "no GPU in use, so the default; --target picks another",
               "the GPU in use": "the GPU in use"}.get(self.origin, self.origin)
        return (f"target {self.sku.name} ({self.arch_name}, {self.sku.sm_count} "
                f"{self.sm_word}s; {why}); "
                f"roof: {self.roof_note}")

    def to_json(self) -> dict:
        roof = self.roof
        return {"key": self.sku.key, "name": self.sku.name, "arch": self.arch_name,
                "sm_count": self.sku.sm_count, "origin": self.origin, "in_use": self.in_use,
                "measured_here": self.in_use,
                "roof_source": roof.source if roof else None,
                "roof_device": roof.device if roof else None,
                "bandwidth": roof.bandwidth if roof else None,
                "peak_flops": dict(roof.flops) if roof else {}, "roof_note": self.roof_note}


def peak_key(dtype: torch.dtype | str | None, *, tensor_core: bool,
             tf32: bool | None = None) -> str:
    """Which peak of the roof an op's FLOPs run against: the one rule for every tool.

    FLOPs off the tensor cores (norms, activations, reductions) run at the fp32 CUDA-core
    peak whatever the storage dtype. On the tensor cores: the dtype's own peak (fp16, bf16,
    fp8); fp32 runs at the tf32 peak when tf32 is allowed, which `tf32` says for the op
    (Triton's tl.dot uses tf32 for fp32 inputs by default) and, when None, PyTorch's
    float32 matmul precision does (the rule for PyTorch's own matmuls)."""
    if not tensor_core:
        return "fp32"
    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    if name in ("float16", "fp16", "half"):
        return "fp16"
    if name in ("bfloat16", "bf16"):
        return "bf16"
    if name.startswith("float8") or name == "fp8":
        return "fp8"
    if tf32 is None:
        tf32 = torch.get_float32_matmul_precision() != "highest"
    return "tf32" if tf32 else "fp32"


def known() -> str:
    """Every name --target takes, for error messages and --help."""
    aliases = ", ".join(sorted(hardware.ALIASES))
    archs = ", ".join(arch_name(10 * a.compute_capability[0] + a.compute_capability[1])
                      for a in hardware.ARCH_LIMITS.values())
    archs += ", " + ", ".join(hardware.AMD_ARCH_LIMITS)
    return (f"SKUs: {', '.join(hardware.DEVICES)} (aliases: {aliases}); archs: {archs}; "
            f"or native (the GPU in use)")


def _unknown(flag: str, name: str) -> TargetError:
    return TargetError(f"{flag} {name!r} is not a known GPU; {flag} takes {known()}")


def _parse_arch(text: str) -> int | str | None:
    """90 for sm_90a (sm90, sm_90); "gfx942" for gfx942 (gfx942:sramecc+:xnack-)."""
    m = re.fullmatch(r"sm_?(\d+)a?", text)
    if m:
        return int(m.group(1))
    m = re.fullmatch(r"(gfx[0-9a-f]+)(:.*)?", text)
    return m.group(1) if m else None


def _sku(flag: str, name: str) -> DeviceSpec:
    try:
        return hardware.get_device_spec(name)
    except KeyError:
        raise _unknown(flag, name) from None


def hip_arch(props) -> str | None:
    """On a ROCm build of torch, the gfx target of a device's properties ("gfx942" of
    gcnArchName "gfx942:sramecc+:xnack-"); None on a CUDA build."""
    if not getattr(torch.version, "hip", None):
        return None
    return (getattr(props, "gcnArchName", "") or "").split(":")[0] or None


def _gpu_in_use(device: torch.device) -> tuple[DeviceSpec, int | str] | None:
    """The DeviceSpec and arch of the GPU this process runs on (a spec built from what
    torch reports when there is no datasheet for it), or None on the CPU. On ROCm the arch
    is the device's gfx target, and a device whose name no datasheet matches (a MI300X
    whose name the driver leaves blank) is its gfx target's flagship when the CU count
    agrees."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    gfx = hip_arch(props)
    arch = gfx or 10 * props.major + props.minor
    try:
        spec = hardware.spec_for_device_name(props.name)
        if gfx is None or spec.gfx == gfx:
            return spec, arch
    except KeyError:
        pass
    flagship = hardware.DEVICES.get(FLAGSHIP.get(gfx, ""))
    if not props.name and flagship is not None and \
            flagship.sm_count == props.multi_processor_count:
        return flagship, arch
    limits = hardware.AMD_ARCH_LIMITS.get(gfx) if gfx else \
        hardware.ARCH_LIMITS.get((props.major, props.minor))
    spec = DeviceSpec(
        name=props.name or gfx, key=re.sub(r"[^a-z0-9]+", "-",
                                           (props.name or gfx).lower()).strip("-"),
        compute_capability=(props.major, props.minor), sm_count=props.multi_processor_count,
        peak_flops={}, dram_bandwidth=0.0, memory_bytes=props.total_memory,
        l2_bytes=getattr(props, "L2_cache_size", 0),
        smem_per_sm=limits.smem_per_block if limits else 0,
        smem_per_block=limits.smem_per_block if limits else 0, gfx=gfx or "",
        warp_size=getattr(props, "warp_size", 64 if gfx else 32),
        sources={"all": "torch.cuda.get_device_properties (no datasheet in speedlight)"})
    return spec, arch


def _ceilings(sku: DeviceSpec, in_use: bool, device: torch.device,
              driver: str | None) -> hardware.Ceilings | None:
    """The GPU in use's own ceilings for its driver, else the newest cached for the SKU."""
    if in_use and driver:
        found = hardware.load_ceilings(torch.cuda.get_device_name(device), driver)
        if found is not None:
            return found
    folder = hardware.cache_dir() / "ceilings"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            c = hardware.Ceilings(**json.loads(path.read_text()))
        except (ValueError, TypeError, OSError):
            continue
        if c.device_name == sku.name or _key_of(c.device_name) == sku.key:
            found.append(c)
    return max(found, key=lambda c: c.measured_at) if found else None


def _key_of(device_name: str) -> str | None:
    try:
        return hardware.spec_for_device_name(device_name).key
    except KeyError:
        return None


def _roof(sku: DeviceSpec, ceilings: hardware.Ceilings | None) -> tuple[Roof | None, str]:
    if ceilings is not None:
        if sku.peak_flops:
            roof = hardware.roof_for(sku, ceilings)
        else:
            roof = Roof(ceilings.copy_bandwidth, dict(ceilings.matmul_flops), "measured",
                        ceilings.device_name)
        return roof, f"measured by speedlight probe ({ceilings.measured_at or 'undated'})"
    if sku.dram_bandwidth and sku.peak_flops:
        return hardware.roof_for(sku), "datasheet (no `speedlight probe` measurement cached)"
    return None, (f"none: no datasheet for {sku.name} and no measured ceilings (run "
                  f"`speedlight probe`, or pass --target)")


def resolve(target: str | None = None, sku: str | None = None,
            device: torch.device | str = "cpu", driver: str | None = None) -> Target:
    """The Target of --target and --sku (see the module docstring), for a run on `device`
    (the GPU in use when it is a CUDA device). `driver` picks the GPU in use's own probe
    measurement; without it the newest one of the SKU is used."""
    device = torch.device(device)
    here = _gpu_in_use(device)
    text = target.strip().lower() if target else None
    native = False
    if text == "native":
        if here is None:
            raise TargetError("--target native means the GPU in use, but this run has none "
                              "(no CUDA device, or --device cpu); name one instead, e.g. "
                              "--target sm_90a or --target h200 (no GPU needed)")
        spec, arch = here
        native, origin = True, "the GPU in use"
        if sku:
            raise TargetError("--sku cannot change the GPU in use (--target native)")
    elif text is not None and _parse_arch(text) is not None:
        arch = _parse_arch(text)
        cc = arch if isinstance(arch, str) else divmod(arch, 10)
        if cc not in hardware.ARCH_LIMITS and cc not in hardware.AMD_ARCH_LIMITS:
            raise _unknown("--target", target)
        if sku:
            spec = _sku("--sku", sku)
            if (spec.vendor == "amd") != isinstance(arch, str):
                raise TargetError(f"--sku {sku} is {spec.name}, which does not run "
                                  f"{arch_name(arch)} code; give an SKU of that arch")
            origin = f"--target {target} --sku {sku}"
        elif cc in FLAGSHIP:
            spec = hardware.DEVICES[FLAGSHIP[cc]]
            origin = f"--target {target}: the flagship of {arch_name(arch)}; --sku picks another"
        else:
            raise TargetError(f"--target {target}: speedlight has no SKU of {arch_name(arch)} "
                              f"to size launches and put floors on; add --sku (one of "
                              f"{', '.join(hardware.DEVICES)})")
    elif text is not None:
        if sku and _sku("--sku", sku).key != _sku("--target", target).key:
            raise TargetError(f"--target {target} names a SKU already; --sku goes with an "
                              f"arch (--target sm_90a --sku {sku})")
        spec = _sku("--target", target)
        arch = sku_arch(spec)
        origin = f"--target {target}"
    elif sku:
        spec = _sku("--sku", sku)
        arch = sku_arch(spec)
        origin = f"--sku {sku}"
    elif here is not None:
        spec, arch = here
        native, origin = True, "the GPU in use"
    else:
        spec = hardware.DEVICES[DEFAULT_SKU]
        arch = sku_arch(spec)
        origin = "the default"
    in_use = here is not None and here[0].key == spec.key
    roof, note = _roof(spec, _ceilings(spec, in_use, device, driver))
    return Target(spec, arch, roof, in_use, origin, native=native, roof_note=note)

