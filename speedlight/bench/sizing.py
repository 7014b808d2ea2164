"""How much of the device a bench case may use: whether it runs here at all, and how many
copies of its inputs the samples rotate among (so that no sample reads a warm L2)."""

from __future__ import annotations

import math

import torch

from speedlight.bench.timer import l2_bytes
from speedlight.spec import Case, Cost, OpSpec, dtype_name

MiB, GiB = 2 ** 20, 2 ** 30


def mode_cost(spec: OpSpec, case: Case, mode: str) -> Cost | None:
    """The Cost of one mode (fwd, bwd, fwd+bwd); None when the op has no backward."""
    if mode == "fwd":
        return spec.cost(case, "fwd")
    bwd = spec.cost(case, "bwd") if spec.grad_inputs else None
    if bwd is None:
        return None
    return bwd if mode == "bwd" else spec.cost(case, "fwd") + bwd


def input_bytes(spec: OpSpec, case: Case) -> int:
    """The bytes of the tensors spec.make_inputs(case) builds (on the meta device: nothing
    is allocated)."""
    made = spec.make_inputs(case, torch.device("meta"))
    values = made.values() if isinstance(made, dict) else made
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class CaseSizing:
    """Memory budgets of a bench run on one device (bench Settings: max_bytes,
    cpu_max_bytes, max_copies)."""

    def __init__(self, device: torch.device, settings):
        self.device = device
        self.settings = settings

    def max_bytes(self) -> int:
        if self.settings.max_bytes is not None:
            return self.settings.max_bytes
        if self.device.type == "cuda":
            # free memory, plus what torch's allocator holds cached but unused
            free = torch.cuda.mem_get_info(self.device)[0]
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            return (free + cached) // 2
        return 8 * GiB

    def skip_reason(self, spec: OpSpec, case: Case) -> str | None:
        if case.dtype not in spec.dtypes:
            return f"{spec.name} does not support {dtype_name(case.dtype)}"
        reason = spec.skip(case, self.device)
        if reason:
            return reason
        fwd = spec.cost(case, "fwd")
        if fwd.bytes == 0:
            return "empty input: nothing to time"
        if self.device.type == "cpu" and fwd.bytes > self.settings.cpu_max_bytes:
            return (f"too large for the Triton interpreter on CPU ({fwd.bytes / MiB:.1f} MiB "
                    f"moved per forward, budget {self.settings.cpu_max_bytes / MiB:g} MiB: "
                    f"--cpu-max-mib); it runs on a GPU")
        need = self._bytes_needed(spec, case, 1)
        if need > self.max_bytes():
            return (f"needs ~{need / GiB:.1f} GiB, over the {self.max_bytes() / GiB:.1f} GiB "
                    f"budget (--max-gib)")
        return None

    def _bytes_needed(self, spec: OpSpec, case: Case, copies: int) -> int:
        """Inputs (copies + one pristine set), then outputs, gradients and a baseline's
        temporaries, taken as twice the inputs. The inputs are the tensors make_inputs
        builds, counted on the meta device, not the Cost's bytes: a Cost may count traffic
        (attention's K/V re-reads per query block) far beyond what is allocated, and
        bench once skipped attention at 8K tokens as needing 68 GiB on an H200. A case
        whose baseline needs more than this estimate is caught as out of memory."""
        inputs = input_bytes(spec, case)
        return inputs * (copies + 1) + 2 * inputs

    def copies_for(self, spec: OpSpec, case: Case) -> int:
        """Input sets to rotate among: enough to cover twice the L2 when one set fits in it."""
        one = spec.cost(case, "fwd").bytes
        l2 = l2_bytes(self.device)
        if one > l2:
            return 1
        n = min(self.settings.max_copies, math.ceil(2 * l2 / max(one, 1)))
        while n > 1 and self._bytes_needed(spec, case, n) > self.max_bytes():
            n -= 1
        return max(n, 1)
