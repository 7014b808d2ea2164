"""The findings fire on the kernels built to trigger them, with the evidence, and stay
quiet on the control cases."""

from pathlib import Path

import pytest
import torch

from speedlight.inspect import guard
from speedlight.inspect.run import inspect_cases
from speedlight.ops import layer_norm, rms_norm
from speedlight.spec import Case
from tests.inspect.conftest import TARGET
from tests.inspect.kernels import CENTER, COPY, MATMUL, SPILL

BF16 = torch.bfloat16


def rms(rows, hidden, layout="contiguous"):
    return Case("rms_norm", {"rows": rows, "hidden": hidden}, dtype=BF16, layout=layout)


def copy(rows, cols, **flags):
    return Case("copy", {"rows": rows, "cols": cols}, dtype=BF16, flags=flags)


# one set of compiled reports (the module fixture) serves every test here: one xdist worker
pytestmark = pytest.mark.xdist_group("findings")


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def reports(compiler):
    items = {
        "aligned": (rms_norm.SPEC, rms(8, 4096)),
        "hidden4095": (rms_norm.SPEC, rms(8, 4095)),
        "transposed": (rms_norm.SPEC, rms(8, 4096, "transposed")),
        "stride4104": (COPY, copy(8, 4104)),
        "offset-view": (COPY, copy(8, 4096, offset=3)),
        "spill": (SPILL, Case("spill", {"n": 8192})),
        "mma-2-warps": (MATMUL, Case("matmul", {"m": 64, "n": 64, "k": 64}, dtype=torch.float16,
                                     flags={"warps": 2})),
        "mma-4-warps": (MATMUL, Case("matmul", {"m": 64, "n": 64, "k": 64}, dtype=torch.float16,
                                     flags={"warps": 4})),
        "center-1": (CENTER, Case("center", {"rows": 8, "cols": 1}, dtype=torch.float32)),
        "center-64": (CENTER, Case("center", {"rows": 8, "cols": 64}, dtype=torch.float32)),
        "layer_norm-hidden1": (layer_norm.SPEC, Case("layer_norm", {"rows": 1, "hidden": 1},
                                                     dtype=torch.float32)),
    }
    done = inspect_cases(list(items.values()), TARGET, compiler=compiler, mode="run")
    out = dict(zip(items, done))
    # 132 SMs x 32 resident one-warp programs = 4224 per wave; one more opens a fifth wave
    wave = inspect_cases([(COPY, copy(4 * 4224 + 1, 64, bm=1, bn=64, warps=1))], TARGET,
                         compiler=compiler, mode="dry")
    out["last-wave"] = wave[0]
    return out


def codes(report, code):
    return [f for f in report.all_findings if f.code == code]


def on_x(report):
    return [f for f in codes(report, "narrow-access") if f.evidence["arg"] == "x_ptr"]


def test_aligned_rows_compile_to_128_bit_accesses_and_no_finding(reports):
    r = reports["aligned"]
    assert not codes(r, "narrow-access") and not codes(r, "spill")
    rows = [a for k in r.kernels for a in k.accesses if a.row_data]
    assert {a.arg for a in rows} >= {"x_ptr", "y_ptr", "dy_ptr", "dx_ptr"}
    assert all(a.bits == 128 for a in rows), [(a.arg, a.sass.describe()) for a in rows]
    assert not [s for s in guard.check_report(r) if s.check == "vector"]


def test_a_row_stride_not_a_multiple_of_8_gives_narrow_loads(reports):
    fwd = [f for f in codes(reports["hidden4095"], "narrow-access")
           if f.kernel == "_rms_norm_fwd_kernel" and f.evidence["arg"] == "x_ptr"]
    assert len(fwd) == 1
    f = fwd[0]
    assert "16-bit" in f.text and "row stride (4095 elements) is not a multiple of 8" in f.text
    assert f.evidence["sass"] == {16: f.evidence["sass"][16]} and f.evidence["row_stride"] == 4095


def test_aligned_rows_with_an_unspecialised_stride_name_what_the_compiler_was_not_told(reports):
    (f,) = on_x(reports["stride4104"])
    assert "cannot prove it" in f.text and "stride_xm=4104" in f.text
    assert "stride_xm" in f.evidence["unspecialised"]


def test_a_view_at_an_odd_offset_is_named(reports):
    (f,) = on_x(reports["offset-view"])
    assert "only 2-byte aligned" in f.text and f.evidence["data_ptr_align"] == 2


def test_a_transposed_input_is_named_as_strided_lanes(reports):
    found = on_x(reports["transposed"])
    assert found and all("8 elements apart" in f.text for f in found)


def test_a_forced_spill_is_reported_with_its_bytes(reports):
    (f,) = codes(reports["spill"], "spill")
    assert f.evidence["spill_stores"] > 0 and f.evidence["registers"] == 255
    assert f.evidence["local"].get("STL", 0) > 0
    assert f"{f.evidence['spill_stores']} bytes spilled to local memory" in f.text
    assert [s for s in guard.check_report(reports["spill"]) if s.check == "spill"]


def test_a_matrix_kernel_without_a_warp_group_gets_no_wgmma(reports):
    (f,) = codes(reports["mma-2-warps"], "no-wgmma")
    assert "without HGMMA on sm_90a" in f.text and "HMMA" in f.evidence["tensor_core"]
    (k,) = reports["mma-4-warps"].kernels
    assert k.mix.tensor_core.get("HGMMA", 0) > 0 and not codes(reports["mma-4-warps"], "no-wgmma")


def test_a_grid_one_program_past_a_wave_leaves_the_last_wave_idle(reports):
    (f,) = codes(reports["last-wave"], "last-wave")
    assert "4224 per wave" in f.text and "runs 1 program in 4224 slots" in f.text
    assert f.evidence["idle_share"] > 0.99


def test_bytes_are_held_to_the_design_from_both_sides():
    """Over the design's ratio a direction re-reads; under compulsory it did less than its
    cost counts (a skipped output), which would hide a re-read."""
    from speedlight.inspect.case_report import DirectionBytes

    def moved(measured):
        return guard.check_direction(DirectionBytes("fwd", measured, 1000, ["_k"], {}, 1.05, ""))

    assert not moved(1000) and not moved(1050) and not moved(960)
    (over,) = moved(1500)
    assert over.check == "bytes" and "1.500x" in over.text and "at most 1.05x" in over.text
    (under,) = moved(500)
    assert under.check == "bytes" and "only 0.500x" in under.text


def test_a_matrix_kernel_is_held_to_the_design_its_spec_names(reports):
    """The 4-warp pointer matmul gets HGMMA and a cp.async pipeline on sm_90a, no TMA: a
    design naming TMA, HGMMA and 3 stages fails on TMA only; one naming QGMMA, 8 stages
    and a shared-memory limit it exceeds fails on each."""
    import dataclasses

    from speedlight.inspect.findings import kernel_findings
    from speedlight.spec import KernelDesign

    (k,) = reports["mma-4-warps"].kernels
    assert k.stages >= 2 and k.mix.async_copies and not k.mix.tma
    hopper = dataclasses.replace(k, design=KernelDesign(min_occupancy=0.0, vector_bits=0, mma="HGMMA",
                                                        tma=True, min_stages=k.stages))
    assert [s.check for s in guard.check_kernel(hopper)] == ["tma"]
    design_codes = {"no-wgmma", "no-tma", "shallow-pipeline", "smem-limit"}
    assert [f.code for f in kernel_findings(hopper, "sm_90a") if f.code in design_codes] \
        == ["no-tma"]
    wrong = dataclasses.replace(k, smem_limit=k.smem - 1, design=KernelDesign(
        min_occupancy=0.0, vector_bits=0, mma="QGMMA", min_stages=8))
    assert sorted(s.check for s in guard.check_kernel(wrong)) == ["mma", "smem", "stages"]
    found = {f.code for f in kernel_findings(wrong, "sm_90a")}
    assert {"no-wgmma", "shallow-pipeline", "smem-limit"} <= found


def test_pipeline_stages_are_read_from_the_shared_allocations():
    from speedlight.inspect.case_report import pipeline_stages

    ttgir = """
    %2 = ttg.local_alloc : () -> !ttg.memdesc<128x128xbf16, #shared, #smem, mutable>
    %a = ttg.local_alloc : () -> !ttg.memdesc<4x128x64xbf16, #shared, #smem, mutable>
    %b = ttg.local_alloc : () -> !ttg.memdesc<3x64x128xf16, #shared, #smem, mutable>
    %bar = ttg.local_alloc : () -> !ttg.memdesc<6x1xi64, #shared1, #smem, mutable>
    """
    assert pipeline_stages(ttgir) == 4
    assert pipeline_stages("%2 = ttg.local_alloc : () -> !ttg.memdesc<128x64xbf16, #s>") == 1


def test_a_product_subtracted_from_its_own_rounded_value_is_a_rounding_leak(reports):
    """At one column the row's mean is the product's own register, and the compiler
    contracts `p - mean` into an FFMA of the exact product: y is p's rounding error, not 0.
    LayerNorm's backward did this at hidden 1 (4.7e-6 for 0 on an H200); it rounds dy * w
    once now, and the finding holds it there."""
    (leak,) = codes(reports["center-1"], "rounding-leak")
    assert leak.kernel == "_center_kernel"
    assert {Path(f).name for f, _ in leak.evidence["lines"]} == {"kernels.py"}
    assert not codes(reports["center-64"], "rounding-leak")  # a 64-lane sum: no such FFMA
    norm = reports["layer_norm-hidden1"]
    assert {k.name for k in norm.kernels} >= {"_layer_norm_bwd_kernel"}
    assert not codes(norm, "rounding-leak")


def test_rounding_leaks_are_read_from_the_sass_operands():
    from speedlight.inspect import sass

    def listing(*lines):
        return "\n".join(f"        /*{16 * n:04x}*/  {text} ;" for n, text in enumerate(lines))

    leak = sass.parse(listing("FMUL R28, R23, R0", "FFMA R29, R23.reuse, R0, -R28"))
    assert [i.operands for i in sass.rounding_leaks(leak)] == [("R29", "R23", "R0", "-R28")]
    negated_factor = sass.parse(listing("FMUL R28, R23, R0", "FFMA R29, -R0, R23, R28"))
    assert len(sass.rounding_leaks(negated_factor)) == 1
    for clean in (("FMUL R28, R23, R0", "FFMA R29, R23, R0, R28"),  # a product doubled
                  ("FMUL R28, R23, R0", "MOV R23, R1", "FFMA R29, R23, R0, -R28"),  # a new a
                  ("FMUL R28, R23, R0", "FADD R28, R28, 1", "FFMA R29, R23, R0, -R28"),
                  ("FMUL R28, R23, R0", "FFMA R29, R23, R5, -R28"),  # another product
                  ("FMUL R23, R23, R0", "FFMA R29, R23, R0, -R23")):  # a factor overwritten
        assert not sass.rounding_leaks(sass.parse(listing(*clean))), clean
    stored = sass.parse(listing("FMUL R28, R23, R0", "STG.E [R28.64], R1",
                                "FFMA R29, R23, R0, -R28"))
    assert len(sass.rounding_leaks(stored)) == 1  # a store's first operand is an address

