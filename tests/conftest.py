"""Test set-up: without a GPU, kernels run on CPU tensors under the Triton interpreter,
which must be switched on before the first kernel module is imported."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Liger's fused MoE autotunes its kernels over many configs when it is imported, and
    # the interpreter has no driver to time them: one config each (Liger's own switch)
    os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "0")
    # one thread per test process (and its children): pytest-xdist runs a worker per core,
    # and torch's intra-op threads on tensors this small spin more than they compute
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"


@pytest.fixture
def device() -> torch.device:
    return DEVICE


def needs_gpu(reason: str):
    """Skip marker for checks that only mean something (or only fit) on a GPU."""
    return pytest.mark.skipif(not ON_GPU, reason=reason)


def gpu_target(sms: int = 132):
    """A target for `launch.for_target` in sizing tests: an H100 SXM (132 SMs), or a
    stand-in of it with `sms` SMs (a GPU speedlight has no datasheet of)."""
    import dataclasses

    from speedlight.target import resolve

    h100 = resolve("h100-sxm")
    if sms == h100.sku.sm_count:
        return h100
    return dataclasses.replace(h100, sku=dataclasses.replace(h100.sku, sm_count=sms))


# each test's CPU budget (tests/cpu_budget.py; the tests allowed more: tests/slow_tests.py)
pytest_plugins = ["tests.cpu_budget"]
