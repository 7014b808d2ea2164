"""moe_experts' chain on torch._grouped_mm (bench's torch-grouped-mm baseline): it computes
what the per-expert loop computes, sentinel pairs and gpt-oss's options included, and is
refused with the reason outside bf16."""

import pytest
import torch

from speedlight.candidates import Unsupported
from speedlight.candidates import grouped_mm as moe_baselines
from speedlight.ops import moe_experts as op
from tests.helpers import case_maker

case = case_maker("moe_experts", "tokens", "hidden", "inter", "experts", "k")


@pytest.mark.parametrize("flags", [
    pytest.param({"sentinel": True, "routing": "skewed"}, id="sentinel-skewed"),
    pytest.param({"act": "clamped_swiglu", "interleaved": True, "bias": True}, id="gpt-oss"),
])
def test_grouped_mm_chain_matches_the_per_expert_loop(flags, device):
    if moe_baselines._grouped_mm() is None:
        pytest.skip(f"torch {torch.__version__} has no grouped_mm")
    c = case(12, 16, 8, 4, 2, torch.bfloat16, **flags)
    inputs = op.SPEC.make_inputs(c, device)
    fn = moe_baselines.adapt(moe_baselines.GROUPED_MM, op.SPEC, c, inputs, device)
    want = op.SPEC.reference(**{k: v.double() if isinstance(v, torch.Tensor)
                                and v.is_floating_point() else v for k, v in inputs.items()})
    torch.testing.assert_close(fn(**inputs).double(), want, atol=3e-2, rtol=3e-2)


def test_grouped_mm_chain_is_refused_outside_bf16(device):
    c = case(6, 16, 8, 3, 2)
    with pytest.raises(Unsupported, match="bfloat16"):
        moe_baselines.adapt(moe_baselines.GROUPED_MM, op.SPEC, c, op.SPEC.make_inputs(c, device),
                            device)
