"""CI guard on AMD: every built-in op's Triton kernels compiled for gfx942 (MI300X; no GPU
needed) with the launches an MI300X user gets (waves of 64, grids over 304 CUs, the GEMM
rule's AMD stages and knobs), each held to its gfx942 design (spec.design(kernel, "gfx942"))
as test_guards and test_blackwell hold sm_90a and sm_100a: it compiles, it does not spill,
its occupancy, LDS within the 64 KB a workgroup may have, and the matrix kernels' dots on
MFMA.

Budget (one compile batch, one worker pool): each op runs one small case, its
memory-bound kernels sampled under the interpreter (a few programs: the access widths), the
matrix ops captured dry at shapes that reach their GPU tiles; each kernel function is
compiled once, at the first launch of it met (ops in registry order, forward first). The
long-row variants (looped and split kernels) come from each memory-bound op's quick cases
wider than a fused kernel holds, their width rounded up to a multiple of 64 (aligned, as a
model's would be), with their few rows (the split variants) and with 4096 (the looped
ones), captured dry. A shortfall the design records for gfx942 is held
exactly (it must still be there, with its reason), so a change that fixes or adds one fails
here.
"""

import ast
from pathlib import Path

import pytest
import torch

from speedlight import launch, registry
from speedlight.inspect import case_report, guard
from speedlight.inspect.launches import capture_case
from speedlight.spec import Case
from speedlight.target import resolve
from tests.inspect.conftest import GUARD_TABLE

TARGET = resolve("gfx942")
BF16 = torch.bfloat16
SPECS = registry.builtin_specs()


def _mm(m, n, k, dtype=BF16, **flags):
    return Case("matmul", {"m": m, "n": n, "k": k}, dtype=dtype, flags=dict(linear=True, **flags))


# (case, backward) of the ops whose quick cases are too small to reach their GPU tiles, or
# not aligned; captured dry (meta tensors: any size in a moment)
DRY = {
    "matmul": [(_mm(256, 256, 128, bias=True), True),
               (_mm(256, 256, 128, torch.float8_e4m3fn, rowscale=True), False)],
    "gated_matmul": [(Case("gated_matmul", {"m": 256, "n": 256, "k": 128}, dtype=BF16), True)],
    "attention": [(Case("attention", (("batch", 1), ("heads", 2), ("kv_heads", 1),
                                      ("seq_q", 256), ("seq_k", 256), ("dim", 128)),
                        dtype=BF16, flags={"causal": True}), True),
                  # one query row against a long cache: the split key range and its combine
                  (Case("attention", (("batch", 1), ("heads", 2), ("kv_heads", 1),
                                      ("seq_q", 1), ("seq_k", 8192), ("dim", 128)),
                        dtype=BF16, flags={"causal": True}), False)],
}

# Narrow accesses of the small cases, recorded as what they are: a 64-lane wave spreads a
# tile over twice the lanes of a 32-lane warp, so a tile of a few short rows leaves each
# lane fewer than the 8 bf16 values (16 bytes) of a 128-bit access. The model widths are
# guarded on sm_90a and sm_100a by test_guards.
_SHORT_ROWS = ("rows of 128 bf16 (the quick case): the backward's tile over its 64-lane "
               "waves is 4 values (64 bits) per lane, not the 8 of a 128-bit store")
# Shortfalls held exactly: op -> {"kernel: check": why}.
EXPECTED: dict[str, dict[str, str]] = {
    "rms_norm": {"_rms_norm_bwd_kernel: vector": _SHORT_ROWS},
    "add_rms_norm": {"_rms_norm_bwd_kernel: vector": _SHORT_ROWS},
    "layer_norm": {"_layer_norm_bwd_kernel: vector": _SHORT_ROWS},
    "rope": {"_rope_kernel: vector": "heads of 32 dims (the quick case): 16-dim halves "
                                     "rotated, 4 values (64 bits) per lane of a 64-lane wave"},
    "moe_experts": {"_moe_gate_bwd_kernel: vector": "an intermediate size of 8 (the quick "
                                                    "case): rows of 16 bytes, no 128-bit "
                                                    "load fits a lane's share"},
}


LONG_ROW = 16384  # the widest row a fused memory-bound kernel holds (MAX_FUSED_N)
LONG_ROWS = 4096  # enough rows that the launchers take the looped kernels, not the split


def _bf16(spec, case):
    return case.with_(dtype=BF16) if case.dtype != BF16 and BF16 in spec.dtypes else case


def _long_rows(spec):
    """The op's first quick case of each last width past LONG_ROW, contiguous and rounded
    up to a multiple of 64 so its rows are aligned: as it is (few rows: the split
    variants) and at LONG_ROWS rows (the looped ones)."""
    out = {}
    for c in spec.cases("quick"):
        (rows_name, _), *mid, (name, width) = c.params
        if isinstance(width, int) and width > LONG_ROW:
            width = -(-width // 64) * 64
            for rows in (dict(c.params)[rows_name], LONG_ROWS):
                wide = c.with_(params=((rows_name, rows), *mid, (name, width)),
                               layout="contiguous")
                if guard.aligned(spec, wide):
                    out.setdefault((rows, width), _bf16(spec, wide))
    return list(out.values())


def _cases(spec):
    """(case, mode, backward) of one op: DRY's, else its first aligned quick case in bf16
    (its first quick case when none is aligned), sampled, then its long rows."""
    if spec.name in DRY:
        return [(c, "dry", bwd) for c, bwd in DRY[spec.name]]
    quick = spec.cases("quick")
    case = next((c for c in quick if guard.aligned(spec, c)), quick[0])
    long_rows = _long_rows(spec) if spec.family == "memory-bound" else []
    # the long rows captured dry (their sizes are for the launchers' choice of variant)
    return [(_bf16(spec, case), "sample", True)] + [(c, "dry", True) for c in long_rows]


def _capture(spec, case, mode, backward):
    if mode == "dry":
        try:
            return capture_case(spec, case, "meta", arch=TARGET.arch, mode="dry",
                                backward=backward)
        except Exception:  # a launcher that reads its inputs' values: on CPU tensors
            return capture_case(spec, case, "cpu", arch=TARGET.arch, mode="dry",
                                backward=backward)
    return capture_case(spec, case, "cpu", arch=TARGET.arch, mode=mode, backward=backward)


# one compile of every kernel serves every test here: keep them on one xdist worker
pytestmark = pytest.mark.xdist_group("gfx942")


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def compiled(compiler):
    """{op: [(case label, KernelReport)]}: each op's kernel functions, each compiled once
    for gfx942 in one batch (a function several ops launch is reported under each)."""
    return _compile_batch(compiler)


def _compile_batch(compiler):
    launched, first = {}, {}
    with launch.for_target(TARGET):
        for spec in SPECS:
            for case, mode, backward in _cases(spec):
                capture = _capture(spec, case, mode, backward)
                for l in capture.launches:
                    fn = (l.file, l.qualname)
                    first.setdefault(fn, l)
                    launched.setdefault(spec.name, {}).setdefault(fn, (case.label, spec))
    binaries = compiler.compile(list(first.values()), TARGET)
    out = {}
    for op, fns in launched.items():
        for fn, (label, spec) in fns.items():
            l = first[fn]
            k = case_report.analyse_kernel(l, binaries[l.key(TARGET.arch_name)], TARGET,
                                           TARGET.sku, spec.design(l.kernel, TARGET.arch))
            out.setdefault(op, []).append((label, k))
    return out


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_kernel_compiles_for_gfx942_to_its_design(spec, compiled):
    kernels = compiled.get(spec.name)
    assert kernels, f"{spec.name}: no Triton launch captured"
    short, matrix = {}, 0
    for label, k in kernels:
        assert k.ok, f"{k.launch.kernel} did not compile for gfx942: {k.error}"
        d = k.design
        GUARD_TABLE.append(
            f"gfx942 {spec.name:14s} {k.launch.kernel:32s} vgpr {k.registers:3d} "
            f"agpr {k.compiled.resources.get('agprs', 0):3d} scratch {k.spill_stores:3d} "
            f"lds {k.smem:6d} waves/SIMD {k.occupancy.per_simd:g} "
            f"{' '.join(f'{op} x{n}' for op, n in sorted(k.mix.tensor_core.items()))}  [{label}]")
        if d.mma:
            matrix += 1
            assert d.mma == "MFMA" and not d.tma, f"{k.launch.kernel}: gfx942 design {d}"
        for s in guard.check_kernel(k):
            short[f"{k.launch.kernel}: {s.check}"] = str(s)
    expected = EXPECTED.get(spec.name, {})
    assert set(short) == set(expected), "\n".join(
        [f"new: {v}" for s, v in short.items() if s not in expected]
        + [f"gone (update EXPECTED): {s}: {why}" for s, why in expected.items() if s not in short])
    if spec.name in ("matmul", "gated_matmul", "grouped_matmul", "moe_experts", "attention"):
        assert matrix, f"{spec.name}: no matrix kernel held to MFMA"


KERNELS = Path(registry.__file__).resolve().parent / "kernels"


def _package_kernels() -> set[str]:
    """Every Triton kernel function speedlight/kernels defines (a @triton.jit function whose
    name ends in _kernel; the helpers they call are compiled into them). Gluon kernels
    (@gluon.jit) are left out: they are written for NVIDIA's Hopper and Blackwell (wgmma,
    tcgen05, TMA, warp specialization), with no AMD design to compile them to."""
    out = set()
    for path in KERNELS.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.endswith("_kernel"):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if any("jit" in d and "gluon" not in d for d in decorators):
                out.add(node.name)
    return out


def test_every_kernel_of_the_package_is_compiled_for_gfx942(compiled):
    """Item 5 of the AMD targets: CI compiles every kernel for gfx942, the long-row
    variants included (a kernel the cases above never launch fails here, by name)."""
    seen = {k.launch.kernel for kernels in compiled.values() for _, k in kernels}
    assert _package_kernels() <= seen, sorted(_package_kernels() - seen)
