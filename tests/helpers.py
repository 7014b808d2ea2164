"""Shared test helpers: run one verify case and assert its verdict, with the reason shown."""

from __future__ import annotations

import torch

from speedlight.spec import Case
from speedlight.verify import verify_case


def assert_verified(spec, case: Case, device) -> None:
    r = verify_case(spec, case, device)
    if r.status == "skip":
        import pytest
        pytest.skip(r.reason)
    assert r.status == "pass", f"{case.id}: {r.status}: {r.reason}"
    assert r.checks, "verify ran no checks"


def seeded(shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)
