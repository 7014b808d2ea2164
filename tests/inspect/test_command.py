"""`speedlight inspect` end to end on the CPU: tables, JSON rows, dumps, --check, errors."""

from pathlib import Path

import pytest
import torch

from speedlight import cli, results
from speedlight.inspect.command import find_case
from speedlight.inspect.run import inspect_cases
from tests.inspect.conftest import TARGET
from speedlight.ops import rms_norm

ROOT = Path(__file__).resolve().parent.parent.parent
KERNELS = str(ROOT / "tests" / "inspect" / "kernels.py")


def test_a_misaligned_case_prints_the_finding_writes_rows_and_dumps(tmp_path, capsys):
    code = cli.main(["inspect", "rms_norm", "--case", "rows8-hidden4095", "--out", str(tmp_path),
                     "--dump", str(tmp_path / "dump")])
    assert code == 0
    out = capsys.readouterr().out
    assert "_rms_norm_fwd_kernel" in out and "row stride (4095 elements)" in out
    rows = results.read_jsonl(tmp_path / "inspect.jsonl")
    kernels = [r for r in rows if r["level"] == "kernel"]
    assert {r["kernel"] for r in kernels} == {"_rms_norm_fwd_kernel", "_rms_norm_bwd_kernel",
                                            "_column_sum_kernel"}
    fwd = next(r for r in kernels if r["direction"] == "fwd")
    assert fwd["target"] == "sm_90a" and fwd["sm_count"] == 132 and fwd["registers"] > 0
    assert {"device", "triton", "git", "timestamp"} <= set(fwd)
    assert any(f["code"] == "narrow-access" for f in fwd["findings"])
    assert fwd["sass"]["global_loads"] == {"16": fwd["sass"]["global_loads"]["16"]}
    (bytes_fwd,) = [r for r in rows if r["level"] == "bytes" and r["direction"] == "fwd"]
    assert bytes_fwd["compulsory_bytes"] == rms_norm.SPEC.cost(
        find_case(rms_norm.SPEC, "rows8-hidden4095", torch.bfloat16), "fwd").bytes
    dumped = sorted(p.suffix for p in (tmp_path / "dump").rglob("fwd0-*"))
    assert dumped == [".cubin", ".llir", ".ptx", ".sass", ".ttgir", ".ttir"]
    assert "LDG.E.U16" in next((tmp_path / "dump").rglob("fwd0-*.sass")).read_text()


def test_all_covers_every_op_of_a_spec_file_on_its_quick_suite(tmp_path, capsys):
    code = cli.main(["inspect", "--all", "--spec", str(ROOT / "examples" / "relu_squared.py"),
                     "--only-spec", "--target", "sm_80", "--out", str(tmp_path)])
    assert code == 0
    rows = results.read_jsonl(tmp_path / "inspect.jsonl")
    cases = {r["case_id"] for r in rows}
    assert len(cases) > 3 and {r["target"] for r in rows} == {"sm_80"}
    assert "speedlight inspect for sm_80" in capsys.readouterr().out


def test_check_fails_a_kernel_short_of_its_design(tmp_path, capsys):
    code = cli.main(["inspect", "spill", "--spec", KERNELS, "--only-spec", "--check",
                     "--dtype", "fp32", "--out", str(tmp_path)])
    assert code == 1
    assert "short of design" in capsys.readouterr().out


def test_native_without_a_gpu_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: native is valid here")
    with pytest.raises(SystemExit, match="native"):
        cli.main(["inspect", "rms_norm", "--target", "native", "--out", str(tmp_path)])


def test_unknown_target_and_unparseable_case_are_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="'hopper' is not a known GPU; --target takes SKUs"):
        cli.main(["inspect", "rms_norm", "--target", "hopper", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="names no hidden"):
        cli.main(["inspect", "rms_norm", "--case", "rows8", "--out", str(tmp_path)])


def test_find_case_reads_suite_ids_and_new_shapes():
    c = find_case(rms_norm.SPEC, "rms_norm-rows37-hidden128-fp16-strided", torch.bfloat16)
    assert c.layout == "strided" and c.dtype == torch.float16 and c["rows"] == 37
    new = find_case(rms_norm.SPEC, "rows4096-hidden4095-transposed-noweight", torch.bfloat16)
    assert new.shape == {"rows": 4096, "hidden": 4095} and new.layout == "transposed"
    assert new.flag("weight") is False and new.dtype == torch.bfloat16


def test_an_op_that_raises_is_reported_and_fails_the_run(tmp_path, capsys):
    spec = tmp_path / "broken.py"
    spec.write_text("import dataclasses\n"
                    "from tests.inspect.kernels import COPY\n"
                    "def broken(**kwargs):\n"
                    "    raise RuntimeError('the launcher gave up')\n"
                    "SPEC = dataclasses.replace(COPY, name='broken_copy', impl=broken)\n")
    code = cli.main(["inspect", "broken_copy", "--spec", str(spec), "--only-spec", "--check",
                     "--out", str(tmp_path)])
    assert code == 1
    out = capsys.readouterr().out
    assert "the launcher gave up" in out
    # --check: an error in inspecting the case, not a shortfall of its kernels' design
    assert "error inspecting broken_copy" in out and "short of design" not in out
    assert "1 could not be inspected (errors); 0 shortfall(s)" in out
    (row,) = results.read_jsonl(tmp_path / "inspect.jsonl")
    assert row["status"] == "error" and "RuntimeError" in row["reason"]


def test_the_default_case_is_a_model_at_4096_tokens():
    """Every op's default case is the first model it serves at 4096 tokens (attention: Llama
    3 8B's 32 query and 8 key-value heads of 128, causal), whatever its size."""
    from speedlight import registry, shapes
    from speedlight.inspect.command import REPRESENTATIVE_TOKENS, representative

    order = list(shapes.MODELS)
    for spec in registry.builtin_specs():
        case = representative(spec, torch.bfloat16)
        first = min((c.model for c in spec.cases("model") if c.model in order),
                    key=order.index)
        assert case.model == first, case.id
        # tokens: the case's rows, or its routed rows' tokens (an MoE's grouped GEMM)
        assert REPRESENTATIVE_TOKENS in (spec.rows(case), case.flag("tokens")), case.id
    attention = next(s for s in registry.builtin_specs() if s.name == "attention")
    case = representative(attention, torch.bfloat16)
    assert (case["heads"], case["kv_heads"], case["dim"], case["seq_q"]) == (32, 8, 128, 4096)
    assert case.flag("causal")


def test_dry_captures_a_real_size_case_on_meta_tensors():
    """Compiling needs a launch's arguments, not its run: Llama 3 8B's lm_head and loss at
    4096 tokens (a 1 GB weight, 4 TFLOP of matmuls on the host) are captured without data
    (seconds, where CPU tensors took over ten minutes), and a size the interpreter cannot
    run is not skipped in dry mode."""
    from speedlight import registry
    from speedlight.inspect.command import representative
    from speedlight.inspect.launches import capture_case
    from speedlight.launch import for_target

    for name in ("linear_cross_entropy", "attention"):
        spec = next(s for s in registry.builtin_specs() if s.name == name)
        case = representative(spec, torch.bfloat16)
        assert spec.skip(case, torch.device("cpu")), "expected a case too large to run here"
        with for_target(TARGET):
            capture = capture_case(spec, case, "meta", arch=90, mode="dry")
        assert capture.launches and not any(l.measured for l in capture.launches)
        assert {a.kind for l in capture.launches for a in l.args} >= {"tensor", "int"}
        if name == "attention":
            assert [l.kernel for l in capture.direction("bwd")] == [
                "_attention_bwd_delta_kernel", "_attention_bwd_dkdv_kernel",
                "_attention_bwd_dq_kernel", "_attention_bwd_faults_kernel"]
    (report,) = inspect_cases([(spec, case)], TARGET, mode="dry", backward=False,
                              smaller_case_bytes=False)  # attention's forward, compiled
    assert not report.skipped and not report.error and report.note.startswith("dry")
    assert [k.name for k in report.kernels] == ["_attention_fwd_kernel",
                                                "_attention_fwd_faults_kernel"]
    assert report.kernels[0].mix.tensor_core.get("HGMMA")


def test_a_case_not_run_measures_its_bytes_on_itself_halved():
    """A case too large for the interpreter takes its bytes from itself at a smaller size:
    its sizes halved together (same flags and proportions; heads and a head's dim kept)
    while it launches the same kernels. Softmax's looped kernel at a 128256-token
    vocabulary has no such size under SMALLER_CASE_BYTES (fewer rows than SMs split each
    row), nor a suite case: no bytes, rather than another kernel's."""
    from speedlight import registry
    from speedlight.inspect import run
    from speedlight.inspect.command import representative

    specs = {s.name: s for s in registry.builtin_specs()}
    for name in ("matmul", "attention"):
        spec = specs[name]
        case = representative(spec, torch.bfloat16)
        plan = run._plan(run._dry(spec, case, TARGET, True))
        smaller = next(run._halvings(spec, case, plan, TARGET, True))
        assert spec.cost(smaller, "fwd").bytes <= run.SMALLER_CASE_BYTES < spec.cost(
            case, "fwd").bytes
        assert (smaller.flags, smaller.dtype, smaller.layout) == (case.flags, case.dtype,
                                                                   case.layout)
        halved = {k: case[k] // v for k, v in smaller.params if case[k] != v}
        assert halved and len(set(halved.values())) == 1, smaller.label  # one factor for all
        assert all(v <= run.KEPT_PARAM for k, v in case.params if k not in halved)
    assert set(halved) == {"seq_q", "seq_k"}  # attention: Llama's heads, kv heads and dim kept
    softmax = specs["softmax"]
    case = representative(softmax, torch.bfloat16)
    capture = run._dry(softmax, case, TARGET, True)
    assert run.bytes_on_a_smaller_case(softmax, case, capture, TARGET, True) == []


class _NotCompiled:
    """A compiler that compiles nothing (the capture is what is tested)."""

    def compile(self, launches, target):
        from speedlight.inspect.compile import Compiled

        return {l.key(target.arch_name): Compiled(l.kernel, target, error="not compiled here")
                for l in launches}


def test_every_quick_case_of_every_op_is_captured_or_skipped_with_its_reason():
    """`inspect --all --check` on an unchanged tree: every case of the quick suite (non-finite
    inputs included, which a capture on meta tensors once failed) records its launches for
    sm_90a, or is skipped with its reason; none is an error."""
    from speedlight import registry

    items = [(s, c.with_(dtype=torch.bfloat16)) for s in registry.builtin_specs()
             for c in s.cases("quick")]
    reports = inspect_cases(items, TARGET, compiler=_NotCompiled(), mode="dry")
    assert len(reports) == len(items) > 200
    assert not [(r.op, r.case.label, r.error) for r in reports if r.error]
    # no launch: an empty input, said so (its row's status is no-launch, with the reason)
    silent = [(r.op, r.case.label, r.note) for r in reports
              if not (r.kernels or r.skipped or r.note.startswith("no Triton launch"))]
    assert not silent
    assert all(r.case.params and min(v for _, v in r.case.params) == 0
               for r in reports if not (r.kernels or r.skipped))
    nonfinite = [r for r in reports if r.case.flag("nonfinite")]
    assert len(nonfinite) >= 15 and all(r.kernels for r in nonfinite)
