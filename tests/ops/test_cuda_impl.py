"""CUDA C++ as a second implementation, on a machine without one: the loader's errors, impl
selection and forcing, the unverified label, and the CUDA implementation recorded as
skipped with the reason (never silently absent) in verify, bench and the example spec."""

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

import speedlight
from speedlight import cli, results
from speedlight.bench.baselines import Baselines
from speedlight.bench.runner import Bench, Settings
from speedlight.bench.timer import StopRule
from speedlight.csrc import loader
from speedlight.ops import add_rms_norm, registration, rms_norm, rms_norm_cuda
from speedlight.spec import Case, Implementation, cuda_implementation
from speedlight.verify.harness import verify_implementations
from tests.bench.toy_specs import TOY

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cuda_scaled_relu.py"
NO_CUDA_TORCH = pytest.mark.skipif(torch.version.cuda is not None and torch.cuda.is_available(),
                                   reason="a CUDA machine: the CPU-side reasons do not apply")


# --- the loader ------------------------------------------------------------------------------

@NO_CUDA_TORCH
def test_cuda_impl_on_cpu_torch_is_a_clear_error_before_any_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build, whatever this one is
    x = torch.randn(3, 8)
    for call in (lambda: speedlight.rms_norm(x, impl="cuda"),
                 lambda: speedlight.add_rms_norm(x, x, impl="cuda"),
                 lambda: loader.extension("rms_norm")):
        with pytest.raises(loader.CudaBuildError, match="needs a CUDA build of torch"):
            call()
    assert loader.BUILDS == {}  # nothing was built (nor at import)


def test_missing_compilers_are_named(monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CXX", "no-such-c++")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    missing = " ".join(loader.missing_compilers())
    assert "nvcc" in missing and "ninja" in missing and "no-such-c++" in missing
    # a CUDA torch on a GPU machine without them: the reason names them, nothing is built
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(loader.CudaBuildError, match="nvcc .*ninja"):
        loader.load("never_built", [ROOT / "speedlight" / "csrc" / "rms_norm.cu"])
    assert "never_built" not in loader.BUILDS


def test_a_launch_after_the_extension_loaded_asks_no_build_tool(monkeypatch):
    """The build tools are asked before the extension is loaded, never per launch (asking
    ninja is a subprocess: on an H200 it made every CUDA launch cost milliseconds)."""
    from speedlight.ops import rms_norm_cuda

    asked = []
    monkeypatch.setattr(loader, "missing_compilers", lambda: asked.append(1) or [])
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    x = type("CudaTensor", (), {"device": torch.device("cuda")})()
    monkeypatch.setattr(rms_norm_cuda, "_loaded", lambda: False)
    rms_norm_cuda.check_cuda(x)
    assert asked == [1]  # before the load: the tools are checked
    monkeypatch.setattr(rms_norm_cuda, "_loaded", lambda: True)
    for _ in range(3):
        rms_norm_cuda.check_cuda(x)
    assert asked == [1]  # after it: never again
    with pytest.raises(loader.CudaBuildError, match="CUDA tensors only"):
        rms_norm_cuda.check_cuda(torch.empty(1))  # a CPU tensor is still refused


def test_builds_are_cached_per_torch_cuda_and_arch_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SPEEDLIGHT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    d = loader.build_directory("rms_norm", arch="sm_90")
    assert d.parent.parent.parent == tmp_path / "speedlight"
    assert d.name == "rms_norm" and d.parent.name.endswith("-cuda12.8-sm_90")
    assert d.parent.name.startswith(f"torch{torch.__version__.replace('+', '_')}")


# --- implementations: selection, forcing, the unverified label --------------------------------

def test_triton_is_the_default_and_cuda_is_unverified_until_a_gpu_run():
    for op in (rms_norm.RMS_NORM, rms_norm.RMS_NORM_INPLACE, add_rms_norm.ADD_RMS_NORM):
        assert op.impls == ("triton", "cuda") and op.default == "triton"
        assert op.unverified == {"cuda"}
        with pytest.raises(ValueError, match="'cuda' is not verified on a GPU yet"):
            op.set_default("cuda")
    for spec in (rms_norm.SPEC, add_rms_norm.SPEC):
        cuda = spec.implementations["cuda"]
        assert (cuda.language, cuda.verified) == ("cuda", False)
        assert spec.label("triton") == "speedlight" and spec.label("cuda") == "speedlight-cuda"


def test_impl_is_checked_and_forces_the_implementation():
    x = torch.randn(3, 8)
    torch.testing.assert_close(speedlight.rms_norm(x, impl="triton"), speedlight.rms_norm(x))
    with pytest.raises(ValueError, match="impl must be None or one of 'triton', 'cuda', got 'cutlass'"):
        speedlight.rms_norm(x, impl="cutlass")
    with pytest.raises(TypeError, match="impl must be None or one of .triton., .cuda."):
        speedlight.add_rms_norm(x, x, impl=1)


def test_set_default_picks_what_a_plain_call_runs():
    ran = []

    def fwd_a(x: torch.Tensor) -> torch.Tensor:
        ran.append("a")
        return x.clone()

    def fwd_b(x: torch.Tensor) -> torch.Tensor:
        ran.append("b")
        return x.clone()

    op = registration.register_op("two_impls", forward={"a": fwd_a, "b": fwd_b},
                                  outputs=("y",), fake=registration.like,
                                  namespace="speedlight_test_cuda_impl")
    x = torch.ones(2)
    op(x), op(x, impl="b")
    op.set_default("b")
    op(x), op(x, impl="a")
    assert ran == ["a", "b", "b", "a"]
    with pytest.raises(ValueError, match="some, not all"):
        registration.register_op("all_unverified", forward={"a": fwd_a}, outputs=("y",),
                                 fake=registration.like, unverified=("a",),
                                 namespace="speedlight_test_cuda_impl")


# --- every tool names the implementation, and skips CUDA here with the reason ------------------

@NO_CUDA_TORCH
def test_verify_runs_each_implementation_and_skips_cuda_with_the_reason():
    case = Case("rms_norm", (("rows", 3), ("hidden", 8)))
    triton, cuda = verify_implementations(rms_norm.SPEC, case, "cpu")
    assert (triton.status, triton.impl, triton.label) == ("pass", "triton", "speedlight")
    assert (cuda.status, cuda.impl, cuda.label) == ("skip", "cuda", "speedlight-cuda")
    assert "CUDA" in cuda.reason
    row = cuda.to_row()
    assert row["implementation"] == "speedlight-cuda" and row["unverified"] is True
    assert row["language"] == "cuda" and row["reason"] == cuda.reason
    assert triton.to_row()["unverified"] is False


@NO_CUDA_TORCH
def test_bench_times_each_implementation_and_records_cuda_as_skipped():
    spec = dataclasses.replace(TOY, implementations={
        "triton": Implementation(TOY.impl), "cuda": cuda_implementation(TOY.impl, verified=False)})
    rule = StopRule(target_rse=0.5, min_samples=3, max_samples=5, time_cap_s=0.05,
                    warmup_calls=1, warmup_s=0.0)
    bench = Bench("cpu", Settings(rule=rule, modes=("fwd",)), Baselines(("torch-eager",)))
    rows = {r["implementation"]: r for r in bench.case_rows(spec, spec.cases("quick")[0])}
    assert set(rows) == {"speedlight", "speedlight-cuda", "torch-eager"}
    assert rows["speedlight"]["status"] == "ok" and rows["speedlight"]["impl"] == "triton"
    cuda = rows["speedlight-cuda"]
    assert cuda["status"] == "skip" and "CUDA" in cuda["reason"]
    assert (cuda["impl"], cuda["language"], cuda["unverified"]) == ("cuda", "cuda", True)
    assert cuda["speedup"]["speedlight"] is None  # withheld, with the reason
    skipped = bench.skip_rows(spec, spec.cases("quick")[0], "budget")
    assert {r["implementation"] for r in skipped} == {"speedlight", "speedlight-cuda",
                                                      "torch-eager"}


# --- a team's own CUDA kernel: the example spec ---------------------------------------------

@NO_CUDA_TORCH
def test_example_cuda_spec_verifies_as_skipped_with_the_reason(tmp_path, capsys):
    code = cli.main(["verify", "--spec", str(EXAMPLE), "--only-spec", "--dtypes", "bf16",
                     "--seeds", "1", "--out", str(tmp_path)])
    assert code == 0
    rows = results.read_jsonl(tmp_path / "verify.jsonl")
    assert rows and all(r["status"] == "skip" and r["language"] == "cuda" for r in rows)
    assert all("CUDA" in r["reason"] for r in rows)
    assert "SKIP" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="nvcc (the CUDA toolkit) is not installed")
def test_example_cuda_spec_inspects_and_holds_to_its_design(tmp_path):
    code = cli.main(["inspect", "--spec", str(EXAMPLE), "--only-spec", "--target", "sm_90a",
                     "--check", "--out", str(tmp_path)])
    assert code == 0
    rows = results.read_jsonl(tmp_path / "inspect.jsonl")
    kernels = {r.get("kernel") for r in rows if r["op"] == "scaled_relu"}
    # named as verify and bench name it: the op's only (first) implementation
    assert {(r["implementation"], r["impl"]) for r in rows} == {("speedlight", "cuda")}
    assert {"scaled_relu_kernel<__nv_bfloat16, false>",
            "scaled_relu_kernel<__nv_bfloat16, true>"} <= kernels


def test_cuda_row_launch_sizes_threads_by_vectors_and_grid_by_residency():
    # hidden 4096 bf16: 512 16-byte vectors, two per thread; blocks of 256 threads at 48
    # registers: 5 resident per SM
    assert rms_norm_cuda.cuda_row_launch(4096, 4096, torch.bfloat16, 132) == (660, 256)
    assert rms_norm_cuda.cuda_row_launch(4096, 8192, torch.bfloat16, 132) == (264, 512)
    assert rms_norm_cuda.cuda_row_launch(4096, 4096, torch.float32, 132) == (264, 512)
    assert rms_norm_cuda.cuda_row_launch(3, 4096, torch.bfloat16, 132) == (3, 256)  # never more than rows
    assert rms_norm_cuda.cuda_row_launch(7, 5, torch.float16, 132) == (7, 64)  # at least 64 threads
    # the backward: 64 registers, and with a weight its hidden fp32 dw sums in shared memory
    assert rms_norm_cuda.cuda_row_launch(4096, 4096, torch.bfloat16, 132, backward=True) == (528, 256)
    assert rms_norm_cuda.cuda_row_launch(0, 64, torch.float16, 132, backward=True)[0] == 1
    assert rms_norm_cuda.cuda_row_launch(4096, 16384, torch.bfloat16, 132, backward=True) == (132, 1024)
    assert rms_norm_cuda.cuda_shared_dw_bytes(8192) == 32768
    assert rms_norm_cuda.cuda_shared_dw_bytes(32768) == 0  # over 96 KB: summed in global memory
    assert rms_norm_cuda.cuda_column_launch(4096) == (128, 256)
    with pytest.raises(ValueError, match="sm_count"):
        rms_norm_cuda.cuda_row_launch(4, 4, torch.bfloat16, 0)
