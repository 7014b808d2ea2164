"""Attention's own baselines: present for attention only, each unavailable on the CPU with
the reason, and SDPA turning down what it cannot express."""

import torch

from speedlight.bench import baselines
from speedlight.bench.command import _BASELINES
from speedlight.candidates import Unsupported
from speedlight.candidates import attention as attention_baselines
from speedlight.ops.attention import SPEC as ATTENTION
from speedlight.ops.softmax import SPEC as SOFTMAX


def test_the_command_offers_every_baseline():
    assert _BASELINES == baselines.BASELINES


def test_attention_gets_its_baselines_and_other_ops_do_not():
    b = baselines.Baselines(baselines.KNOWN)
    case = ATTENTION.cases("quick")[1]
    impls = {i.name: i for i in b.for_case(ATTENTION, case, ATTENTION.make_inputs(case, "cpu"),
                                           "cpu")}
    for name in attention_baselines.NAMES:
        assert not impls[name].available and "CUDA" in impls[name].reason, impls[name]
    case = SOFTMAX.cases("quick")[0]
    names = [i.name for i in b.for_case(SOFTMAX, case, SOFTMAX.make_inputs(case, "cpu"), "cpu")]
    assert not set(names) & set(attention_baselines.NAMES)


def _reason(name, **inputs):
    try:
        attention_baselines._sdpa(name, inputs)
    except Unsupported as e:
        return str(e)
    return None


def test_sdpa_turns_down_what_it_cannot_express():
    q, k = torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 5, 16)
    assert "window" in _reason("sdpa-flash", q=q, k=k, window=(4, 0))
    assert "softcap" in _reason("sdpa-cudnn", q=q, k=k, softcap=5.0)
    assert "top-left" in _reason("sdpa-efficient", q=q, k=k, causal=True)
    assert "variable-length" in _reason("sdpa-flash", q=q, k=k, cu_seqlens_q=torch.zeros(2))
    assert _reason("sdpa-flash", q=q, k=k[:, :, :3], causal=True) is None
