"""Tensor-parallel inputs: speedlight's last-dim ops take DTensors sharded along leading
dims (with replicated weights) and return DTensors of the same placement, equal to the op
on the whole tensors, gradients included; placements that cannot be computed on local
shards raise a ValueError naming the argument and its placement. One spawn of two gloo
ranks on the CPU (dtensor_ranks.py) runs every case; each test reads its own."""

import re

import pytest
import torch

if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from tests.distributed.ranks import run_ranks

SHARD0, SHARD1, PARTIAL = "(Shard(dim=0),)", "(Shard(dim=1),)", "(Partial(sum),)"

COMPUTED = {  # case -> the placements of its outputs
    "rms_norm-shard0": [SHARD0],
    "rms_norm-in-place-shard1": [SHARD1],
    "add_rms_norm-shard1": [SHARD1, SHARD1],
    "layer_norm-shard0": [SHARD0],
    "softmax-shard0": [SHARD0],
    "swiglu-shard0": [SHARD0],
    "geglu-concatenated-shard1": [SHARD1],
    "rope-heads-shard1": [SHARD1, SHARD1],
    "cross_entropy-none-shard0": [SHARD0],
    "cross_entropy-sum-shard0": [PARTIAL],  # each rank's sum over its tokens
    "linear_cross_entropy-sum-shard0": [PARTIAL],
    "nn.RMSNorm-sequence-parallel": [SHARD1],  # torch's SequenceParallel on the module
    "attention-batch-shard0": [SHARD0, SHARD0],  # o and the lse
    "attention-heads-shard1": [SHARD1, SHARD1],
    "attention-packed-heads-shard1": [SHARD1],
    "matmul-rows-shard0": [SHARD0],
}

REFUSED = {  # case -> what the message must say
    "rms_norm-shard-last-dim": r"x is a DTensor .*Shard\(dim=2\).*sharded along dim 2, "
                               r"which rms_norm reduces over",
    "rms_norm-sharded-weight": r"weight is a DTensor .*Shard\(dim=0\).*needs weight whole "
                               r"on every rank \(Replicate\)",
    "rms_norm-partial": r"x is a DTensor .*Partial\(sum\).*a Partial placement",
    "rms_norm-plain-weight-with-grad": r"weight is a plain tensor that requires grad while x "
                                       r"is a DTensor",
    "softmax-shard-on-dim": r"sharded along dim 0, which softmax reduces over",
    "add_rms_norm-two-placements": r"residual is a DTensor .*Shard\(dim=1\).* but x is a "
                                   r"DTensor .*Shard\(dim=0\).*one placement",
    "cross_entropy-mean": r"reduction='mean' divides by the number of counted tokens",
    "linear_cross_entropy-sharded-weight": r"weight is a DTensor .*Shard\(dim=0\).*whole on "
                                           r"every rank",
    "linear_cross_entropy-empty-weight": r"weight is empty \(shape \(0,\).*ZeRO-3 or FSDP has "
                                         r"released",
    "linear_cross_entropy-weight-shard-along-hidden": r"weight must have shape \(vocab, 16\).*"
                                                      r"got shape \(33, 8\).*gathered first",
    "attention-shard-sequence": r"q is a DTensor .*Shard\(dim=2\).*sharded along dim 2, "
                                r"which attention reduces over",
    "attention-heads-split-groups": r"q's 4 heads and k's 1 kv heads must both divide "
                                    r"evenly",
    "attention-packed-tokens": r"sharded along dim 0, which attention reduces over",
    "matmul-sharded-b": r"b is a DTensor .*Shard\(dim=1\).*needs b whole on every rank",
    "matmul-a-split-along-k": r"a is a DTensor .*sharded along dim 2, which matmul reduces "
                              r"over",
}


# one spawn of the ranks serves the whole module: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("distributed-dtensor")


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def results():
    return run_ranks("tests.distributed.dtensor_ranks:dtensor", world=2)


def test_every_case_ran(results):
    assert sorted(results) == sorted({**COMPUTED, **REFUSED})


@pytest.mark.parametrize("case", list(COMPUTED))
def test_sharded_rows_computed_locally_match_the_whole(results, case):
    result = results[case]
    assert "error" not in result, result.get("error")
    assert result["placements"] == COMPUTED[case]


@pytest.mark.parametrize("case", list(REFUSED))
def test_placement_that_cannot_run_locally_is_refused(results, case):
    result = results[case]
    assert "error" not in result, result.get("error")
    assert re.search(REFUSED[case], result["message"]), result["message"]
