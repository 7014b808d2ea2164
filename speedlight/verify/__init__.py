"""Correctness harness: every output and gradient against float64, judged by PyTorch's own
error in the same dtype."""

from speedlight.verify.compare import Check, Metrics, judge
from speedlight.verify.harness import (CaseResult, expand, poisoned_allocations, run, verify_case,
                                       verify_implementations)

__all__ = ["Check", "Metrics", "judge", "CaseResult", "expand", "poisoned_allocations", "run",
           "verify_case", "verify_implementations"]
