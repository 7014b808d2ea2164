"""Loops read from compiled code: counts on deliberate kernels whose figures are known (a
masked loop against an unmasked one; a row loop with and without a prefetch), on SASS
written by hand (no compile), and the before/after comparison of two runs."""

import json

import pytest
import torch

from speedlight.inspect import compare, loops, sass
from speedlight.inspect.command import rows
from speedlight.inspect.run import inspect_cases
from speedlight.spec import Case
from tests.inspect.conftest import TARGET
from tests.inspect.loop_kernels import BK, BM, BN, ROW, ROWS, SCORES

pytestmark = pytest.mark.xdist_group("findings")  # the session's compiler, one worker

# --- SASS by hand -------------------------------------------------------------------------

LISTING = """
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   FFMA R8, R8, R8, R9 ;
        /*0030*/                   FMUL R10, R8, R8 ;
        /*0040*/                   FADD R10, R4, R10 ;
        /*0050*/                   FSEL R11, R10, RZ, P0 ;
        /*0060*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;
        /*0070*/                   MUFU.EX2 R12, R11 ;
        /*0080*/                   SHFL.BFLY PT, R13, R12, 0x1, 0x1f ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_1:
        /*00a0*/                   LDG.E R20, desc[UR4][R2.64] ;
        /*00b0*/                   IADD3 R0, R0, 0x1, RZ ;
        /*00c0*/                   FADD R21, R21, R20 ;
        /*00d0*/               @P1 BRA `(.L_x_1) ;
        /*00e0*/                   HMMA.16816.F32.BF16 R24, R4, R6, R24 ;
        /*00f0*/              @!P0 BRA `(.L_x_0) ;
        /*0100*/                   EXIT ;
.L_x_2:
        /*0110*/                   BRA `(.L_x_2);
"""


def test_loops_in_sass_are_counted_by_pipe_per_iteration():
    instrs, labels = sass.parse_with_labels(LISTING)
    found = loops.measure_loops(loops.find_loops(instrs, labels), instrs, num_warps=4)
    assert len(found) == 2, "the trap after EXIT (a branch to itself) is not a loop"
    outer, inner = found
    assert (outer.depth, inner.depth, outer.inner) == (0, 1, [1])
    # the outer body less the inner loop's four instructions
    assert outer.instructions == 11 and inner.instructions == 4
    assert dict(outer.pipes) == {"memory": 1, "fma": 3, "select": 2, "mufu": 1, "shuffle": 1,
                                 "barrier": 1, "mma": 1, "control": 1}
    assert dict(inner.pipes) == {"memory": 1, "alu": 1, "fma": 1, "control": 1}
    # HMMA.16816: 2 * 16 * 8 * 16 FLOPs per warp, 4 warps
    assert outer.mma_flops == 2 * 16 * 8 * 16 * 4 and outer.mma_dtype == "bf16"
    assert outer.warp_instructions == 44
    assert outer.per_mma_tile == pytest.approx(44 * loops.MMA_TILE_FLOPS / outer.mma_flops)
    assert (outer.load_bytes, outer.barriers, inner.load_bytes) == (16, 1, 4)
    # the 128-bit load is used three instructions later, by FADD R10, R4, ...
    assert outer.in_flight == 16 and not outer.prefetch
    assert outer.steady is False and inner.steady is True  # the innermost loop


PREFETCHED = """
.L_x_0:
        /*0000*/                   FADD R10, R4, R5 ;
        /*0010*/                   FADD R11, R6, R7 ;
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/                   FMUL R12, R10, R11 ;
        /*0040*/                   FMUL R13, R12, R12 ;
        /*0050*/                   FMUL R14, R13, R12 ;
        /*0060*/                   STG.E desc[UR4][R8.64], R14 ;
        /*0070*/              @!P0 BRA `(.L_x_0) ;
"""

CP_ASYNC = """
.L_x_0:
        /*0000*/                   DEPBAR.LE SB0, 0x1 ;
        /*0010*/                   LDS R10, [R1] ;
        /*0020*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R3+0x800], desc[UR4][R6.64] ;
        /*0040*/                   LDGDEPBAR ;
        /*0050*/                   FADD R11, R10, R11 ;
        /*0060*/              @!P0 BRA `(.L_x_0) ;
"""


# a pipeline four tiles deep (Triton's num_stages=5: the prologue commits four groups, and
# each iteration waits for the oldest, keeping three pending, then commits the next)
CP_ASYNC_DEEP = """
.L_x_0:
        /*0000*/                   DEPBAR.LE SB0, 0x3 ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0020*/                   LDS.128 R8, [R1] ;
        /*0030*/                   FADD R11, R10, R11 ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;
        /*0050*/                   LDGDEPBAR ;
        /*0060*/              @!P0 BRA `(.L_x_0) ;
"""


def _one(listing):
    instrs, labels = sass.parse_with_labels(listing)
    (lp,) = loops.measure_loops(loops.find_loops(instrs, labels), instrs, num_warps=1)
    return lp


def test_a_load_used_in_the_next_iteration_is_a_prefetch():
    lp = _one(PREFETCHED)
    assert lp.in_flight == 16 and lp.prefetch and lp.overlap == pytest.approx(6 / 8)
    # cp.async: two stages in flight (the group of this iteration and the one before)
    lp = _one(CP_ASYNC)
    assert lp.in_flight == 64 and lp.prefetch and lp.load_bytes == 32
    # four tiles deep: the three groups the wait leaves pending and the one committed after
    # it (two walks of the body from none pending would see two)
    lp = _one(CP_ASYNC_DEEP)
    assert lp.in_flight == 4 * 16 and lp.prefetch and lp.load_bytes == 16


# --- deliberate kernels, compiled for sm_90a -------------------------------------------------

def rows_case(prefetch, rows=16):
    return Case("rows", {"rows": rows}, dtype=torch.float32, flags={"prefetch": prefetch})


def scores_case(split):
    return Case("scores", {"blocks": 4}, dtype=torch.float16, flags={"split": split})


@pytest.fixture(scope="session")
def compiled(compiler):
    items = {"split": (SCORES, scores_case(True)), "masked": (SCORES, scores_case(False)),
             "rows": (ROWS, rows_case(False)), "rows-ahead": (ROWS, rows_case(True))}
    done = inspect_cases(list(items.values()), TARGET, compiler=compiler, mode="dry")
    return {name: r.kernels[0] for name, r in zip(items, done)} | {
        f"{name}-report": r for name, r in zip(items, done)}


def test_a_masked_loop_against_an_unmasked_one(compiled):
    masked_loop, plain = compiled["split"].loops
    for lp in (masked_loop, plain):  # BK / 16 HGMMA.64x64x16 per warp
        assert lp.opcodes["HGMMA"] == BK // 16 and lp.mma_flops == 2 * BM * BN * BK
        assert lp.mma_dtype == "fp16"
    # one FSEL per accumulator element a thread holds (4 warps), none without the mask
    assert masked_loop.opcodes["FSEL"] == BM * BN // 128 and plain.opcodes.get("FSEL", 0) == 0
    assert masked_loop.instructions > plain.instructions
    assert plain.steady and not masked_loop.steady, "equal MMA: the unmasked loop is steady"
    assert masked_loop.per_mma_tile > plain.per_mma_tile
    where = loops.select_lines(masked_loop)[0]
    assert "tl.where" in where.source and where.file.endswith("loop_kernels.py")
    # only the unmasked loop is steady, so no finding; every block masked: the finding
    assert not [f for f in compiled["split"].findings if f.code == "loop-mask"]
    (f,) = [f for f in compiled["masked"].findings if f.code == "loop-mask"]
    assert f"loop_kernels.py:{where.line}" in f.text and "FSEL x32" in f.text


def test_a_row_loop_with_and_without_a_prefetch(compiled):
    (plain,), (ahead,) = compiled["rows"].loops, compiled["rows-ahead"].loops
    per_thread = ROW * 4 // 128
    assert plain.load_bytes == ahead.load_bytes == per_thread
    assert plain.in_flight == per_thread and not plain.prefetch
    assert ahead.prefetch and ahead.overlap > 2 * plain.overlap
    assert plain.barriers == ahead.barriers > 0  # the row's sum across warps
    # the finding names what is missing, and says so of the prefetching loop too
    (f,) = [f for f in compiled["rows"].findings if f.code == "in-flight"]
    assert "no prefetch" in f.text and not f.evidence["prefetch"]
    assert f.evidence["most_per_sm"] == per_thread * 128
    assert f.evidence["per_sm"] < f.evidence["needed"]
    assert 0 < f.evidence["share_of_iteration"] < 1  # the latency's share of the iteration
    (g,) = [f for f in compiled["rows-ahead"].findings if f.code == "in-flight"]
    assert "(a prefetch), still too few" in g.text and g.evidence["share_of_iteration"] == 1


def test_inspect_rows_carry_the_loops_and_compare_shows_the_change(compiled, tmp_path):
    base = {"tool": "inspect", "run": "x", "timestamp": "t"}
    before = rows(compiled["masked-report"], base, "speedlight")
    after = rows(compiled["split-report"], base, "speedlight")
    kernel = next(r for r in after if r["level"] == "kernel")
    json.dumps(kernel)  # JSON as written
    assert [lp["steady"] for lp in kernel["loops"]] == [False, True]
    assert kernel["loops"][1]["pipes"]["mma"] == BK // 16 and kernel["loops"][0]["lines"]
    for r in after:  # the same kernel, changed
        r["case_id"] = before[0]["case_id"]
    (change,) = compare.changes(before, after)
    figures = {label: (a, b) for label, a, b, _ in change.figures()}
    a, b = figures["select/iter"]
    assert a > b and figures["MMA instr/iter"] == (BK // 16, BK // 16)
    paths = []
    for name, rs in (("before", before), ("after", after)):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rs))
    from rich.console import Console

    from speedlight.inspect.command import _compare_files

    console = Console(width=200, record=True)
    assert _compare_files(str(paths[0]), str(paths[1]), console, False) == 0
    text = console.export_text()
    assert "select/iter" in text and "MMA instr/iter" not in text  # only what changed


# --- two dots into one accumulator on Blackwell -------------------------------------------

CHAINED_TTIR = """
#loc3 = loc("/k.py":12:20)
#loc4 = loc("/k.py":14:20)
  tt.func public @k(%a: !tt.ptr<f16>) {
    %r = scf.for %j = %c0 to %n step %c1 iter_args(%acc = %z) -> (tensor<64x64xf32>)  : i32 {
      %d1 = tt.dot %a1, %b1, %acc : tensor<64x32xf16> * tensor<32x64xf16> -> tensor<64x64xf32> loc(#loc3)
      %d2 = tt.dot %a2, %b2, %d1 : tensor<64x32xf16> * tensor<32x64xf16> -> tensor<64x64xf32> loc(#loc4)
      scf.yield %d2 : tensor<64x64xf32>
    } loc(#loc3)
    %s = tt.dot %a1, %b1, %r : tensor<64x32xf16> * tensor<32x64xf16> -> tensor<64x64xf32> loc(#loc4)
    tt.return
  }
"""


def test_two_dots_chained_in_a_loop_are_read_from_the_ttir():
    assert loops.chained_dots(CHAINED_TTIR) == [(12, 14)]
    # one dot in the loop, the second after it (two loops' worth): no pair
    assert loops.chained_dots(CHAINED_TTIR.replace("%b2, %d1", "%b2, %z")) == []


def test_two_dots_into_one_accumulator_are_held_on_sm_100a(compiler):
    from speedlight.inspect import guard
    from speedlight.target import resolve
    from tests.inspect.loop_kernels import TWODOTS

    items = [(TWODOTS, Case("twodots", {"blocks": 4}, dtype=torch.float16, flags={"two": two}))
             for two in (True, False)]
    two, one = inspect_cases(items, resolve("sm_100a"), compiler=compiler, mode="dry")
    k2, k1 = two.kernels[0], one.kernels[0]
    assert any(op.startswith("UTC") for op in k2.mix.tensor_core), k2.mix.tensor_core
    (f,) = [f for f in k2.findings if f.code == "chained-dots"]
    assert f.severity == "error" and len(f.evidence["pairs"]) == 1
    assert [s.check for s in guard.check_kernel(k2)].count("chained-dots") == 1
    assert not [f for f in k1.findings if f.code == "chained-dots"]
    assert "chained-dots" not in [s.check for s in guard.check_kernel(k1)]
