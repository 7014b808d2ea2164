"""Theoretical occupancy of a kernel on an SM, and how its grid fills the GPU in waves.

Occupancy follows the CUDA occupancy calculator's rules (hardware.ArchLimits; an AMD CU's
is amdgcn.occupancy's, from hardware.AmdArchLimits): registers are allocated per warp in
units of 256 from four sub-partitions, shared memory per block in units of 128 bytes plus
the 1 KB the driver reserves, and the SM's warp and block limits cap the rest. "Theoretical" means what the resources allow; the grid can allow fewer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from speedlight.hardware import ArchLimits


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int  # resident programs per SM the resources allow
    warps_per_sm: int
    max_warps_per_sm: int
    limiter: str  # warps | blocks | registers | shared memory | (none fits)
    limits: dict  # resource -> programs per SM it alone allows
    regs_per_warp: int  # allocated, after rounding
    smem_per_block: int  # allocated, after rounding and the reserve
    per_simd: float = 0.0  # AMD: resident waves per SIMD (amdgcn.occupancy); 0 on NVIDIA

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / self.max_warps_per_sm

    def to_json(self) -> dict:
        return dict(asdict(self), fraction=round(self.fraction, 4))


def occupancy(limits: ArchLimits, num_warps: int, registers: int, smem_bytes: int) -> Occupancy:
    """Programs of `num_warps` warps using `registers` per thread and `smem_bytes` of shared
    memory (static + dynamic) that one SM holds at once."""
    by_warps = limits.max_warps_per_sm // num_warps
    regs_per_warp = _round_up(max(registers, 1) * 32, limits.reg_alloc_unit)
    warps_rounded = _round_up(num_warps, limits.sub_partitions)
    too_many = regs_per_warp * warps_rounded > limits.max_regs_per_block
    if registers > limits.max_regs_per_thread or too_many:
        by_regs = 0
    else:
        per_partition = (limits.regs_per_sm // limits.sub_partitions) // regs_per_warp
        by_regs = (per_partition * limits.sub_partitions) // num_warps
    smem_block = _round_up(smem_bytes + limits.smem_reserved_per_block, limits.smem_alloc_unit)
    if smem_bytes > limits.smem_per_block:
        by_smem = 0
    else:
        by_smem = limits.smem_per_sm // smem_block
    found = {"warps": by_warps, "blocks": limits.max_blocks_per_sm, "registers": by_regs,
             "shared memory": by_smem}
    blocks = min(found.values())
    # name the resource that binds; on a tie the warp limit (a full SM), then what a kernel
    # author can change
    order = ("warps", "registers", "shared memory", "blocks")
    limiter = next(k for k in order if found[k] == blocks) if blocks else \
        next(k for k in order if found[k] == 0)
    return Occupancy(blocks, blocks * num_warps, limits.max_warps_per_sm, limiter, found,
                     regs_per_warp, smem_block)


@dataclass(frozen=True)
class Waves:
    """How a grid of `programs` fills `sms` SMs holding `per_sm` programs each."""

    programs: int
    sms: int
    per_sm: int

    @property
    def per_wave(self) -> int:
        return self.sms * max(self.per_sm, 1)

    @property
    def waves(self) -> float:
        return self.programs / self.per_wave

    @property
    def full_waves(self) -> int:
        return self.programs // self.per_wave

    @property
    def last_wave_fill(self) -> float:
        """Share of the last wave's slots that hold a program (1.0 for whole waves)."""
        rest = self.programs - self.full_waves * self.per_wave
        return 1.0 if rest == 0 else rest / self.per_wave

    @property
    def idle_share(self) -> float:
        """Share of the last wave's program slots left empty."""
        return 1.0 - self.last_wave_fill

    @property
    def busy_sms(self) -> int:
        """SMs with at least one program when the grid is smaller than one program per SM."""
        return min(self.sms, self.programs)

    @property
    def resident_per_sm(self) -> float:
        """Programs per SM the grid itself allows in the first wave (at most per_sm)."""
        return min(self.per_sm, self.programs / self.sms) if self.sms else 0.0

    def to_json(self) -> dict:
        return {"programs": self.programs, "sms": self.sms, "per_sm": self.per_sm,
                "per_wave": self.per_wave, "waves": round(self.waves, 4),
                "last_wave_fill": round(self.last_wave_fill, 4),
                "idle_share": round(self.idle_share, 4)}
