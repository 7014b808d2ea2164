"""The fp8 GEMM baselines (bench/gemm_baselines.py) and the fp8 section of
scripts/gpu-check.sh, as far as a CPU can check them: which cases get the baselines, why
they are unavailable here, and which cases the section benches."""

import re
from pathlib import Path

import torch

from speedlight import registry
from speedlight.bench import gemm_baselines
from speedlight.bench.baselines import Baselines
from speedlight.ops import matmul
from speedlight.spec import Case

ROOT = Path(__file__).resolve().parents[2]
FP8 = torch.float8_e4m3fn


def _names(spec, case):
    inputs = spec.make_inputs(case, "cpu")
    names = ("torch-eager", *gemm_baselines.NAMES)
    return {i.name: i for i in Baselines(names).for_case(spec, case, inputs, "cpu")}


def test_fp8_matmul_gets_both_baselines_unavailable_on_a_cpu_with_the_reason():
    case = Case("matmul", {"m": 17, "n": 48, "k": 32}, dtype=FP8, flags={"linear": True})
    impls = _names(matmul.SPEC, case)
    for name in gemm_baselines.NAMES:
        assert not impls[name].available
        assert "GPU only" in impls[name].reason


def test_other_dtypes_and_ops_get_no_fp8_baseline_row():
    bf16 = Case("matmul", {"m": 17, "n": 48, "k": 32}, dtype=torch.bfloat16,
                flags={"linear": True})
    assert not set(gemm_baselines.NAMES) & set(_names(matmul.SPEC, bf16))
    softmax = registry.builtin_specs()[[s.name for s in registry.builtin_specs()].index("softmax")]
    case = softmax.cases("quick")[0]
    assert not set(gemm_baselines.NAMES) & set(_names(softmax, case))


def test_gpu_check_fp8_section_benches_llama3_8b_projections_at_4096_tokens():
    script = (ROOT / "scripts" / "gpu-check.sh").read_text()
    default = re.search(r'FP8_CASES="\$\{FP8_CASES:-(.*)\}"', script).group(1)
    pattern = re.compile(default.replace("\\$", "$"))
    ids = [c.with_(dtype=FP8).id for c in matmul.SPEC.cases("model")]
    picked = sorted(i for i in ids if pattern.search(i))
    # Llama-3-8B: qkv (32 + 2 x 8 heads of 128), o, up/gate, down
    assert picked == sorted(f"matmul-m4096-n{n}-k{k}-fp8-linear-proj{p}" for p, n, k in (
        ("qkv", 6144, 4096), ("o", 4096, 4096), ("up", 14336, 4096), ("down", 4096, 14336)))
    for case in matmul.SPEC.cases("model"):
        if pattern.search(case.with_(dtype=FP8).id):
            assert matmul.SPEC.skip(case.with_(dtype=FP8), torch.device("cuda")) is None


def test_the_fp8_sections_bench_command_on_a_cpu_sized_case(tmp_path, capsys):
    """The bench command the fp8 section runs (its baselines, --dtypes fp8, forward), on a
    quick case a CPU can run: speedlight's row timed and verified, torch-eager timed, the
    two cuBLAS baselines unavailable with the reason."""
    from speedlight import cli, results

    code = cli.main(["bench", "--device", "cpu", "--suite", "quick", "--ops", "matmul",
                     "--dtypes", "fp8", "--cases", "m17-n48-k32", "--modes", "fwd",
                     "--baselines", "torch-eager,torch-scaled-mm,cublas-bf16",
                     "--time-cap", "0.01", "--max-samples", "3", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    rows = {r["implementation"]: r for r in results.read_jsonl(tmp_path / "bench.jsonl")}
    assert rows["speedlight"]["status"] == "ok" and rows["speedlight"]["verified"]
    assert rows["speedlight"]["case"]["dtype"] == "fp8"
    assert rows["torch-eager"]["status"] == "ok"
    for name in gemm_baselines.NAMES:
        assert rows[name]["status"] == "unavailable" and "GPU only" in rows[name]["reason"]
