"""Attention's Gluon implementation (impl="gluon", ops/attention_gluon.py) on a CPU: it is
refused with the reason, never a default and run only by name, the launcher's rule of
which calls take the Gluon forward, the fault pass after it (its launch's layout, and the
Triton fault kernel run on that layout), and the feature check of
kernels/attention/gluon_api. Its kernel compiles for sm_90a in
tests/inspect/test_gluon_attention.py; it runs on a GPU only (scripts/gpu/attention_gluon.py
verifies it there)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import speedlight
from speedlight import launch, reference, target
from speedlight.inspect.launches import capture_case
from speedlight.kernels.attention import gluon_api
from speedlight.ops import attention_gluon, attention_launch
from speedlight.ops.attention import ATTENTION, SPEC
from speedlight.spec import Case
from speedlight.verify.harness import verify_implementations
from tests.helpers import seeded


def test_gluon_is_refused_on_a_cpu_with_the_reason():
    q = torch.randn(1, 2, 20, 32)
    with pytest.raises(attention_gluon.GluonUnavailable, match="only on an NVIDIA GPU"):
        speedlight.attention(q, q, q, causal=True, impl="gluon")
    with pytest.raises(ValueError, match="impl must be None or one of 'triton', 'gluon'"):
        speedlight.attention(q, q, q, impl="cuda")
    reason = SPEC.implementations["gluon"].unavailable(torch.device("cpu"))
    assert "Triton interpreter does not run them" in reason


def test_gluon_is_unverified_named_only_and_never_the_default():
    assert ATTENTION.impls == ("triton", "gluon") and ATTENTION.default == "triton"
    with pytest.raises(ValueError, match="not verified on a GPU"):
        ATTENTION.set_default("gluon")
    gluon = SPEC.implementations["gluon"]
    assert (gluon.language, gluon.verified, gluon.named_only) == ("gluon", False, True)
    assert list(SPEC.swept()) == ["triton"]
    assert list(SPEC.swept(["gluon"])) == list(SPEC.swept(["speedlight-gluon"])) == [
        "triton", "gluon"]
    case = Case("attention", (("batch", 1), ("heads", 2), ("kv_heads", 1), ("seq_q", 3),
                              ("seq_k", 3), ("dim", 32)), flags={"causal": True})
    assert [r.impl for r in verify_implementations(SPEC, case, "cpu")] == ["triton"]
    named = verify_implementations(SPEC, case, "cpu", named=("gluon",))
    assert [(r.impl, r.status) for r in named] == [("triton", "pass"), ("gluon", "skip")]
    assert "Gluon kernels run only on an NVIDIA GPU" in named[1].reason


def _meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("change, why", [
    pytest.param({}, None, id="headline"),
    pytest.param({"dtype": torch.float32}, "fp16 or bf16", id="fp32"),
    pytest.param({"dim": 16}, "head dims 32 to 256", id="dim16"),
    pytest.param({"seq_q": 16}, "decode", id="decode"),
    pytest.param({"splits": 2}, "split keys", id="splits"),
    pytest.param({"dim": 36}, "16-byte aligned", id="dim36-unaligned-rows"),
    pytest.param({"arch": "sm_100a"}, None, id="sm100"),
    pytest.param({"arch": "sm_100a", "dim": 256}, "head dims 32 to 128 on sm_100", id="sm100-d256"),
    pytest.param({"arch": "sm_80"}, "written for sm_90a and sm_100a", id="sm80"),
])
def test_which_calls_take_the_gluon_forward(change, why):
    dim, seq_q = change.get("dim", 128), change.get("seq_q", 1024)
    q = _meta((2, 8, seq_q, dim), change.get("dtype", torch.bfloat16))
    k = _meta((2, 2, 1024, dim), change.get("dtype", torch.bfloat16))
    with launch.for_target(target.resolve(change.get("arch", "sm_90a"))):
        got = attention_gluon.why_not_gluon(q, k, k, False, seq_q, change.get("splits"))
    assert (got is None) if why is None else why in got, got


def test_tiles_fit_shared_memory_and_keep_softcap_from_spilling():
    tiles = attention_gluon._tiles
    assert tiles(9, 128, False) == dict(BLOCK_N=128, BLOCK_D=128, STAGES=2)
    assert tiles(9, 128, True)["BLOCK_N"] == 64 and tiles(9, 256, True)["BLOCK_N"] == 32
    assert tiles(9, 96, False)["BLOCK_D"] == 128 and tiles(9, 20, False)["BLOCK_D"] == 32
    assert tiles(10, 128, True) == dict(BLOCK_N=64, BLOCK_D=128, STAGES=3)


@pytest.mark.parametrize("arch, rows", [pytest.param("sm_90a", 64, id="sm_90a"),
                                         pytest.param("sm_100a", 128, id="sm_100a")])
def test_the_fault_pass_reads_the_gluon_forwards_counts(arch, rows):
    """The Gluon forward is followed by the Triton fault kernel, which reads one count per
    consumer (rows query rows: a wgmma or tcgen05 tile) in the faults tensor the forward
    wrote: [batch, heads_q, 2 x m_blocks, 1], m_blocks the forward's programs a head."""
    gluon = dataclasses.replace(SPEC, impl=SPEC.implementations["gluon"].fn)
    case = Case("attention", (("batch", 2), ("heads", 4), ("kv_heads", 2), ("seq_q", 300),
                              ("seq_k", 300), ("dim", 64)), dtype=torch.bfloat16,
                flags={"causal": True})
    t = target.resolve(arch)
    with launch.for_target(t):
        capture = capture_case(gluon, case, "meta", arch=t.arch, mode="dry", backward=False)
    fwd, faults = capture.launches
    assert fwd.kernel.startswith("_attention_fwd_gluon")
    assert faults.kernel == "_attention_fwd_faults_kernel"
    m_blocks = fwd.arg("m_blocks").value
    assert m_blocks == -(-300 // (2 * rows))
    assert fwd.arg("faults_ptr").shape == faults.arg("faults_ptr").shape == (2, 4, 2 * m_blocks, 1)
    assert (faults.arg("main_block").value, faults.arg("main_blocks").value,
            faults.arg("splits").value) == (rows, 2 * m_blocks, 1)


def test_the_fault_pass_redoes_exactly_the_counted_consumer_rows(device):
    """The fault kernel on the Gluon forward's layout (sm_90a: counts of 64 rows, two per
    128-row program): a NaN of v at key 100 (causal, 160 tokens) spread by the forward's
    product to rows 64-99 that cannot see it; the counted consumers' rows come back as the
    float64 reference (rows 64-99 finite, NaN from row 100 on), every other row untouched
    (a count names 64 rows of one head)."""
    q, k, v = (seeded(s, device=device, seed=i) for i, s in enumerate(
        [(1, 2, 160, 16), (1, 1, 160, 16), (1, 1, 160, 16)]))
    v[0, 0, 100, 3] = float("nan")
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    rows = attention_gluon.BLOCK_M[attention_gluon.HOPPER] // attention_gluon.CONSUMERS
    m_blocks = -(-160 // attention_gluon.BLOCK_M[attention_gluon.HOPPER])
    faults = torch.zeros((1, 2, m_blocks * attention_gluon.CONSUMERS, 1), dtype=torch.int32,
                         device=device)
    o = torch.full_like(q, 5.0)  # what no count names must stay so
    lse = torch.full((1, 2, 160), 5.0, device=device)
    counted = {(0, 1), (0, 2), (1, 0)}  # (head, consumer): rows 64-127, 128-159; 0-63
    for h, c in counted:
        faults[0, h, c, 0] = 1
        o[0, h, c * rows:(c + 1) * rows] = float("nan")  # as the forward's product left them
    pb = attention_launch.Problem(q, k, None, None, None, None, True)
    attention_launch.launch_fwd_faults(pb, q, k, v, o, lse, faults, rows, 128, 16 ** -0.5,
                                       None, -1, 0)
    for h in range(2):
        for c in range(3):
            at = (0, h, slice(c * rows, (c + 1) * rows))
            if (h, c) not in counted:
                assert bool((o[at] == 5.0).all() and (lse[at] == 5.0).all()), (h, c)
                continue
            assert torch.equal(torch.isnan(o[at]), torch.isnan(want[at].to(o.dtype)))
            finite = torch.isfinite(o[at])
            torch.testing.assert_close(o[at][finite].double(), want[at][finite], rtol=1e-5,
                                       atol=1e-6)
    # the NaN's column from row 100 on in head 0 (the rows that see it), nowhere before
    assert bool(torch.isfinite(o[0, 0, 64:100]).all() and torch.isnan(o[0, 0, 100:, 3]).all())


def test_missing_names_what_this_triton_lacks(monkeypatch):
    assert gluon_api.missing() is None  # the tested Tritons (3.6 and later) have it all
    import triton.experimental.gluon.language.nvidia.hopper as hopper

    monkeypatch.delattr(hopper, "warpgroup_mma")
    assert "hopper.warpgroup_mma" in gluon_api.missing()
    monkeypatch.undo()
    import triton.experimental.gluon.language as gl

    old_style = types.FunctionType((lambda default_args, default_partition, worker_args: 0
                                    ).__code__, {}, "warp_specialize")
    monkeypatch.setattr(gl, "warp_specialize", old_style)
    assert "default_args, default_partition, worker_args" in gluon_api.missing()
