"""AMD Instinct targets: the datasheets, --target gfx942 / mi300x resolved like every
other target, the GPU in use recognised on a ROCm build of torch (stand-ins for
torch.version.hip and the device's properties), and the one inspect flow reading AMDGCN:
resources, occupancy against the compiler's own figure, the instruction mix, global
accesses tied to their source lines, and a compiler error reported as a finding; the AMD
tuning knobs reaching the compile."""

from types import SimpleNamespace

import pytest
import torch

from speedlight import hardware, registry
from speedlight.inspect import amdgcn, guard
from speedlight.inspect.run import inspect_cases, inspect_cuda_cases
from speedlight.spec import Case
from speedlight.target import TargetError, resolve


@pytest.mark.parametrize("key,gfx,cus", [("mi300x", "gfx942", 304), ("mi355x", "gfx950", 256)])
def test_amd_skus_are_cited_and_resolve_by_sku_and_arch(key, gfx, cus, monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    d = hardware.DEVICES[key]
    for field in ("peak_flops", "dram_bandwidth", "sm_count", "l2_bytes", "l3_bytes", "smem"):
        assert d.sources.get(field), f"{key}: no source for {field}"
    assert d.peak("fp8") == pytest.approx(2 * d.peak("bf16"), rel=1e-4) and d.warp_size == 64 and d.vendor == "amd"
    for name in (key, gfx):
        t = resolve(name)
        assert (t.sku.key, t.arch, t.arch_name, t.sm_count) == (key, gfx, gfx, cus)
        assert t.vendor == "amd" and t.warp_size == 64 and "CUs" in t.describe()
        assert t.limits.lds_per_cu == d.smem_per_sm and t.roof.source == "datasheet"


def test_an_nvidia_sku_does_not_size_an_amd_arch():
    with pytest.raises(TargetError, match="does not run gfx942"):
        resolve("gfx942", sku="h200")
    with pytest.raises(TargetError, match="gfx942, gfx950"):
        resolve("gfx90a")


def _pretend_rocm(monkeypatch, name, gcn, cus):
    props = SimpleNamespace(name=name, major=9, minor=4, multi_processor_count=cus,
                            total_memory=192 * 2**30, L2_cache_size=4 * 2**20,
                            gcnArchName=gcn, warp_size=64)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)


@pytest.mark.parametrize("name,cus,key", [
    pytest.param("AMD Instinct MI300X", 304, "mi300x", id="named"),
    pytest.param("", 304, "mi300x", id="unnamed-flagship"),
    pytest.param("AMD Instinct MI325X", 304, "amd-instinct-mi325x", id="no-datasheet")])
def test_the_rocm_gpu_in_use_is_recognised(name, cus, key, monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    _pretend_rocm(monkeypatch, name, "gfx942:sramecc+:xnack-", cus)
    t = resolve(None, None, "cuda")
    assert (t.sku.key, t.arch, t.vendor, t.in_use) == (key, "gfx942", "amd", True)


def test_the_cuda_implementation_is_refused_by_name_on_rocm(monkeypatch):
    from speedlight.csrc import loader

    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    why = loader.unavailable("cuda")
    assert "CUDA C++" in why and "ROCm" in why and "impl='triton'" in why


def test_occupancy_follows_the_cu_limits():
    limits = hardware.AMD_ARCH_LIMITS["gfx942"]
    full = amdgcn.occupancy(limits, 4, vgprs=14, sgprs=21, lds=0)
    assert (full.per_simd, full.fraction, full.limiter) == (8, 1.0, "waves")
    # 129 VGPRs allocate 136 of 512: 3 waves per SIMD
    regs = amdgcn.occupancy(limits, 4, vgprs=129, sgprs=21, lds=0)
    assert (regs.per_simd, regs.limiter) == (3, "VGPRs")
    # 40 KB of LDS: one workgroup of 4 waves per CU, one wave per SIMD
    lds = amdgcn.occupancy(limits, 4, vgprs=14, sgprs=21, lds=40 * 1024)
    assert (lds.blocks_per_sm, lds.per_simd, lds.limiter) == (1, 1, "LDS")
    assert amdgcn.occupancy(limits, 4, vgprs=14, sgprs=21, lds=65 * 1024).blocks_per_sm == 0


def test_amdgcn_lines_and_widths_are_read():
    listing = "\n".join([
        '\t.file\t1 "/src" "k.py"', "\t.loc\t1 7 3", "\tglobal_load_dwordx4 v[0:3], v[4:5], off",
        "\tbuffer_load_ushort v6, v7, s[0:3], 0 offen", "\t.loc\t1 9 1",
        "\tv_mfma_f32_32x32x8_bf16 a[0:15], v[0:1], v[2:3], a[0:15]",
        "\tds_read_b128 v[8:11], v12", "\tscratch_store_dword off, v1, s0",
        "\tglobal_store_short v[4:5], v6, off", "\ts_endpgm", "\t.loc\t1 11 1",
        "\tglobal_store_dwordx2 v[4:5], v[6:7], off", ".Lfunc_end0:", "\tglobal_load_dword v0"])
    instrs = amdgcn.parse(listing)
    m = amdgcn.mix(instrs)
    assert dict(m.global_loads) == {128: 1, 16: 1} and dict(m.global_stores) == {16: 1, 64: 1}
    assert m.tensor_core == {"MFMA": 1} and dict(m.shared) == {"ds_read_b128": 1}
    assert dict(m.local) == {"scratch_store": 1}
    by_line = amdgcn.accesses_by_line(instrs)
    assert set(by_line) == {("/src/k.py", 7, "load"), ("/src/k.py", 9, "store"),
                            ("/src/k.py", 11, "store")}
    assert by_line[("/src/k.py", 7, "load")].describe() == "global_load.128 x1, global_load.16 x1"


def _spec(name):
    return next(s for s in registry.builtin_specs() if s.name == name)


def test_inspect_reads_gfx942_kernels_through_the_one_flow(compiler):
    spec = _spec("rms_norm")
    case = next(c for c in spec.cases("model") if guard.aligned(spec, c)).with_(
        dtype=torch.bfloat16)
    target = resolve("gfx942")
    (report,) = inspect_cases([(spec, case)], target, compiler=compiler, mode="dry")
    assert report.kernels and not report.error
    for k in report.kernels:
        res = k.compiled.resources
        assert k.ok and k.warp_size == 64 and k.registers == res["vgprs"] > 0
        assert k.occupancy.per_simd == res["compiler_occupancy"] or k.num_warps > 4
        assert k.waves.sms == 304 and k.mix.global_loads
        assert any(a.sass and a.sass.widest == 128 for a in k.accesses if a.kind == "load")
        assert not [s for s in guard.check_kernel(k) if s.check in ("compile", "spill")]
    (cuda,) = inspect_cuda_cases([(spec, case)], target)
    assert "do not compile for gfx942" in cuda.error


def test_a_kernel_that_does_not_compile_for_gfx942_is_a_finding(compiler):
    """A load through tl.where between two arguments' pointers compiles for NVIDIA but not
    for gfx942 with Triton 3.6 (the AMD pointer canonicalisation fails; rope's kernel was
    written without it): inspect reports the compiler's error as the case's finding, and
    the guard as a compile shortfall, instead of crashing."""
    from tests.inspect.kernels import PICK

    case = PICK.cases("quick")[0]
    (report,) = inspect_cases([(PICK, case)], resolve("gfx942"), compiler=compiler,
                              mode="dry", backward=False)
    (k,) = report.kernels
    assert not k.ok and "PassManager::run failed" in k.compiled.error
    (error,) = [f for f in report.all_findings if f.code == "compile-error"]
    assert error.text.startswith("_pick_kernel did not compile for gfx942: RuntimeError")
    assert [s.check for s in guard.check_report(report)] == ["compile"]


def test_launches_sized_for_an_amd_target_use_waves_of_64():
    from speedlight import launch

    cpu = torch.device("cpu")
    with launch.for_target(resolve("h200")):
        assert (launch.planned_warp_size(cpu), launch.warps_for_tile(4096)) == (32, 8)
    with launch.for_target(resolve("gfx942")):
        assert (launch.planned_warp_size(cpu), launch.warps_for_tile(4096)) == (64, 4)
        assert launch.target_programs(cpu) == 4 * 304  # persistent grids over the CUs
        grid, block_m, block_n, warps = launch.persistent_row_grid(
            10**6, 16384, cpu, max_block_n=65536, tile=16384, warps_per_sm=64)
        assert (block_n, warps) == (16384, 16) and grid == (2 * 304,)  # 32 waves per CU


def test_the_amd_tuning_knobs_reach_the_compile(compiler):
    """waves_per_eu, matrix_instr_nonkdim and kpack are points of the GEMMs' space on an
    AMD target only; a forced configuration that sets them is compiled with them (read back
    from the compiled kernel's metadata), as tune's candidates are."""
    from speedlight import launch
    from speedlight.ops import _gemm as gemm, matmul
    from speedlight.spec import Case

    configs = matmul.MATMUL_CONFIGS
    assert configs.space_for(90) == gemm.CONFIG_SPACE == configs.space
    space = configs.space_for("gfx942")
    assert set(space) - set(gemm.CONFIG_SPACE) == {"waves_per_eu", "matrix_instr_nonkdim", "kpack"}
    assert configs.space_for("gfx950")["kpack"] == (1,)  # Triton resets kpack to 1 there
    target, cpu = resolve("gfx942"), torch.device("cpu")
    with launch.for_target(target):
        rule = gemm.launch_config(128, 128, 128, torch.bfloat16, cpu).as_config()
    assert set(rule) == set(space) and rule["waves_per_eu"] == 0
    with launch.for_target(resolve("h200")):  # a CUDA launch is never given them
        assert set(gemm.launch_config(128, 128, 128, torch.bfloat16, cpu).as_config()) == \
            set(gemm.CONFIG_SPACE)
    forced = dict(rule, num_stages=2, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)
    case = Case("matmul", {"m": 128, "n": 128, "k": 128}, dtype=torch.bfloat16,
                flags={"linear": True})
    with launch.forcing("matmul", forced) as asked:
        (report,) = inspect_cases([(matmul.SPEC, case)], target, compiler=compiler,
                                  mode="dry", backward=False)
    assert asked and not report.error
    (k,) = report.kernels
    assert k.ok, k.compiled.error
    meta = k.compiled.meta
    assert (meta["waves_per_eu"], meta["matrix_instr_nonkdim"], meta["kpack"]) == (2, 16, 2)
    assert k.to_json()["hip_options"] == {"waves_per_eu": 2, "matrix_instr_nonkdim": 16,
                                          "kpack": 2}  # what inspect's JSON rows say
    assert k.mix.tensor_core.get("MFMA")
    assert any("16x16" in line for line in k.compiled.text("amdgcn").splitlines()
               if "v_mfma" in line)  # the 16x16 MFMA the knob asked for


def test_a_rounding_leak_is_read_from_amdgcn(compiler):
    """gfx942 contracts `p - mean(p)` at one column as sm_90a does (v_mul_f32 v9, v1, v7;
    v_fma_f32 v10, v1, v7, -v9): the finding names it there too, and LayerNorm's rounded
    products (hidden 1) compile without it."""
    from tests.inspect.kernels import CENTER

    listing = "\n".join(['\t.file\t1 "/src" "k.py"', "\t.loc\t1 7 3",
                         "\tv_mul_f32_e32 v9, v1, v7", "\tv_fma_f32 v10, v1, v7, -v9 clamp",
                         "\tglobal_load_dwordx2 v[9:10], v[4:5], off",
                         "\tv_fma_f32 v11, v1, v7, -v9"])
    assert amdgcn.mix(amdgcn.parse(listing)).rounding_leaks == [("/src/k.py", 7)]
    layer_norm = _spec("layer_norm")
    items = [(CENTER, CENTER.cases("quick")[0]),
             (layer_norm, Case("layer_norm", {"rows": 1, "hidden": 1}, dtype=torch.float32))]
    center, norm = inspect_cases(items, resolve("gfx942"), compiler=compiler, mode="dry")
    (leak,) = [f for f in center.all_findings if f.code == "rounding-leak"]
    assert leak.kernel == "_center_kernel"
    assert norm.kernels and not [f for f in norm.all_findings if f.code == "rounding-leak"]
