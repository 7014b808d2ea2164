"""CI guard of the GEMM kernels: compiled for sm_90a (no GPU needed) with the launches an
H100 user gets, each bf16 kernel meets the design issue 16 fixes for it: TMA loads
(UTMALDG), HGMMA (wgmma), at least 3 pipeline stages in shared memory, no spills, shared
memory within the SM's limit (spec.KernelDesign mma / tma / min_stages, held by
inspect.guard.check_kernel). Compile-only: the launches are captured dry.

The cases reach each tile configuration of the launch rule (ops/matmul.launch_config):
decode (64 x 128, one warp group) and prefill (128 x 256 / gated 128 x 128, two warp
groups), with the epilogues that change the kernel's registers (bias + activation + its
derivative stored; residual).

The fp8 kernel (float8_e4m3fn operands, BLOCK_K 128) is held to the same pipeline on fp8
wgmma: TMA, QGMMA, at least 3 stages, no spills; with per-row scales and the amax fold,
at prefill and decode. Its backward runs the bf16 kernel (HGMMA).

The grouped GEMM (mixtures of experts) is held to the same design: its forward kernel
(also dx, through w's transpose) and its per-group weight-gradient kernel, at
Qwen3-30B-A3B's expert shapes; so is moe_experts' gate_up kernel with the gate unit in
its epilogue (two accumulators for transformers' halves, one double-width accumulator
split in the epilogue for gpt-oss's interleaved rows).
"""

import pytest
import torch

from speedlight.inspect import guard
from speedlight.inspect.run import inspect_cases
from speedlight.ops import gated_matmul, grouped_matmul, matmul, moe_experts
from speedlight.spec import Case
from tests.inspect.conftest import GUARD_TABLE, TARGET

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def mm(m, n, k, dtype=BF16, **flags):
    return Case("matmul", {"m": m, "n": n, "k": k}, dtype=dtype,
                flags=dict(linear=True, **flags))


def gated(m, n, k, **flags):
    return Case("gated_matmul", {"m": m, "n": n, "k": k}, dtype=BF16, flags=flags)


def grouped(m, n, k, groups, **flags):
    return Case("grouped_matmul", {"m": m, "n": n, "k": k, "groups": groups}, dtype=BF16,
                flags=flags)


def moe(tokens, hidden, inter, experts, k, layout="contiguous", **flags):
    return Case("moe_experts", {"tokens": tokens, "hidden": hidden, "inter": inter,
                                "experts": experts, "k": k}, dtype=BF16, layout=layout,
                flags=flags)


ITEMS = [
    pytest.param(matmul.SPEC, mm(512, 768, 768, bias=True, act="silu"), True,
                 id="matmul-prefill-bias-silu-fwd-bwd"),
    pytest.param(matmul.SPEC, mm(16, 768, 768), False, id="matmul-decode-fwd"),
    pytest.param(matmul.SPEC, mm(512, 768, 768, residual=True), False, id="matmul-residual-fwd"),
    pytest.param(gated_matmul.SPEC, gated(512, 1024, 768), False, id="gated-prefill-fwd"),
    pytest.param(gated_matmul.SPEC, gated(16, 1024, 768, concat=True), False,
                 id="gated-decode-stacked-fwd"),
    # Qwen3-30B-A3B's gate_up projection [1536, 2048] per expert, 16 experts of its 128
    # (all 128 would draw 3 GB of float64 weights to capture the launches) at 256 rows
    # each: forward, dx (w read through its transpose), the per-group weight gradient
    pytest.param(grouped_matmul.SPEC, grouped(4096, 1536, 2048, 16), True,
                 id="grouped-qwen3-gate_up-fwd-bwd"),
    pytest.param(grouped_matmul.SPEC, grouped(4096, 768, 2048, 16, bias=True, act="silu"),
                 False, id="grouped-bias-silu-fwd"),
    # gpt-oss's interleaved, biased, clamped unit on [E, H, 2 I] weights transposed, at
    # Qwen3-30B-A3B's widths (8 experts, 256 pairs each): the fused gate_up kernel at its
    # widest (255 registers); the halves layout at its model case is held by
    # tests/inspect/test_every_kernel.py
    pytest.param(moe_experts.SPEC, moe(512, 2048, 768, 8, 4, "transposed",
                                       act="clamped_swiglu", interleaved=True, bias=True),
                 False, id="moe-gpt-oss-interleaved-fwd"),
]


FP8_ITEMS = [
    pytest.param(mm(512, 768, 768, FP8, rowscale=True, bias=True, act="silu", amax=True), True,
                 id="fp8-prefill-rowscale-bias-silu-amax-fwd-bwd"),
    pytest.param(mm(16, 768, 768, FP8), False, id="fp8-decode-fwd"),
    pytest.param(mm(512, 768, 768, FP8, residual=True), False, id="fp8-residual-fwd"),
]


@pytest.mark.parametrize("spec,case,backward", ITEMS)
def test_bf16_gemm_kernels_meet_their_sm90a_design(spec, case, backward, compiler):
    _check_gemm_kernels(spec, case, backward, compiler, {
        "_matmul_kernel": "HGMMA", "_gated_matmul_kernel": "HGMMA",
        "_grouped_matmul_kernel": "HGMMA", "_grouped_matmul_dw_kernel": "HGMMA",
        "_moe_gate_up_kernel": "HGMMA"})


@pytest.mark.parametrize("case,backward", FP8_ITEMS)
def test_fp8_gemm_kernel_meets_its_sm90a_design(case, backward, compiler):
    """The fp8 forward on QGMMA; the backward (bf16 on the dequantized operands) on
    HGMMA."""
    kernels = _check_gemm_kernels(matmul.SPEC, case, backward, compiler,
                                  {"_matmul_fp8_kernel": "QGMMA", "_matmul_kernel": "HGMMA"})
    assert "_matmul_fp8_kernel" in kernels
    assert ("_matmul_kernel" in kernels) == backward


def _check_gemm_kernels(spec, case, backward, compiler, mma: dict) -> set:
    """Inspect the case's GEMM launches and hold each to its design; `mma` the tensor-core
    family each kernel's design must name. The names of the kernels seen."""
    (report,) = inspect_cases([(spec, case)], TARGET, compiler=compiler, mode="dry",
                              backward=backward)
    assert not report.error, report.error
    short = []
    gemms = [k for k in report.kernels if k.launch.kernel in mma]
    assert gemms, "no GEMM kernel launched"
    for k in gemms:
        d = k.design
        assert (d.mma, d.tma, d.min_stages) == (mma[k.launch.kernel], True, 3)
        assert k.mix.tensor_core.get(d.mma), f"{k.launch.kernel}: no {d.mma} in its SASS"
        declared = {a.name: a.value for a in k.launch.args if a.name in k.launch.declared}
        tile = "x".join(str(declared[b]) for b in ("BLOCK_M", "BLOCK_N", "BLOCK_K",
                                                    "BLOCK_P", "BLOCK_Q") if b in declared)
        GUARD_TABLE.append(
            f"{spec.name:12s} {k.launch.direction} {k.launch.kernel:22s} {tile} "
            f"warps={k.launch.num_warps} stages {k.stages} regs {k.registers:3d} "
            f"spill {k.spill_stores} smem {k.smem} "
            f"{' '.join(f'{op} x{n}' for op, n in sorted(k.mix.tensor_core.items()))} "
            f"UTMALDG x{k.mix.tma.get('UTMALDG', 0)}  [{case.label}]")
        short += [str(s) for s in guard.check_kernel(k)]
    assert not short, "\n".join(short)
    return {k.launch.kernel for k in gemms}
