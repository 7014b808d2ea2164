"""speedlight.launch: the GPU a launch is sized for, and the launches a run made."""

import pytest
import torch

from speedlight import launch
from speedlight.verify.harness import LaunchCounter


def test_sized_for_sets_the_planned_sm_count():
    assert launch.planned_sm_count("cpu") is None  # the interpreter's own sizing
    with launch.sized_for(132):
        assert launch.planned_sm_count("cpu") == 132
        with launch.sized_for(8):
            assert launch.planned_sm_count("cpu") == 8
        assert launch.planned_sm_count("cpu") == 132
    assert launch.planned_sm_count("cpu") is None


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "132"])
def test_sized_for_rejects_what_is_not_an_sm_count(bad):
    with pytest.raises(ValueError, match="sm_count must be a positive int"):
        with launch.sized_for(bad):
            pass


def test_row_tile_follows_the_planned_gpu():
    assert launch.row_tile(4096, torch.device("cpu"), max_block_n=16384) == (16, 4096, 16)
    with launch.sized_for(132):
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
