"""What speedlight's GEMM launchers share (ops/matmul.py, ops/gated_matmul.py): the
configuration space and the rule that picks a point of it per shape, the persistent grid,
the operand paths (TMA tensor descriptors or pointers) with what selects them, and the fp8
format with the output dtype a GEMM defaults to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import torch
import triton

from speedlight import launch, tuning
from speedlight.launch import planned_amd_arch, planned_arch, planned_sm_count
from speedlight.spec import dtype_name

# The fp8 format the GEMM kernels take: e4m3 (the forward's format; e5m2 is a gradient
# format)
FP8_DTYPES = (torch.float8_e4m3fn,)


def default_out_dtype(dtype: torch.dtype) -> torch.dtype:
    """A GEMM's output dtype when none is asked for: the operands' own, bf16 for fp8 (a
    dtype without the range of a GEMM's sums)."""
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype

# The configuration space of the GEMM kernels, named as the launchers pass them to the
# kernel (`speedlight tune` sweeps it): tile sizes (BLOCK_M x BLOCK_N of c, BLOCK_K of the
# k-step), the grouped order's group size, warps (4: one warp group, 8: two) and pipeline
# stages. `launch_config` is the rule that picks one point per shape where no tuned table
# entry does (`gemm_config`).
CONFIG_SPACE = {
    "BLOCK_M": (64, 128, 256),
    "BLOCK_N": (64, 128, 256),
    "BLOCK_K": (32, 64, 128),
    "GROUP_M": (1, 4, 8, 16),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}

# What an AMD target adds (Triton's HIP compile options; a CUDA launch refuses them):
# waves_per_eu, the waves per SIMD the register allocator aims for (0: no aim, the
# compiler's default); matrix_instr_nonkdim, the M = N of the MFMA instruction the dots
# take (16: 16x16xK, 32: 32x32xK; 0: the compiler picks); kpack, how many K-elements a
# lane packs per MFMA operand load (2 is deprecated from gfx950 on, where Triton resets it
# to 1). The rule takes each knob's default: what Triton does when not asked.
AMD_RULE = {"waves_per_eu": 0, "matrix_instr_nonkdim": 0, "kpack": 1}


def amd_space(gfx: str) -> dict[str, tuple[int, ...]]:
    """The knobs of AMD arch `gfx` ("gfx942") that `speedlight tune` sweeps (the GEMMs'
    and attention's forward)."""
    return {"waves_per_eu": (0, 1, 2, 4), "matrix_instr_nonkdim": (0, 16, 32),
            "kpack": (1,) if gfx == "gfx950" else (1, 2)}


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    amd: tuple[tuple[str, int], ...] = ()  # an AMD launch's knobs (AMD_RULE's names), sorted

    def as_config(self) -> dict[str, int]:
        """This configuration as the space names it (a tuned table's "config"): CONFIG_SPACE's
        parameters, then an AMD launch's knobs."""
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
                "GROUP_M": self.group_m, "num_warps": self.num_warps,
                "num_stages": self.num_stages, **dict(self.amd)}

    def options(self) -> dict[str, int]:
        """The launch options the kernel is given: warps, stages and an AMD launch's knobs."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, **dict(self.amd)}

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> "LaunchConfig":
        """The LaunchConfig of a configuration named as CONFIG_SPACE names it (with AMD_RULE's
        knobs where it has them)."""
        missing = [k for k in CONFIG_SPACE if k not in config]
        if missing:
            raise ValueError(f"a GEMM configuration needs {', '.join(CONFIG_SPACE)}; "
                             f"{dict(config)} lacks {', '.join(missing)}")
        amd = tuple(sorted((k, int(config[k])) for k in AMD_RULE if k in config))
        return cls(*(int(config[k]) for k in CONFIG_SPACE), amd=amd)


class GemmKey(NamedTuple):
    """What a GEMM launcher asks its op's configuration for (launch.config)."""

    m: int
    n: int
    k: int
    dtype: torch.dtype
    out_dtype: torch.dtype
    epilogue_tile: bool  # a second [BM, BN] tile in the epilogue (residual read, act' stored)
    operands: int  # b tiles per k-step (2: the gated kernel's gate and up)
    device: torch.device


def gemm_bucket(key: GemmKey) -> str:
    """The tuned tables' entry a GEMM falls in: M to the next power of two (at least 16:
    the token count varies, the weights' N and K do not), N and K exact, the dtypes, and
    whether the epilogue holds a second tile."""
    m = max(16, triton.next_power_of_2(max(key.m, 1)))
    out = f"-out_{dtype_name(key.out_dtype)}" if key.out_dtype != key.dtype else ""
    epi = "-epilogue_tile" if key.epilogue_tile else ""
    return f"m{m}-n{key.n}-k{key.k}-{dtype_name(key.dtype)}{out}{epi}"


def gemm_rule(key: GemmKey) -> dict[str, int]:
    """launch_config's choice for `key`, as a configuration (the ops' Configs default)."""
    return launch_config(key.m, key.n, key.k, key.dtype, key.device, operands=key.operands,
                         out_dtype=key.out_dtype, residual=key.epilogue_tile).as_config()


def gemm_configs(op: str) -> tuning.Configs:
    """The configuration space of GEMM op `op` (its tuned tables are its own): CONFIG_SPACE,
    with amd_space's knobs on an AMD target; gemm_rule's choice by default, gemm_bucket's
    entries."""
    return tuning.Configs(op, CONFIG_SPACE, default=gemm_rule, bucket=gemm_bucket,
                          amd=amd_space)


def gemm_config(configs: tuning.Configs, m: int, n: int, k: int, dtype: torch.dtype,
                device: torch.device, *, operands: int = 1,
                out_dtype: torch.dtype | None = None, residual: bool = False,
                store_dact: bool = False) -> LaunchConfig:
    """The configuration a GEMM launch of the op whose space is `configs` uses: the launch
    context's forced one, else its tuned table's entry for the shape on this GPU, else
    launch_config's rule (launch.config). Under the interpreter (no GPU planned) the rule
    alone: tables are per GPU."""
    if planned_sm_count(device) is None:
        return launch_config(m, n, k, dtype, device, operands=operands, out_dtype=out_dtype,
                             residual=residual, store_dact=store_dact)
    key = GemmKey(m, n, k, dtype, out_dtype or dtype, residual or store_dact, operands, device)
    return LaunchConfig.of(launch.config(configs, key, device))


def launch_config(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, *,
                  operands: int = 1, out_dtype: torch.dtype | None = None,
                  residual: bool = False, store_dact: bool = False) -> LaunchConfig:
    """The rule: one configuration of CONFIG_SPACE per (M, N, K, dtype, device).

    On a GPU (or the launch context's target), for `operands` b tiles per k-step (2: the
    gated kernel's gate and up):
      - K steps of 128 bytes per row (BLOCK_K 128 in fp8, 64 in 16-bit, 32 in fp32): one TMA box
        row of a 128-byte swizzled tile;
      - M <= 64 (decode, short prompts): BLOCK_M 64, one warp group (4 warps), BLOCK_N 128;
      - otherwise 128 x 256 tiles on two warp groups (8 warps) for one b operand where N
        allows (the largest tile whose 3 stages and 16-bit epilogue tile fit 227 KB);
        128 x 128 with 4 stages when N < 256, or when the output is fp32 (its epilogue
        tile would not fit beside 3 stages), or a residual is read or act' stored (a
        second [BM, BN] tile beside a 128 x 256 accumulator spills), or the operands are
        fp8 (their partial sums are promoted into a second fp32 accumulator every
        BLOCK_K, which spills at 128 x 256); 128 x 128 with 3 stages for the gated
        kernel's two accumulators;
      - on sm_100 and later (launch.planned_arch), a forward that stores act' or reads a
        residual takes 128 x 64 tiles (4 stages): at 128 x 128 it spills on sm_100a;
      - GROUP_M 8: eight row tiles share each b column tile while it is in L2;
      - on an AMD target (launch.planned_amd_arch) the same tiles with num_stages 2, HIP's
        default: Triton's AMD pipeline keeps num_stages - 1 operand buffers in LDS (the next
        k-step's tiles wait in registers), and at 3 or 4 stages these tiles pass the 64 KB
        a gfx942 workgroup may have (64 x 128 at 4 stages: 72 KB); the knobs at AMD_RULE.
    Under the interpreter (CPU): tiles as large as the problem (up to 128), since every
    loop iteration costs milliseconds there whatever its size.
    """
    if planned_sm_count(device) is None:
        fit = lambda x: max(16, min(128, triton.next_power_of_2(max(x, 1))))  # noqa: E731
        return LaunchConfig(fit(m), fit(n), fit(k), 8, 4, 1)
    amd = planned_amd_arch(device) is not None

    def rule(block_m, block_n, block_k, group_m, num_warps, num_stages):
        if amd:  # HIP's two stages and the AMD knobs' defaults (see the docstring)
            return LaunchConfig(block_m, block_n, block_k, group_m, num_warps, 2,
                                tuple(sorted(AMD_RULE.items())))
        return LaunchConfig(block_m, block_n, block_k, group_m, num_warps, num_stages)

    block_k = 128 // dtype.itemsize if dtype.itemsize <= 2 else 32
    if m <= 64:
        return rule(64, 128, block_k, 8, 4, 4 if operands == 1 else 3)
    if (residual or store_dact) and (planned_arch(device) or 0) >= 100:
        # sm_100a: a second [BM, BN] tile (act' stored, or a residual read) beside a
        # 128 x 128 accumulator moved out of tensor memory spills (act': 12 bytes at 128
        # registers, 4 at 3 stages); 128 x 64 compiles to 75 registers, none
        return rule(128, 64, block_k, 8, 8, 4)
    out_size = (out_dtype or dtype).itemsize
    plain = out_size <= 2 and not residual and not store_dact
    if operands == 1 and n >= 256 and dtype.itemsize == 2 and plain:
        return rule(128, 256, block_k, 8, 8, 3)
    return rule(128, 128, block_k, 8, 8, 4 if operands == 1 else 3)


def programs(num_tiles: int, device: torch.device) -> int:
    """Persistent grid: one program per SM (a 128 x 256 tile with its pipeline fills an
    SM's shared memory), two under the interpreter."""
    sms = planned_sm_count(device)
    return max(1, min(num_tiles, sms if sms else 2))


# --- operand paths -------------------------------------------------------------------------

def tma_layout(t: torch.Tensor) -> str | None:
    """How a 2-D tensor can be a TMA tensor descriptor: "row" (its last dim contiguous),
    "col" (its first dim contiguous), or None (no dim of unit stride, or a base or stride
    that is not 16-byte aligned, or an overlapping view)."""
    es = t.element_size()
    if t.data_ptr() % 16:
        return None
    rows, cols = t.shape
    if t.stride(1) == 1 and (t.stride(0) * es) % 16 == 0 and t.stride(0) >= max(cols, 1):
        return "row"
    if t.stride(0) == 1 and (t.stride(1) * es) % 16 == 0 and t.stride(1) >= max(rows, 1):
        return "col"
    return None


def use_tma(device: torch.device) -> bool:
    """TMA descriptors on Hopper and later; under the interpreter too (the CPU runs the path
    an H100 takes, and inspect compiles it for sm_90a). Ampere takes the pointer path."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] >= 9


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


def ensure_allocator() -> None:
    """Device-side tensor descriptors live in a global scratch buffer Triton asks the
    caller to allocate. Triton keeps its allocator in a ContextVar, which a new thread
    (autograd runs a GPU backward on its own) or a copied context does not inherit, so it
    is set before every launch that uses descriptors (one ContextVar.set), never once."""
    triton.set_allocator(_scratch)


def precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: fp32 uses TF32 only where
    torch.backends.cuda.matmul.allow_tf32 says so, as torch.matmul does."""
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    return "tf32" if tf32 else "ieee"
