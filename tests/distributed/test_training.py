"""speedlight.patch inside distributed training: a patched tiny Llama wrapped in DDP or
FSDP2 (fully_shard on a CPU device mesh), with and without activation checkpointing,
trains with the losses and gradients of the unpatched model under the same wrapping.

Two gloo ranks on the CPU, kernels through the Triton interpreter; every setting runs in
one spawn of the two processes (training_ranks.py), each test reads its setting's result.
"""

import pytest
import torch

pytest.importorskip("transformers")

from tests.distributed.ranks import run_ranks
from tests.distributed.training_ranks import SETTINGS

if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

KERNELS = ("_rms_norm_", "_rope_", "_glu_", "_attention_", "_cross_entropy_")


# one spawn of the ranks serves the whole module: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("distributed-training")


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def results():
    return run_ranks("tests.distributed.training_ranks:training", world=2)


def test_every_rank_applies_rank_0s_plan(results):
    """Under torch.distributed the plan is rank 0's on every rank (broadcast), so replicas
    patch the same kinds; rank 1, which had none, drops what rank 0's plan dropped."""
    result = results["plan"]
    assert "error" not in result, result.get("error")
    expected = {"note": "stand-in timed on rank 0",
                "kinds": {"mlp": False, "rms_norm": True, "rope": True}}
    assert result["ranks"] == [expected, expected]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_patched_model_trains_as_unpatched_under_wrapping(results, setting):
    result = results[setting]
    assert "error" not in result, result.get("error")
    assert result["patched"] == ["attention", "cross_entropy", "decoder_layer",
                                 "linear_cross_entropy", "mlp", "rms_norm", "rope"]
    kernels = " ".join(result["kernels"])
    for name in KERNELS:  # speedlight's kernels ran in the ranks
        assert name in kernels, f"no {name} kernel ran under {setting}: {kernels}"
    assert result["fused_loss"], "the loss was not linear_cross_entropy's (logits were made)"
    assert result["n_grads"] == 21  # every parameter of the 2-layer Llama got a gradient
    assert len(result["losses"]) == 2 and result["losses"][1] < result["losses"][0]
