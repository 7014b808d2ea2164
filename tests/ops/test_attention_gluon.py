"""Attention's Gluon implementation (impl="gluon", ops/attention_gluon.py) on a CPU: it is
refused with the reason, never a default and run only by name, the launcher's rule of
which calls take the Gluon forward, and the feature check of kernels/attention/gluon_api.
Its kernel compiles for sm_90a in tests/inspect/test_gluon_attention.py; it runs on a GPU
only (scripts/gpu/attention_gluon.py verifies it there)."""

from __future__ import annotations

import types

import pytest
import torch

import speedlight
from speedlight import launch, target
from speedlight.kernels.attention import gluon_api
from speedlight.ops import attention_gluon
from speedlight.ops.attention import ATTENTION, SPEC
from speedlight.spec import Case
from speedlight.verify.harness import verify_implementations


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
