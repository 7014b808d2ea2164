"""The CPU runtime computes as a GPU does where the Triton interpreter of some version
would not (speedlight.runtime.use_interpreter)."""

import torch
import triton
import triton.language as tl

from tests.conftest import DEVICE


@triton.jit
def _first_program_writes_kernel(out_ptr, BLOCK: tl.constexpr):
    """out[pid * BLOCK + i] = i + 1 for the first program only: a mask splatted from a
    scalar condition (Triton 3.9's interpreter refused it as int32)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + pid * BLOCK + offs, (offs + 1).to(tl.float32), mask=pid == 0)
    tl.atomic_add(out_ptr + 2 * BLOCK + offs, 1.0, mask=pid == 1)


def test_a_mask_from_a_scalar_condition_masks_loads_stores_and_atomics():
    if DEVICE.type == "cpu":
        from speedlight.runtime import use_interpreter
        use_interpreter()
    out = torch.zeros(3 * 8, device=DEVICE)
    _first_program_writes_kernel[(2,)](out, BLOCK=8)
    want = torch.cat([torch.arange(1, 9.0), torch.zeros(8), torch.ones(8)])
    torch.testing.assert_close(out.cpu(), want)
