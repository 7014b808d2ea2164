"""CI guard of the GEMM kernels: compiled for sm_90a (no GPU needed) with the launches an
H100 user gets, each bf16 kernel meets the design issue 16 fixes for it: TMA loads
(UTMALDG), HGMMA (wgmma), at least 3 pipeline stages in shared memory, no spills, shared
memory within the SM's limit (spec.KernelDesign mma / tma / min_stages, held by
inspect.guard.check_kernel). Compile-only: the launches are captured dry.

The cases reach each tile configuration of the launch rule (ops/matmul.launch_config):
decode (64 x 128, one warp group) and prefill (128 x 256 / gated 128 x 128, two warp
groups), with the epilogues that change the kernel's registers (bias + activation + its
derivative stored; residual).
"""

import pytest
import torch

from speedlight.inspect import guard
from speedlight.inspect.run import inspect_cases
from speedlight.ops import gated_matmul, matmul
from speedlight.spec import Case
from tests.inspect.conftest import GUARD_TABLE, SKU, TARGET

BF16 = torch.bfloat16


def mm(m, n, k, **flags):
    return Case("matmul", {"m": m, "n": n, "k": k}, dtype=BF16, flags=dict(linear=True, **flags))


def gated(m, n, k, **flags):
    return Case("gated_matmul", {"m": m, "n": n, "k": k}, dtype=BF16, flags=flags)


ITEMS = [
    pytest.param(matmul.SPEC, mm(512, 768, 768, bias=True, act="silu"), True,
                 id="matmul-prefill-bias-silu-fwd-bwd"),
    pytest.param(matmul.SPEC, mm(16, 768, 768), False, id="matmul-decode-fwd"),
    pytest.param(matmul.SPEC, mm(512, 768, 768, residual=True), False, id="matmul-residual-fwd"),
    pytest.param(gated_matmul.SPEC, gated(512, 1024, 768), False, id="gated-prefill-fwd"),
    pytest.param(gated_matmul.SPEC, gated(16, 1024, 768, concat=True), False,
                 id="gated-decode-stacked-fwd"),
]


@pytest.mark.parametrize("spec,case,backward", ITEMS)
def test_bf16_gemm_kernels_meet_their_sm90a_design(spec, case, backward, compiler):
    (report,) = inspect_cases([(spec, case)], TARGET, compiler=compiler, mode="dry",
                              backward=backward)
    assert not report.error, report.error
    short = []
    gemms = [k for k in report.kernels if k.launch.kernel.endswith("matmul_kernel")]
    assert gemms, "no GEMM kernel launched"
    for k in gemms:
        d = k.design
        assert (d.mma, d.tma, d.min_stages) == ("HGMMA", True, 3)
        declared = {a.name: a.value for a in k.launch.args if a.name in k.launch.declared}
        GUARD_TABLE.append(
            f"{spec.name:12s} {k.launch.direction} {k.launch.kernel:22s} "
            f"{declared['BLOCK_M']}x{declared['BLOCK_N']}x{declared['BLOCK_K']} "
            f"warps={k.launch.num_warps} stages {k.stages} regs {k.registers:3d} "
            f"spill {k.spill_stores} smem {k.smem} "
            f"{' '.join(f'{op} x{n}' for op, n in sorted(k.mix.tensor_core.items()))} "
            f"UTMALDG x{k.mix.tma.get('UTMALDG', 0)}  [{case.label}]")
        short += [str(s) for s in guard.check_kernel(k)]
    assert not short, "\n".join(short)
