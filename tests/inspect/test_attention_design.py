"""Attention's kernels, compiled for sm_90a (no GPU needed) with the launches an H100 user
gets, meet their KernelDesign: wgmma (HGMMA) on bf16 operands, no spills, shared memory
within the SM's limit, the designed occupancy and pipeline depth; prefill (forward and the
three backward kernels at head dim 128, run under the interpreter so the bytes each
direction moves are counted and held to the cost model's) and decode (the split forward
and its combine)."""

import pytest
import torch

from speedlight.inspect import guard
from speedlight.inspect.run import inspect_cases
from speedlight.ops.attention import SPEC
from speedlight.spec import Case
from tests.inspect.conftest import GUARD_TABLE, TARGET


def _case(sq, sk, d, **flags):
    return Case("attention", (("batch", 1), ("heads", 2), ("kv_heads", 1), ("seq_q", sq),
                              ("seq_k", sk), ("dim", d)), dtype=torch.bfloat16, flags=flags)


@pytest.mark.parametrize("case,backward", [
    pytest.param(_case(256, 256, 128, causal=True), True, id="prefill-d128-fwd-bwd"),
    pytest.param(_case(1, 2048, 128, causal=True), False, id="decode-split-d128"),
])
def test_attention_kernels_compile_to_their_design(case, backward, compiler):
    reports = inspect_cases([(SPEC, case)], TARGET, compiler=compiler,
                            mode="run" if backward else "dry", backward=backward)
    short, names = [], set()
    for r in reports:
        for d in r.directions if backward else ():
            GUARD_TABLE.append(f"attention {d.direction} bytes {d.ratio:.4f}x the cost model's "
                               f"[{case.label}]")
            short += [f"{case.label}: {s}" for s in guard.check_direction(d)]
        for k in r.kernels:
            names.add(k.launch.kernel)
            GUARD_TABLE.append(f"attention {k.launch.kernel:34s} regs {k.registers:3d} "
                               f"spill {k.spill_stores:3d} occ {k.occupancy.fraction:4.0%}  "
                               f"[{case.label}]")
            short += [f"{case.label}: {s}" for s in guard.check_kernel(k)]
    want = {"_attention_fwd_kernel"}
    want |= ({"_attention_bwd_delta_kernel", "_attention_bwd_dkdv_kernel",
              "_attention_bwd_dq_kernel"} if backward else {"_attention_combine_kernel"})
    assert want <= names, f"kernels compiled: {sorted(names)}"
    if not backward:
        # a decode block holds 16 query rows; wgmma takes 64 rows per warpgroup, so the
        # forward's dots compile to mma.sync (HMMA) there by design: decode is bound by
        # reading K and V, not by the tensor cores
        decode_mma = [s for s in short if "mma: designed for HGMMA, SASS has HMMA" in s]
        assert decode_mma, "a 16-row decode block was expected to compile to HMMA"
        short = [s for s in short if s not in decode_mma]
    assert not short, "\n".join(short)
