"""speedlight.launch: the launch context (the GPU a launch is sized for, forced and tuned
configurations), and the launches a run made."""

from types import SimpleNamespace

import pytest
import torch

from speedlight import launch, tuning
from speedlight.verify.harness import LaunchCounter
from tests.conftest import gpu_target


def test_for_target_sets_the_planned_sm_count():
    assert launch.planned_sm_count("cpu") is None  # the interpreter's own sizing
    with launch.for_target(gpu_target(132)):
        assert launch.planned_sm_count("cpu") == 132
        with launch.for_target(gpu_target(8)):
            assert launch.planned_sm_count("cpu") == 8
        assert launch.planned_sm_count("cpu") == 132
    assert launch.planned_sm_count("cpu") is None


@pytest.mark.parametrize("name,arch", [("sm_100a", 100), ("h100", 90), ("mi300x", None)])
def test_planned_arch_is_the_targets_nvidia_compute_capability(name, arch):
    """What Blackwell-only paths (attention's TMA loads) ask: an int for an NVIDIA target,
    None for an AMD one (a gfx name, never compared with an int) and for the interpreter."""
    from speedlight.target import resolve

    assert launch.planned_arch("cpu") is None
    with launch.for_target(resolve(name)):
        assert launch.planned_arch("cpu") == arch


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "132"])
def test_for_target_rejects_what_is_not_an_sm_count(bad):
    with pytest.raises(ValueError, match="sm_count is a positive int"):
        with launch.for_target(gpu_target(bad)):
            pass


def test_config_prefers_a_tuned_entry():
    space = tuning.Configs("toy", {"num_warps": (1, 2, 4)}, default=lambda key: {"num_warps": 4})
    assert launch.config(space, (4096, "bf16")) == {"num_warps": 4}
    with launch.with_tuned("toy", {(4096, "bf16"): {"num_warps": 2}}):
        assert launch.config(space, (4096, "bf16")) == {"num_warps": 2}
        assert launch.config(space, (8, "bf16")) == {"num_warps": 4}


def test_a_forced_configuration_wins_and_records_what_was_asked():
    """tune's candidates: forced on one op (None: its rule, tuned entries ignored), each
    launch's (key, configuration) recorded; the enclosing context is back afterwards."""
    space = tuning.Configs("toy", {"num_warps": (1, 2, 4)}, default=lambda key: {"num_warps": 4})
    other = tuning.Configs("other", {"num_warps": (1, 8)}, default=lambda key: {"num_warps": 8})
    with launch.for_target(gpu_target(132)), launch.with_tuned("toy", {"k": {"num_warps": 2}}):
        with launch.forcing("toy", {"num_warps": 1}) as asked:
            assert launch.config(space, "k") == {"num_warps": 1}
            assert launch.config(other, "k") == {"num_warps": 8}  # another op: untouched
            assert launch.planned_sm_count("cpu") == 132  # the target is kept
        with launch.forcing("toy") as rule:
            assert launch.config(space, "k") == {"num_warps": 4}
        assert launch.config(space, "k") == {"num_warps": 2}
    assert asked == [("k", {"num_warps": 1})] and rule == [("k", {"num_warps": 4})]
    assert launch.current() == launch.LaunchContext()


def test_for_target_takes_a_target_and_entered_a_context():
    with pytest.raises(TypeError, match="speedlight.target.Target"):
        with launch.for_target(SimpleNamespace(sm_count=132)):
            pass
    with pytest.raises(TypeError, match="launch.LaunchContext"):
        with launch.entered(gpu_target(132)):
            pass
    with launch.for_target(gpu_target(132)):
        assert launch.launch_sku("cpu") == "h100-sxm"
        with launch.for_target(None):  # the device's own again
            assert launch.planned_sm_count("cpu") is None and launch.launch_sku("cpu") is None


def test_row_tile_follows_the_planned_gpu():
    assert launch.row_tile(4096, torch.device("cpu"), max_block_n=16384) == (16, 4096, 16)
    with launch.for_target(gpu_target(132)):
        assert launch.row_tile(4096, torch.device("cpu"), max_block_n=16384) == (1, 4096, 8)
    with pytest.raises(ValueError, match="row of 20000 does not fit one block of 16384"):
        launch.row_tile(20000, torch.device("cpu"), max_block_n=16384)


def test_watch_sees_extension_launches_nested_and_stops_after():
    calls = []
    kernel = launch.extension_kernel(lambda t: calls.append(t), "my_ext_kernel")
    counter = LaunchCounter()
    with launch.watch_launches() as outer:
        with counter.active():
            kernel(1)
            assert counter.count == 1  # counted as it happens
        kernel(2)
    kernel(3)  # nobody watching
    assert counter.kernels == ["my_ext_kernel"]
    assert outer == ["my_ext_kernel", "my_ext_kernel"] and calls == [1, 2, 3]


def test_cuda_row_launch_sizes_threads_by_vectors_and_grid_by_residency():
    # hidden 4096 bf16: 512 16-byte vectors, two per thread; blocks of 256 threads at 48
    # registers: 5 resident per SM
    assert launch.cuda_row_launch(4096, 4096, torch.bfloat16, 132) == (660, 256)
    assert launch.cuda_row_launch(4096, 8192, torch.bfloat16, 132) == (264, 512)
    assert launch.cuda_row_launch(4096, 4096, torch.float32, 132) == (264, 512)
    assert launch.cuda_row_launch(3, 4096, torch.bfloat16, 132) == (3, 256)  # never more than rows
    assert launch.cuda_row_launch(7, 5, torch.float16, 132) == (7, 64)  # at least 64 threads
    # the backward: 64 registers, and with a weight its hidden fp32 dw sums in shared memory
    assert launch.cuda_row_launch(4096, 4096, torch.bfloat16, 132, backward=True) == (528, 256)
    assert launch.cuda_row_launch(0, 64, torch.float16, 132, backward=True)[0] == 1
    assert launch.cuda_row_launch(4096, 16384, torch.bfloat16, 132, backward=True) == (132, 1024)
    assert launch.cuda_shared_dw_bytes(8192) == 32768
    assert launch.cuda_shared_dw_bytes(32768) == 0  # over 96 KB: summed in global memory
    assert launch.cuda_column_launch(4096) == (128, 256)
    with pytest.raises(ValueError, match="sm_count"):
        launch.cuda_row_launch(4, 4, torch.bfloat16, 0)
