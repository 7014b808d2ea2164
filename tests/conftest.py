"""Test set-up: without a GPU, kernels run on CPU tensors under the Triton interpreter,
which must be switched on before the first kernel module is imported."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"


@pytest.fixture
def device() -> torch.device:
    return DEVICE


def needs_gpu(reason: str):
    """Skip marker for checks that only mean something (or only fit) on a GPU."""
    return pytest.mark.skipif(not ON_GPU, reason=reason)
