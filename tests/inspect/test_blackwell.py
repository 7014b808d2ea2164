"""CI guard of the matrix kernels on Blackwell: compiled for sm_100a (no GPU needed) with
the launches a B200 user gets, each is held to its sm_100a KernelDesign as
test_matmul_guard and test_attention_design hold them on sm_90a. The GEMMs (bf16 and fp8,
forward and the bf16 backward) and gated_matmul: TMA loads (UTMALDG) into at least 3
pipeline stages, tcgen05 MMA (UTCHMMA; UTCQMMA for fp8) with the accumulator in tensor
memory, no spills. Attention's forward: tcgen05 MMA, tensor memory, K and V by TMA, no spills;
its backward is held to the shortfall its design records (the dk/dv pass spills on
sm_100a, with the reason). Compile-only: the launches are captured dry.

The forward that stores act' for its backward (bias + activation in training) takes 128 x 64
tiles on sm_100a (launch.planned_arch), where 128 x 128 spills, and so does one that reads
a residual: both held here without spills."""

import pytest
import torch

from speedlight.inspect import guard
from speedlight.inspect.run import inspect_cases
from speedlight.ops import attention, gated_matmul, matmul
from speedlight.spec import Case
from speedlight.target import resolve
from tests.inspect.conftest import GUARD_TABLE

BLACKWELL = resolve("sm_100a")
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def _mm(m, n, k, dtype=BF16, **flags):
    return Case("matmul", {"m": m, "n": n, "k": k}, dtype=dtype, flags=dict(linear=True, **flags))


def _attention(sq, sk, d, **flags):
    return Case("attention", (("batch", 1), ("heads", 2), ("kv_heads", 1), ("seq_q", sq),
                              ("seq_k", sk), ("dim", d)), dtype=BF16, flags=flags)


ITEMS = [
    pytest.param(matmul.SPEC, _mm(512, 768, 768, bias=True), True,
                 id="matmul-prefill-bias-fwd-bwd"),
    pytest.param(matmul.SPEC, _mm(512, 768, 768, bias=True, act="silu"), True,
                 id="matmul-train-bias-silu-fwd-bwd"),
    pytest.param(matmul.SPEC, _mm(512, 768, 768, residual=True), False,
                 id="matmul-residual-fwd"),
    pytest.param(gated_matmul.SPEC, Case("gated_matmul", {"m": 512, "n": 1024, "k": 768},
                                         dtype=BF16), False, id="gated-prefill-fwd"),
    pytest.param(matmul.SPEC, _mm(512, 768, 768, FP8, rowscale=True), False,
                 id="fp8-prefill-rowscale-fwd"),
    pytest.param(attention.SPEC, _attention(256, 256, 128, causal=True), True,
                 id="attention-prefill-d128-fwd-bwd"),
]

TENSOR_MEMORY = {"UTCHMMA", "UTCQMMA"}  # tcgen05.mma: its accumulator is in tensor memory


@pytest.mark.parametrize("spec,case,backward", ITEMS)
def test_matrix_kernels_meet_their_sm100a_design(spec, case, backward, compiler):
    (report,) = inspect_cases([(spec, case)], BLACKWELL, compiler=compiler, mode="dry",
                              backward=backward)
    assert not report.error, report.error
    short, matrix = [], 0
    for k in report.kernels:
        d = k.design
        assert d == spec.design(k.launch.kernel, 100)
        GUARD_TABLE.append(
            f"sm_100a {spec.name:12s} {k.direction} {k.name:30s} regs {k.registers:3d} "
            f"spill {k.spill_stores:3d} smem {k.smem} stages {k.stages} "
            f"tmem {k.compiled.meta.get('tmem_size', 0)} "
            f"{' '.join(f'{op} x{n}' for op, n in sorted(k.mix.tensor_core.items()))} "
            f"UTMALDG x{k.mix.tma.get('UTMALDG', 0)}  [{case.label}]")
        if d.mma:
            matrix += 1
            assert d.mma in TENSOR_MEMORY, f"{k.name}: its sm_100a design names {d.mma}"
            assert k.mix.tensor_core.get(d.mma), f"{k.name}: no {d.mma} in its SASS"
            assert k.compiled.meta.get("tmem_size", 0) > 0, f"{k.name}: no tensor memory"
            if spec is not attention.SPEC:
                assert (d.tma, d.min_stages) == (True, 3)
            if d.tma:
                assert k.mix.tma.get("UTMALDG"), f"{k.name}: designed for TMA, no UTMALDG"

        if d.spills:  # a recorded shortfall says why, and the kernel does spill
            assert d.why.startswith("a shortfall on sm_100a") and k.spill_stores > 0
        short += [str(s) for s in guard.check_kernel(k)]
    assert matrix, "no matrix kernel launched"
    assert not short, "\n".join(short)
