"""What each GPU can do: datasheet DeviceSpecs per exact SKU, and measured ceilings.

Every "% of speed-of-light" figure prefers the ceilings `speedlight probe` measured on the
device (cached per SKU and driver in the user's cache folder) over the datasheet peaks.
Datasheet peaks are dense (no 2:4 sparsity) and at boost clock.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

TB = 1e12
T = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet numbers of one GPU SKU. `peak_flops` maps a dtype name (fp32, tf32,
    fp16, bf16, fp8) to dense FLOP/s; `sources` maps each field to where it comes from."""

    name: str
    key: str
    compute_capability: tuple[int, int]
    sm_count: int
    peak_flops: dict[str, float]
    dram_bandwidth: float  # bytes/s
    memory_bytes: int
    l2_bytes: int
    smem_per_sm: int  # bytes of shared memory a multiprocessor has
    smem_per_block: int  # the most one program may use
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    sources: dict[str, str] = field(default_factory=dict)
    # AMD: the LLVM target kernels compile for ("gfx942"; "" for NVIDIA), the wavefront
    # size, and the memory-side last-level cache (Infinity Cache) beside the L2.
    gfx: str = ""
    warp_size: int = 32
    l3_bytes: int = 0

    @property
    def vendor(self) -> str:
        return "amd" if self.gfx else "nvidia"

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise KeyError(f"{self.name} has no {dtype} peak; known: {', '.join(self.peak_flops)}")
        return self.peak_flops[dtype]


_A100_WP = "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB) and Ampere GA100 whitepaper"
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (dense = half the sparsity figures)"
_H100_WP = "NVIDIA H100 Hopper architecture whitepaper (GH100, SXM5 / PCIe product configs)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column; dense)"
_B200_DS = "NVIDIA HGX B200 datasheet, per GPU at 1000 W (dense = half the sparsity figures)"
# B200's HBM3e as the driver reports it (cudaDeviceProp / nvidia-smi): a 7680-bit bus at a
# 3996 MHz memory clock, double data rate: 7680 / 8 x 3996e6 x 2 = 7.672 TB/s. The
# datasheet rounds this to 8 TB/s; a roof must be the rate the memory has.
_B200_BUS_BITS, _B200_MEMORY_HZ = 7680, 3996e6
_B200_BW = ("memory bus width (7680 bits) and memory clock (3996 MHz, double data rate) the "
            "NVIDIA driver reports for B200 (cudaDeviceProp memoryBusWidth / memoryClockRate): "
            "7.672 TB/s; the HGX B200 datasheet rounds it to 8 TB/s")
_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet (dense = half the sparsity figures)"
_CUDA_GUIDE = "CUDA C++ Programming Guide, table 'Technical Specifications per Compute Capability'"
# AMD Instinct: CUs are the SMs of every figure (sm_count), LDS the shared memory, a
# wavefront of 64 lanes the warp. Peaks are dense (the datasheets' "with structured
# sparsity" figures halved).
_MI300X_DS = "AMD Instinct MI300X data sheet (OAM, 750 W; dense peaks)"
_MI355X_DS = "AMD Instinct MI355X data sheet (OAM, 1400 W; dense peaks)"
_ROCM_SPECS = ("ROCm documentation, 'AMD GPU specifications' (reference/gpu-specs): compute "
               "units, wavefront size, LDS, L2 and L3 (Infinity Cache), VGPR file per CU")
_CDNA3_ISA = "AMD Instinct MI300 (CDNA3) Instruction Set Architecture reference guide"
_CDNA4_ISA = "AMD Instinct MI355X/MI350X (CDNA4) Instruction Set Architecture reference guide"

DEVICES: dict[str, DeviceSpec] = {
    d.key: d for d in [
        DeviceSpec(
            name="NVIDIA A100-SXM4-80GB", key="a100-sxm", compute_capability=(8, 0),
            sm_count=108,
            peak_flops={"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "bf16": 312 * T},
            dram_bandwidth=2.039 * TB, memory_bytes=80 * 10**9, l2_bytes=40 * 2**20,
            smem_per_sm=164 * 1024, smem_per_block=163 * 1024,
            sources={"peak_flops": _A100_WP, "dram_bandwidth": _A100_WP + " (HBM2e, 80GB SKU)",
                     "sm_count": _A100_WP, "l2_bytes": _A100_WP, "smem": _CUDA_GUIDE}),
        DeviceSpec(
            name="NVIDIA H100 80GB HBM3", key="h100-sxm", compute_capability=(9, 0),
            sm_count=132,
            peak_flops={"fp32": 67 * T, "tf32": 494.7 * T, "fp16": 989.4 * T,
                        "bf16": 989.4 * T, "fp8": 1978.9 * T},
            dram_bandwidth=3.35 * TB, memory_bytes=80 * 10**9, l2_bytes=50 * 2**20,
            smem_per_sm=228 * 1024, smem_per_block=227 * 1024,
            sources={"peak_flops": _H100_DS + " (SXM)", "dram_bandwidth": _H100_DS + " (SXM, HBM3)",
                     "sm_count": _H100_WP, "l2_bytes": _H100_WP, "smem": _CUDA_GUIDE}),
        DeviceSpec(
            name="NVIDIA H100 PCIe", key="h100-pcie", compute_capability=(9, 0),
            sm_count=114,
            peak_flops={"fp32": 51 * T, "tf32": 378 * T, "fp16": 756 * T,
                        "bf16": 756 * T, "fp8": 1513 * T},
            dram_bandwidth=2.0 * TB, memory_bytes=80 * 10**9, l2_bytes=50 * 2**20,
            smem_per_sm=228 * 1024, smem_per_block=227 * 1024,
            sources={"peak_flops": _H100_DS + " (PCIe)", "dram_bandwidth": _H100_DS + " (PCIe, HBM2e)",
                     "sm_count": _H100_WP, "l2_bytes": _H100_WP, "smem": _CUDA_GUIDE}),
        DeviceSpec(
            name="NVIDIA H200", key="h200", compute_capability=(9, 0),
            sm_count=132,
            peak_flops={"fp32": 67 * T, "tf32": 494.7 * T, "fp16": 989.4 * T,
                        "bf16": 989.4 * T, "fp8": 1978.9 * T},
            dram_bandwidth=4.8 * TB, memory_bytes=141 * 10**9, l2_bytes=50 * 2**20,
            smem_per_sm=228 * 1024, smem_per_block=227 * 1024,
            sources={"peak_flops": _H200_DS, "dram_bandwidth": _H200_DS + " (HBM3e)",
                     "memory_bytes": _H200_DS, "sm_count": _H100_WP + " (same GH100 SXM config)",
                     "l2_bytes": _H100_WP, "smem": _CUDA_GUIDE}),
        DeviceSpec(
            name="NVIDIA B200", key="b200", compute_capability=(10, 0),
            sm_count=148,
            peak_flops={"fp32": 80 * T, "tf32": 1100 * T, "fp16": 2250 * T,
                        "bf16": 2250 * T, "fp8": 4500 * T},
            dram_bandwidth=_B200_BUS_BITS / 8 * _B200_MEMORY_HZ * 2,
            memory_bytes=180 * 10**9, l2_bytes=126 * 2**20,
            smem_per_sm=228 * 1024, smem_per_block=227 * 1024,
            sources={"peak_flops": _B200_DS, "dram_bandwidth": _B200_BW,
                     "memory_bytes": _B200_DS, "sm_count": "NVIDIA Blackwell architecture technical brief",
                     "l2_bytes": "NVIDIA Blackwell architecture technical brief", "smem": _CUDA_GUIDE}),
        DeviceSpec(
            name="NVIDIA L4", key="l4", compute_capability=(8, 9),
            sm_count=58,
            peak_flops={"fp32": 30.3 * T, "tf32": 60 * T, "fp16": 121 * T,
                        "bf16": 121 * T, "fp8": 242.5 * T},
            dram_bandwidth=0.300 * TB, memory_bytes=24 * 10**9, l2_bytes=48 * 2**20,
            smem_per_sm=100 * 1024, smem_per_block=99 * 1024, max_warps_per_sm=48,
            max_blocks_per_sm=24,
            sources={"peak_flops": _L4_DS, "dram_bandwidth": _L4_DS + " (GDDR6)",
                     "memory_bytes": _L4_DS, "sm_count": "Ada AD104 in the L4 configuration (7424 CUDA cores / 128)",
                     "l2_bytes": "NVIDIA Ada Lovelace architecture whitepaper", "smem": _CUDA_GUIDE}),
        DeviceSpec(
            name="AMD Instinct MI300X", key="mi300x", compute_capability=(9, 4), sm_count=304,
            peak_flops={"fp32": 163.4 * T, "tf32": 653.7 * T, "fp16": 1307.4 * T,
                        "bf16": 1307.4 * T, "fp8": 2614.9 * T},
            dram_bandwidth=5.3 * TB, memory_bytes=192 * 2**30, l2_bytes=32 * 2**20,
            l3_bytes=256 * 2**20, smem_per_sm=64 * 1024, smem_per_block=64 * 1024,
            regs_per_sm=512 * 1024 // 4, max_warps_per_sm=32, max_blocks_per_sm=16,
            gfx="gfx942", warp_size=64,
            sources={"peak_flops": _MI300X_DS, "dram_bandwidth": _MI300X_DS + " (HBM3)",
                     "memory_bytes": _ROCM_SPECS, "sm_count": _ROCM_SPECS + " (38 per XCD)",
                     "l2_bytes": _ROCM_SPECS + " (4 MB per XCD)", "l3_bytes": _ROCM_SPECS,
                     "smem": _ROCM_SPECS + " (LDS)", "regs": _ROCM_SPECS + " (512 KB VGPRs)",
                     "waves": _CDNA3_ISA}),
        DeviceSpec(
            name="AMD Instinct MI355X", key="mi355x", compute_capability=(9, 5), sm_count=256,
            # CDNA4 has no TF32 matrix path: fp32 matmuls run at the fp32 matrix peak
            peak_flops={"fp32": 157.3 * T, "fp16": 2516.6 * T, "bf16": 2516.6 * T,
                        "fp8": 5033.2 * T},
            dram_bandwidth=8.0 * TB, memory_bytes=288 * 2**30, l2_bytes=32 * 2**20,
            l3_bytes=256 * 2**20, smem_per_sm=160 * 1024, smem_per_block=160 * 1024,
            regs_per_sm=512 * 1024 // 4, max_warps_per_sm=32, max_blocks_per_sm=16,
            gfx="gfx950", warp_size=64,
            sources={"peak_flops": _MI355X_DS, "dram_bandwidth": _MI355X_DS + " (HBM3E)",
                     "memory_bytes": _ROCM_SPECS, "sm_count": _ROCM_SPECS + " (32 per XCD)",
                     "l2_bytes": _ROCM_SPECS + " (4 MB per XCD)", "l3_bytes": _ROCM_SPECS,
                     "smem": _ROCM_SPECS + " (LDS)", "regs": _ROCM_SPECS + " (512 KB VGPRs)",
                     "waves": _CDNA4_ISA}),
    ]
}

# ---------------------------------------------------------------------------------------
# Per-architecture limits a multiprocessor puts on resident programs: what theoretical
# occupancy is computed from. They belong to the compute capability, not to the SKU.
# ---------------------------------------------------------------------------------------

_CC_TABLE = ("CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' "
             "(warps, blocks, registers and shared memory per SM; shared memory per block)")
_OCC_RULES = ("CUDA Occupancy Calculator rules as shipped in the toolkit's cuda_occupancy.h "
              "(register allocation per warp in units of 256, 4 sub-partitions, shared memory "
              "in units of 128 bytes plus 1 KB reserved per block on cc >= 8.0)")


@dataclass(frozen=True)
class ArchLimits:
    """What one SM of a compute capability can hold at once.

    Registers are allocated per warp, rounded up to `reg_alloc_unit`, from four
    sub-partitions of `regs_per_sm / sub_partitions` each; shared memory is allocated per
    block, rounded up to `smem_alloc_unit`, with `smem_reserved_per_block` added by the
    driver. `smem_per_sm` is the largest carve-out, `smem_per_block` the opt-in maximum.
    """

    compute_capability: tuple[int, int]
    max_warps_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int
    smem_per_block: int
    regs_per_sm: int = 65536
    max_regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256
    sub_partitions: int = 4
    smem_alloc_unit: int = 128
    smem_reserved_per_block: int = 1024
    sources: dict[str, str] = field(default_factory=lambda: {"limits": _CC_TABLE,
                                                             "allocation": _OCC_RULES})

    @property
    def name(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


ARCH_LIMITS: dict[tuple[int, int], ArchLimits] = {a.compute_capability: a for a in [
    ArchLimits((8, 0), max_warps_per_sm=64, max_blocks_per_sm=32,
               smem_per_sm=164 * 1024, smem_per_block=163 * 1024),
    ArchLimits((8, 6), max_warps_per_sm=48, max_blocks_per_sm=16,
               smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
    ArchLimits((8, 9), max_warps_per_sm=48, max_blocks_per_sm=24,
               smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
    ArchLimits((9, 0), max_warps_per_sm=64, max_blocks_per_sm=32,
               smem_per_sm=228 * 1024, smem_per_block=227 * 1024),
    ArchLimits((10, 0), max_warps_per_sm=64, max_blocks_per_sm=32,
               smem_per_sm=228 * 1024, smem_per_block=227 * 1024),
    ArchLimits((12, 0), max_warps_per_sm=48, max_blocks_per_sm=24,
               smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
]}


_LLVM_OCC = ("LLVM AMDGPU backend's occupancy rules (AMDGPUBaseInfo / GCNSubtarget: waves per "
             "EU from VGPRs in granules of 8 of a unified 512-entry VGPR+AGPR file on gfx90a "
             "onwards, from SGPRs, from LDS; at most 16 multi-wave workgroups per CU)")
_LLVM_USAGE = ("LLVM AMDGPUUsage, COMPUTE_PGM_RSRC2.LDS_SIZE: LDS is allocated per workgroup "
               "in granules of 128 dwords (512 bytes) on GFX7 onwards")


@dataclass(frozen=True)
class AmdArchLimits:
    """What one CU of an AMD Instinct architecture (an LLVM gfx target) can hold at once.

    A CU has `simds` SIMDs (execution units), each holding at most `max_waves_per_simd`
    wavefronts of `warp_size` lanes. A wave's VGPRs and AGPRs come from one file of
    `vgprs_per_simd` entries per lane, allocated in granules of `vgpr_alloc_unit`; SGPRs
    bound waves by `sgpr_waves` ((most SGPRs, waves) steps, LLVM's table); LDS (the shared
    memory) is allocated per workgroup in units of `lds_alloc_unit` from `lds_per_cu`.
    """

    gfx: str
    lds_per_cu: int
    lds_per_workgroup: int
    simds: int = 4
    max_waves_per_simd: int = 8
    warp_size: int = 64
    vgprs_per_simd: int = 512
    max_vgprs_per_wave: int = 512  # 256 architected VGPRs + 256 AGPRs
    vgpr_alloc_unit: int = 8
    sgpr_waves: tuple = ((80, 10), (88, 9), (100, 8), (112, 7))
    max_workgroups_per_cu: int = 16
    max_waves_per_workgroup: int = 16  # 1024 work-items
    lds_alloc_unit: int = 512
    sources: dict[str, str] = field(default_factory=lambda: {"limits": _ROCM_SPECS,
                                                             "allocation": _LLVM_OCC,
                                                             "lds": _LLVM_USAGE})

    @property
    def name(self) -> str:
        return self.gfx

    @property
    def max_warps_per_sm(self) -> int:
        return self.simds * self.max_waves_per_simd

    @property
    def smem_per_block(self) -> int:
        return self.lds_per_workgroup


AMD_ARCH_LIMITS: dict[str, AmdArchLimits] = {a.gfx: a for a in [
    AmdArchLimits("gfx942", lds_per_cu=64 * 1024, lds_per_workgroup=64 * 1024),
    AmdArchLimits("gfx950", lds_per_cu=160 * 1024, lds_per_workgroup=160 * 1024),
]}


def arch_limits(compute_capability: tuple[int, int] | int | str) -> ArchLimits | AmdArchLimits:
    """The SM limits of a compute capability: (9, 0) or 90; a CU's of an AMD gfx target."""
    if isinstance(compute_capability, str):
        gfx = compute_capability.split(":")[0]
        if gfx not in AMD_ARCH_LIMITS:
            raise KeyError(f"no CU limits for {gfx}; known: {', '.join(AMD_ARCH_LIMITS)}")
        return AMD_ARCH_LIMITS[gfx]
    if isinstance(compute_capability, int):
        compute_capability = divmod(compute_capability, 10)
    cc = tuple(compute_capability)
    if cc not in ARCH_LIMITS:
        known = ", ".join(a.name for a in ARCH_LIMITS.values())
        raise KeyError(f"no SM limits for compute capability {cc[0]}.{cc[1]}; known: {known}")
    return ARCH_LIMITS[cc]


# Names a user may type for --target, and substrings of torch's device names.
ALIASES = {
    "a100": "a100-sxm", "a100-sxm4": "a100-sxm", "h100": "h100-sxm", "h100-sxm5": "h100-sxm",
    "gh100": "h100-sxm", "h200-sxm": "h200", "b200-sxm": "b200",
    "mi300": "mi300x", "mi355": "mi355x",
}


def get_device_spec(name: str) -> DeviceSpec:
    """Look a SKU up by key ('h200'), alias ('h100') or torch device name."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in DEVICES:
        return DEVICES[key]
    return spec_for_device_name(name)


def spec_for_device_name(device_name: str) -> DeviceSpec:
    """Match the name torch.cuda reports ('NVIDIA H100 80GB HBM3') to a SKU."""
    n = device_name.lower()
    if "h200" in n:
        return DEVICES["h200"]
    if "h100" in n:
        return DEVICES["h100-pcie" if "pcie" in n else "h100-sxm"]
    if "a100" in n:
        return DEVICES["a100-sxm"]
    if "b200" in n:
        return DEVICES["b200"]
    if "l4" in n.split() or n.endswith(" l4"):
        return DEVICES["l4"]
    for spec in DEVICES.values():  # AMD Instinct MI300X, AMD Instinct MI355X
        if spec.vendor == "amd" and spec.key in n.replace(" ", "").replace("-", ""):
            return spec
    raise KeyError(f"no DeviceSpec for {device_name!r}; known: {', '.join(DEVICES)}")


def current_device_spec() -> DeviceSpec | None:
    """The DeviceSpec of the present CUDA device, or None without one (or if unknown)."""
    if not torch.cuda.is_available():
        return None
    try:
        return spec_for_device_name(torch.cuda.get_device_name())
    except KeyError:
        return None


# ---------------------------------------------------------------------------------------
# Measured ceilings, written by `speedlight probe` and read by every "% of SOL" figure.
# ---------------------------------------------------------------------------------------

@dataclass
class Ceilings:
    """What was measured on one device: copy bandwidth (bytes read + written per second)
    and dense matmul FLOP/s per dtype, with the device name and driver it was read on."""

    device_name: str
    driver: str
    copy_bandwidth: float
    matmul_flops: dict[str, float]
    measured_at: str = ""
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def cache_dir() -> Path:
    """SPEEDLIGHT_CACHE if set, else $XDG_CACHE_HOME/speedlight or ~/.cache/speedlight."""
    if os.environ.get("SPEEDLIGHT_CACHE"):
        return Path(os.environ["SPEEDLIGHT_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "speedlight"


def _ceilings_path(device_name: str, driver: str) -> Path:
    safe = "".join(c if c.isalnum() else "_" for c in f"{device_name}-{driver}")
    return cache_dir() / "ceilings" / f"{safe}.json"


def save_ceilings(c: Ceilings) -> Path:
    path = _ceilings_path(c.device_name, c.driver)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(c.to_json(), indent=2))
    os.replace(tmp, path)
    return path


def load_ceilings(device_name: str, driver: str) -> Ceilings | None:
    path = _ceilings_path(device_name, driver)
    if not path.exists():
        return None
    return Ceilings(**json.loads(path.read_text()))


@dataclass(frozen=True)
class Roof:
    """The two ceilings a speed-of-light floor is computed from, and where they came from."""

    bandwidth: float
    flops: dict[str, float]
    source: str  # "measured" or "datasheet"
    device: str

    def floor_seconds(self, flops: int, nbytes: int, dtype: str) -> float:
        peak = self.flops.get(dtype) or self.flops.get("fp32")
        return max(flops / peak if peak else 0.0, nbytes / self.bandwidth)

    def bound(self, flops: int, nbytes: int, dtype: str) -> str:
        peak = self.flops.get(dtype) or self.flops.get("fp32")
        return "compute" if flops / peak > nbytes / self.bandwidth else "memory"


def roof_for(spec: DeviceSpec, ceilings: Ceilings | None = None) -> Roof:
    """Measured ceilings when given, else the datasheet's."""
    if ceilings is not None:
        flops = dict(spec.peak_flops)
        flops.update(ceilings.matmul_flops)
        return Roof(ceilings.copy_bandwidth, flops, "measured", ceilings.device_name)
    return Roof(spec.dram_bandwidth, dict(spec.peak_flops), "datasheet", spec.name)
