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
