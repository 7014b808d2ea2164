"""Attention's Gluon forward (impl="gluon"), compiled for sm_90a and sm_100a with no GPU
at the headline case (batch 2, 32 heads, 8 KV heads, 8192 tokens, head dim 128, causal):
its launches recorded dry (the Gluon kernel, then the Triton fault pass), its design held (wgmma or tcgen05, TMA loads, the warp roles
and the register reallocation to them, no spills, shared memory within the SM's), and how
inspect reads a warp-specialized kernel's roles from its TTGIR and SASS."""

import dataclasses

import pytest
import torch

from speedlight.inspect import guard
from speedlight.inspect.case_report import warp_roles
from speedlight.inspect.run import inspect_cases
from speedlight.kernels.attention import gluon_api
from speedlight.ops.attention import SPEC
from speedlight.spec import Case
from speedlight.target import resolve
from tests.inspect.conftest import GUARD_TABLE, TARGET

HEADLINE = Case("attention", (("batch", 2), ("heads", 32), ("kv_heads", 8), ("seq_q", 8192),
                              ("seq_k", 8192), ("dim", 128)), dtype=torch.bfloat16,
                flags={"causal": True})


@pytest.mark.skipif(gluon_api.missing() is not None, reason=str(gluon_api.missing()))
@pytest.mark.parametrize("arch, kernel, mma, workers", [
    pytest.param("sm_90a", "_attention_fwd_gluon_kernel", "HGMMA", [(4, 240), (1, 24)],
                 id="sm_90a"),
    pytest.param("sm_100a", "_attention_fwd_gluon_sm100_kernel", "UTCHMMA",
                 [(4, 240), (1, 24), (1, 24)], id="sm_100a"),
])
def test_the_gluon_forward_compiles_to_its_design(arch, kernel, mma, workers, compiler):
    target = TARGET if arch == "sm_90a" else resolve(arch)
    gluon = dataclasses.replace(SPEC, impl=SPEC.implementations["gluon"].fn)
    [report] = inspect_cases([(gluon, HEADLINE)], target, compiler=compiler, mode="dry",
                             backward=False, impl="gluon")
    k, faults = report.kernels  # the forward, then the Triton fault pass that follows it
    assert faults.launch.kernel == "_attention_fwd_faults_kernel" and faults.ok
    GUARD_TABLE.append(f"attention {k.launch.kernel:34s} regs {k.registers:3d} spill "
                       f"{k.spill_stores:3d} occ {k.occupancy.fraction:4.0%}  [gluon {arch} "
                       f"{HEADLINE.label}]")
    assert report.impl == "gluon" and k.launch.kernel == kernel
    assert not guard.check_kernel(k), guard.check_kernel(k)
    assert k.partitions == workers and {24, 240} <= set(k.setmaxnreg)
    assert k.mix.tensor_core[mma] and k.mix.tma["UTMALDG"]
    assert k.num_warps == 12 and k.smem <= k.smem_limit and not k.spill_stores
    if arch == "sm_100a":
        assert k.compiled.meta["tmem_size"] == 512  # two S and two O tiles: 384 columns
    # a design it does not meet is reported: the roles are read, not assumed
    other = dataclasses.replace(k, design=dataclasses.replace(k.design,
                                                              partitions=((4, 232), (1, 40))))
    roles = [s for s in guard.check_kernel(other) if s.check == "roles"]
    assert len(roles) == 2 and "no register reallocation to [232, 40]" in str(roles[1])


def test_warp_roles_are_read_from_the_ttgir():
    ttgir = ("    ttg.warp_specialize(%a, %b) attributes {requestedRegisters = "
             "array<i32: 240, 24>}\n"
             "    partition0(%arg1: i32 loc(unknown)) num_warps(4) {\n"
             "    partition1(%arg1: i32 loc(unknown)) num_warps(1) {\n")
    assert warp_roles(ttgir) == [(4, 240), (1, 24)]
    assert warp_roles(ttgir.replace(" attributes {requestedRegisters = array<i32: 240, 24>}",
                                    "")) == [(4, None), (1, None)]
    assert warp_roles("tt.func @k() {\n  tt.return\n}") == []
