"""inspect for CUDA C++ (inspect/cuda.py, cuda_compile.py): every speedlight/csrc/*.cu
compiles with nvcc for sm_80 and sm_90a (no GPU), its kernels hold to their designs on the
ops' aligned cases, and kernels that load scalars or spill fail the guard."""

from pathlib import Path

import pytest
import torch

from speedlight import cli, registry, results
from speedlight.inspect import cuda, cuda_compile, guard
from speedlight.ops import rms_norm
from speedlight.spec import Case, CudaKernels, CudaLaunch
from speedlight.target import resolve

pytestmark = [pytest.mark.xdist_group("cuda"),
              pytest.mark.skipif(cuda_compile.missing_nvcc() is not None,
                                 reason=f"{cuda_compile.missing_nvcc()}")]

CSRC = Path(rms_norm.__file__).resolve().parent.parent / "csrc"
ARCHS = ("sm_80", "sm_90a")
TARGETS = {a: resolve(a) for a in ARCHS}


@pytest.fixture(scope="module")
def compiler() -> cuda_compile.NvccCompiler:
    """One compile per source per arch per session (and the on-disk cache across them)."""
    return cuda_compile.NvccCompiler()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", sorted(p.name for p in CSRC.glob("*.cu")))
def test_every_csrc_source_compiles_without_spills(compiler, source, arch):
    binary = compiler.get(str(CSRC / source), TARGETS[arch].arch)
    assert binary.error == ""
    assert binary.functions, f"{source} compiled to no kernel"
    for f in binary.functions.values():
        assert f.ptxas["spill_stores"] == 0 and f.ptxas["stack"] == 0, f.demangled
        assert f.base and "(" not in f.base  # the demangled name splits into kernel + instance


def _guard_cases(spec) -> list[Case]:
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    return [c.with_(dtype=d) for c in spec.cases("quick") for d in dtypes]


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_kernels_hold_to_their_designs_on_aligned_cases(compiler, arch):
    """The guard: 128-bit row accesses, no spills, occupancy (KernelDesign), on every aligned
    quick case of every op that declares CUDA kernels; a misaligned case may fall short
    (information), never a compile error."""
    target = TARGETS[arch]
    specs = [s for s in registry.builtin_specs() if s.cuda is not None]
    assert "rms_norm" in {s.name for s in specs}
    held_cases = 0
    for spec in specs:
        for case in _guard_cases(spec):
            report = cuda.inspect_case(spec.name, spec.cuda, spec.kernels, case, target,
                                       target.sm_count, compiler)
            held, info = guard.triage(spec, report, target.sm_count)
            assert held == [], f"{case.id} on {arch}: {[str(s) for s in held]}"
            assert all(s.check != "compile" for s in info)
            fwd = [k for k in report.kernels if k.launch.direction == "fwd"]
            if guard.aligned(spec, case) and fwd:
                held_cases += 1
                assert 128 in fwd[0].mix.global_loads and 128 in fwd[0].mix.global_stores
    assert held_cases >= 6


def test_rms_norm_launches_follow_the_launch_sizing():
    case = Case("rms_norm", (("rows", 4096), ("hidden", 4096)), dtype=torch.bfloat16)
    fwd, bwd, reduce = rms_norm.cuda_launches(case, 132)
    assert (fwd.kernel, fwd.instance, fwd.grid, fwd.threads) == \
        ("rms_norm_fwd_kernel", "__nv_bfloat16", 660, 256)
    assert (bwd.instance, bwd.smem, bwd.direction) == ("__nv_bfloat16, true", 16384, "bwd")
    assert reduce.kernel == "rms_norm_dw_reduce_kernel" and reduce.grid == 128
    wide = rms_norm.cuda_launches(case.with_(params=(("rows", 8), ("hidden", 32768)),
                                             dtype=torch.float32), 132)
    assert wide[1].instance == "float, false" and wide[1].smem == 0  # dw sums in global memory
    no_weight = rms_norm.cuda_launches(case.with_(flags={"weight": False}), 132)
    assert [l.kernel for l in no_weight] == ["rms_norm_fwd_kernel", "rms_norm_bwd_kernel"]
    assert rms_norm.cuda_launches(case.with_(params=(("rows", 0), ("hidden", 64))), 132)[0] \
        .kernel == "rms_norm_bwd_kernel"  # no forward launch; the zero dw partials still


def test_inspect_impl_cuda_check_passes_on_the_cli(tmp_path, capsys):
    code = cli.main(["inspect", "rms_norm", "--impl", "cuda", "--target", "sm_90a", "--check",
                     "--out", str(tmp_path), "--dump", str(tmp_path / "dump")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 shortfall(s) where a design applies" in out
    rows = results.read_jsonl(tmp_path / "inspect.jsonl")
    assert {r["kernel"] for r in rows} == {"rms_norm_fwd_kernel<__nv_bfloat16>",
                                           "rms_norm_bwd_kernel<__nv_bfloat16, true>",
                                           "rms_norm_dw_reduce_kernel<__nv_bfloat16>"}
    fwd = next(r for r in rows if r["direction"] == "fwd")
    assert fwd["implementation"] == "speedlight-cuda" and fwd["target"] == "sm_90a"
    assert fwd["sass"]["global_loads"]["128"] > 0 and fwd["spill_stores"] == 0
    assert {"device", "git", "timestamp"} <= set(fwd)
    assert "LDG.E.128" in next((tmp_path / "dump").rglob("kernel.sass")).read_text()


# --- kernels short of their design --------------------------------------------------------

BAD = r"""
#include <cuda_bf16.h>

// one bf16 per thread: 16-bit loads and stores of row data
__global__ void scalar_copy(const __nv_bfloat16* x, __nv_bfloat16* y, long n) {
  const long step = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    y[i] = x[i];
  }
}

// a per-thread array indexed at run time lives in local memory
__global__ void local_array(const float4* x, float4* y, int k) {
  float4 a[32];
  for (int i = 0; i < 32; ++i) a[i] = x[threadIdx.x + i * blockDim.x];
  y[threadIdx.x] = a[k & 31];
}
"""


def _bad_report(kernel: str, arch: str = "sm_90a"):
    target = TARGETS[arch]
    kernels = CudaKernels(BAD, lambda case, sms: [CudaLaunch(kernel, "", 4 * sms, 256)])
    case = Case("bad", (("rows", 4096), ("hidden", 4096)), dtype=torch.bfloat16)
    return cuda.inspect_case("bad", kernels, {}, case, target, target.sm_count)


def test_scalar_row_accesses_fail_the_vector_guard():
    (k,) = _bad_report("scalar_copy").kernels
    checks = guard.check_kernel(k)
    assert {s.check for s in checks} == {"vector"}
    assert any("LDG.16" in s.text for s in checks) and any("STG.16" in s.text for s in checks)
    assert any("no 128-bit global load at all" in s.text for s in checks)
    (narrow, *_) = [f for f in k.findings if f.code == "narrow-access"]
    assert narrow.severity == "warn" and "y[i] = x[i];" in narrow.text


def test_local_memory_fails_the_spill_guard():
    (k,) = _bad_report("local_array").kernels
    assert k.mix.local, "the run-time indexed array should live in local memory"
    assert "spill" in {s.check for s in guard.check_kernel(k)}
    assert any(f.code == "spill" for f in k.findings)


def test_a_missing_kernel_and_a_compile_error_are_held():
    (k,) = _bad_report("no_such_kernel").kernels
    assert "no kernel no_such_kernel" in k.error and "scalar_copy" in k.error
    assert [s.check for s in guard.check_kernel(k)] == ["compile"]
    target = TARGETS["sm_80"]
    broken = CudaKernels("__global__ void f(float* x) { x[0] = undefined_name; }\n",
                         lambda case, sms: [CudaLaunch("f")])
    case = Case("broken", (("rows", 1), ("hidden", 16)), dtype=torch.float32)
    report = cuda.inspect_case("broken", broken, {}, case, target, 108)
    assert "undefined_name" in report.kernels[0].error
    assert report.kernels[0].findings[0].code == "compile-error"


# --- pieces ---------------------------------------------------------------------------------

def test_split_name_reads_kernel_and_template_arguments():
    assert cuda_compile.split_name("void speedlight::(anonymous namespace)::rms_norm_bwd_kernel"
                           "<__nv_bfloat16, true>(__nv_bfloat16 const*, long)") == \
        ("rms_norm_bwd_kernel", "__nv_bfloat16, true")
    assert cuda_compile.split_name("scalar_copy(__nv_bfloat16 const*, __nv_bfloat16*, long)") == \
        ("scalar_copy", "")
    assert cuda_compile.split_name("void ns::k<ns::Vec<float, 4>, 2>(float*)") == \
        ("k", "ns::Vec<float, 4>, 2")
    assert cuda_compile.split_name("(anonymous namespace)::k(float*)") == ("k", "")


def test_scalar_lines_cover_a_marked_line_or_the_block_it_opens():
    lines = ["a;", "for (;;) {  // speedlight: scalar", "  b;", "  { c; }", "}", "d;",
             "e;  // speedlight: scalar"]
    assert cuda.scalar_lines(lines) == {2, 3, 4, 5, 7}


def test_parse_ptxas_reads_each_function():
    log = """ptxas info    : Compiling entry function '_Z1fPf' for 'sm_90a'
ptxas info    : Function properties for _Z1fPf
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 128 bytes smem, 384 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1gv' for 'sm_90a'
ptxas info    : Used 8 registers, used 0 barriers
"""
    got = cuda_compile.parse_ptxas(log)
    assert got["_Z1fPf"] == {"registers": 64, "stack": 8, "spill_stores": 4, "spill_loads": 4,
                             "barriers": 1, "smem_static": 128, "cmem0": 384}
    assert got["_Z1gv"]["registers"] == 8 and got["_Z1gv"]["spill_stores"] == 0


def test_binaries_are_cached_by_source_and_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    src = "__global__ void k(float4* x) { x[threadIdx.x] = make_float4(1, 2, 3, 4); }\n"
    first = cuda_compile.compile_source(src, 80)
    again = cuda_compile.compile_source(src, 80)
    assert not first.cached and again.cached and again.folder == first.folder
    assert first.folder.parent == tmp_path / "inspect-cuda"
    assert cuda_compile.compile_source(src + "// changed\n", 80).folder != first.folder
    (fn,) = again.functions.values()
    assert fn.base == "k" and sass_widths(fn) == {128}


def sass_widths(fn) -> set[int]:
    from speedlight.inspect import sass

    return set(sass.mix(fn.instrs).global_stores)


def test_impl_cuda_on_an_op_without_cuda_kernels_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="softmax declare"):
        cli.main(["inspect", "softmax", "--impl", "cuda", "--out", str(tmp_path)])



def test_a_spec_file_with_its_own_cuda_kernel_is_inspected_and_checked(tmp_path, capsys):
    spec = str(Path(__file__).resolve().parent / "cuda_spec.py")
    code = cli.main(["inspect", "--spec", spec, "--only-spec", "--target", "sm_80", "--check",
                     "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = results.read_jsonl(tmp_path / "inspect.jsonl")
    assert [(r["op"], r["kernel"]) for r in rows] == [("scale", "scale_rows<__nv_bfloat16>")]
    assert rows[0]["sass"]["global_loads"] == {"128": rows[0]["sass"]["global_loads"]["128"]}
    assert rows[0]["grid"] == 8 * 108 and rows[0]["target"] == "sm_80"
    with pytest.raises(SystemExit, match="scale run.s. CUDA C.. kernels, not Triton ones"):
        cli.main(["inspect", "--spec", spec, "--only-spec", "--impl", "triton",
                  "--out", str(tmp_path)])


def test_all_with_impl_cuda_summarises_every_case_of_the_ops_with_cuda_kernels(tmp_path,
                                                                             capsys):
    code = cli.main(["inspect", "--all", "--impl", "cuda", "--target", "sm_80", "--check",
                     "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "speedlight inspect for sm_80" in out and "(CUDA C++)" in out
    rows = results.read_jsonl(tmp_path / "inspect.jsonl")
    assert {r["op"] for r in rows} == {"rms_norm", "add_rms_norm"}
    assert len({r["case_id"] for r in rows}) > 6
