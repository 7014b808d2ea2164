"""Predicted: what a compiled kernel will cost on a GPU, from its code alone (no GPU).

The figures come from inspect (loops.Loop per kernel: instructions per iteration by pipe,
MMA FLOPs, bytes and bytes in flight; occupancy and waves); this module holds the GPU's
side (how fast each pipe issues, how long a result takes, how much memory must be in
flight) and the model that turns the figures into a time and names what bounds it. Every
number it gives is a prediction, labelled so wherever it is shown.

The GPU's rates come from hardware.DeviceSpec (datasheet peaks, bandwidth) and, where
present, the ceilings `speedlight probe` measured; the per-SM rates of each pipe from the
CUDA C++ Programming Guide's table of arithmetic instruction throughput; the SM clock is
the one the datasheet's dense tensor peak implies (peak / (SMs x tensor FLOPs per SM per
cycle)). The constants no datasheet gives (the memory latency a loaded GPU shows, the cost
of a launch) are set from measured rows, which the validation (`scripts/predict_rows.py`)
keeps apart from the rows it checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from speedlight.hardware import DeviceSpec

# Dense 16-bit tensor-core FLOPs per SM (CU) per cycle, by architecture: A100 312 TFLOP/s
# at 108 SMs x 1410 MHz; H100 SXM 989.4 at 132 x 1830 MHz; B200 2250 at 148 SMs; L4
# (sm_89) 121 at 58 x 2040 MHz; MI300X 1307.4 at 304 CUs x 2100 MHz; MI355X 2516.6 at 256 x
# 2400 MHz. Other operand types scale with their datasheet peaks.
TENSOR_FLOPS_PER_CYCLE = {8: 2048, 9: 4096, 10: 8192, 12: 4096, "gfx942": 2048,
                          "gfx950": 4096}
TENSOR_FLOPS_PER_CYCLE_SM89 = 1024

# Warp-instructions one SM issues per cycle to each pipe (results per clock per SM in the
# CUDA C++ Programming Guide's throughput table, divided by the warp's 32 lanes), for
# compute capability 8.0 to 10.0: 32-bit floating add/multiply/fma 128 (64 on 8.0);
# integer add, compare, min/max, shift, logic 64; 32-bit integer multiply-add 64;
# exp2/rsqrt/rcp (MUFU) 16; conversions 16; warp shuffle 32. The uniform datapath issues
# beside the vector one (counted as ALU); a memory instruction takes one issue slot of its
# sub-partition's load/store unit (32 lanes of address per cycle per SM: 1 per cycle).
PIPE_RATE = {"fma": 4.0, "alu": 2.0, "select": 2.0, "mufu": 0.5, "convert": 0.5,
             "shuffle": 1.0, "memory": 1.0, "uniform": 4.0, "control": 4.0, "barrier": 4.0,
             "other": 2.0, "mma": 4.0}
PIPE_RATE_SM80 = dict(PIPE_RATE, fma=2.0)
# An AMD CU: four SIMDs of 16 lanes, so a wave's vector instruction takes 4 cycles of one
# SIMD; scalar and branch instructions 1 cycle of the CU's scalar unit.
AMD_VECTOR_CYCLES = 4

# Warp schedulers (sub-partitions) per SM: one instruction issued per cycle each.
SCHEDULERS = 4

# Cycles from an instruction's issue until a dependent one may issue, per pipe (the
# dependent-issue latencies microbenchmarks of Ampere and Hopper report: about 4 for
# FP32 and integer arithmetic, 15-20 for MUFU, about 30 for a shuffle or a shared-memory
# load); a global load's is the memory latency below.
LATENCY = {"fma": 4, "alu": 4, "select": 4, "uniform": 2, "mufu": 18, "convert": 6,
           "shuffle": 28, "memory": 30, "control": 1, "barrier": 20, "other": 4, "mma": 0}

# The latency of a DRAM load on a loaded GPU (queueing included), in nanoseconds: a model
# constant, set from the project's measured memory-bound rows (rms_norm's forward reaches
# 66% of an H200's copy bandwidth with 16 KB in flight per SM); no datasheet gives it.
MEMORY_LATENCY_NS = {"nvidia": 800.0, "amd": 1000.0}


def tensor_flops_per_cycle(sku: DeviceSpec) -> int:
    """Dense 16-bit tensor FLOPs per SM per cycle of the SKU's architecture."""
    if sku.vendor == "amd":
        return TENSOR_FLOPS_PER_CYCLE[sku.gfx.split(":")[0]]
    major, minor = sku.compute_capability
    if (major, minor) == (8, 9):
        return TENSOR_FLOPS_PER_CYCLE_SM89
    return TENSOR_FLOPS_PER_CYCLE.get(major, 4096)


def clock_hz(sku: DeviceSpec) -> float:
    """The SM clock the datasheet's dense 16-bit tensor peak implies."""
    peak = sku.peak_flops.get("bf16") or sku.peak_flops.get("fp16")
    return peak / (sku.sm_count * tensor_flops_per_cycle(sku))


def memory_latency_s(sku: DeviceSpec) -> float:
    return MEMORY_LATENCY_NS[sku.vendor] * 1e-9


def needed_in_flight(sku: DeviceSpec, bandwidth: float | None = None) -> int:
    """Bytes each SM must keep in flight for the GPU's DRAM bandwidth (Little's law:
    bandwidth per SM x the loaded memory latency)."""
    bandwidth = bandwidth or sku.dram_bandwidth
    return int(bandwidth / sku.sm_count * memory_latency_s(sku))


@dataclass(frozen=True)
class Share:
    """What a resident program's bytes in flight give: the bandwidth Little's law allows."""

    per_sm: int
    needed: int

    @property
    def fraction(self) -> float:
        return min(1.0, self.per_sm / self.needed) if self.needed else 1.0
