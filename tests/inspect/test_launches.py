"""Capturing launches: the runtime's specialisation, exact byte counts, argument
attribution, and the run / sample / dry modes."""

import pytest
import torch
import triton
import triton.language as tl

from speedlight.inspect.launches import capture_case, interpreter_work
from speedlight.launch import for_target
from speedlight.ops import rms_norm
from speedlight.spec import Case
from tests.conftest import gpu_target
from tests.inspect.kernels import COPY


def copy_case(rows, cols, dtype=torch.bfloat16, **flags):
    return Case("copy", {"rows": rows, "cols": cols}, dtype=dtype, flags=flags)


def only(capture):
    assert len(capture.launches) == 1
    return capture.launches[0]


def test_specialisation_is_the_runtimes():
    launch = only(capture_case(COPY, copy_case(16, 4096), "cpu", arch=90))
    sig, attrs = launch.signature, launch.attrs
    assert sig["x_ptr"] == "*bf16" and sig["n_cols"] == "i32"
    assert sig["stride_xn"] == "constexpr"  # an int equal to 1 becomes a constexpr
    index = {a.name: (i,) for i, a in enumerate(launch.args)}
    for name in ("x_ptr", "y_ptr", "n_rows", "n_cols", "stride_xm", "stride_ym"):
        assert attrs[index[name]] == [["tt.divisibility", 16]], name
    assert launch.constexprs[index["stride_xn"]] == 1
    assert launch.constexprs[index["BLOCK_N"]] == 1024
    assert launch.num_warps == 4 and launch.options == {"num_warps": 4}


def test_unaligned_ints_and_pointers_are_not_specialised():
    launch = only(capture_case(COPY, copy_case(9, 4100, offset=3), "cpu", arch=90))
    index = {a.name: (i,) for i, a in enumerate(launch.args)}
    for name in ("x_ptr", "n_rows", "n_cols", "stride_xm"):  # 2-byte aligned view; 9; 4100
        assert launch.attrs.get(index[name], []) == [], name
    assert launch.arg("x_ptr").align == 2 and launch.arg("y_ptr").spec == "D"


@triton.jit(do_not_specialize=["n"])
def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_do_not_specialize_is_honoured():
    from speedlight.inspect.launches import Recorder, intercept

    x = torch.ones(16)
    with intercept(Recorder(arch=90)) as rec:
        _scale_kernel[(1,)](x, 1, BLOCK=16)
    assert rec.launches[0].signature["n"] == "i32"  # equal to 1, but not made a constexpr
    assert torch.equal(x, torch.tensor([2.0] + [1.0] * 15))


def test_bytes_are_counted_exactly_without_masked_lanes():
    case = copy_case(6, 1000)  # 1000 of each 1024-wide block are live
    capture = capture_case(COPY, case, "cpu", arch=90)
    launch = only(capture)
    assert launch.measured
    assert launch.loaded == 6 * 1000 * 2 and launch.stored == 6 * 1000 * 2
    (load,) = [s for s in launch.sites.values() if s.kind == "load"]
    assert load.arg == "x_ptr" and load.contiguous and load.row_bytes == 2048
    assert load.widest_bits == 128  # rows start 2000 bytes apart: all 16-byte aligned
    odd = only(capture_case(COPY, copy_case(6, 1001), "cpu", arch=90))
    (load,) = [s for s in odd.sites.values() if s.kind == "load"]
    assert load.align == 2 and load.widest_bits == 16  # 2002 bytes apart
    assert odd.loaded == 6 * 1001 * 2


def test_a_tensor_passed_twice_is_told_apart_by_the_source():
    # without a weight, rms_norm passes x again as the weight placeholder
    case = Case("rms_norm", {"rows": 4, "hidden": 256}, flags={"weight": False})
    capture = capture_case(rms_norm.SPEC, case, "cpu", arch=90, backward=False)
    args = {s.arg for s in only(capture).sites.values() if s.kind == "load"}
    assert args == {"x_ptr"}


def test_sample_mode_runs_a_few_programs_and_predicts_the_work():
    case = copy_case(40, 1024)  # 10 programs of 4 rows
    sample = only(capture_case(COPY, case, "cpu", arch=90, mode="sample"))
    assert not sample.measured
    assert sum(s.calls for s in sample.sites.values() if s.kind == "load") == 3  # 0, 1, 9
    assert interpreter_work(capture_case(COPY, case, "cpu", arch=90, mode="sample")) == 10


def test_dry_mode_records_and_runs_nothing():
    capture = capture_case(COPY, copy_case(8, 4096), "cpu", arch=90, mode="dry")
    launch = only(capture)
    assert launch.grid == (2, 4, 1) and not launch.sites and not launch.measured


def test_design_key_ignores_the_ints_the_runtime_specialises():
    a = only(capture_case(COPY, copy_case(16, 4096), "cpu", arch=90, mode="dry"))
    b = only(capture_case(COPY, copy_case(17, 4104), "cpu", arch=90, mode="dry"))
    assert a.design_key() == b.design_key() and a.key("sm_90a") != b.key("sm_90a")


def test_for_target_gives_the_gpu_launch_on_a_cpu():
    case = Case("rms_norm", {"rows": 600, "hidden": 4096}, dtype=torch.bfloat16)
    cpu = only(capture_case(rms_norm.SPEC, case, "cpu", arch=90, mode="dry", backward=False))
    with for_target(gpu_target(132)):
        gpu = only(capture_case(rms_norm.SPEC, case, "cpu", arch=90, mode="dry", backward=False))
    assert cpu.grid[0] <= 2
    # one-row tiles of 8 warps (16 values per lane), four persistent programs per SM (32
    # resident warps): rms_norm's launch rule at 4096 wide
    assert gpu.grid[0] == 4 * 132 and gpu.num_warps == 8
    assert dict(zip([a.name for a in gpu.args], [a.value for a in gpu.args]))["BLOCK_M"] == 1


def test_the_forward_without_its_backward_is_the_training_forward():
    """cross_entropy's forward writes dlogits when logits require grad; captured without
    the backward, the forward still does (its cost counts that write), and no backward
    launch is recorded."""
    from speedlight.ops import cross_entropy

    case = Case("cross_entropy", {"tokens": 8, "vocab": 256}, dtype=torch.bfloat16)
    capture = capture_case(cross_entropy.SPEC, case, "cpu", arch=90, backward=False)
    launch = only(capture)
    assert launch.direction == "fwd" and launch.arg("COMPUTE_GRAD").value is True
    assert {s.arg for s in launch.sites.values() if s.kind == "store"} >= {"dx_ptr"}
    assert launch.stored >= 8 * 256 * 2
    with_backward = capture_case(cross_entropy.SPEC, case, "cpu", arch=90, mode="dry")
    assert [l.direction for l in with_backward.launches] == ["fwd", "bwd"]


def test_for_target_rejects_nonsense():
    with pytest.raises(ValueError, match="sm_count"):
        with for_target(gpu_target(0)):
            pass
