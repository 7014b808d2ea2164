"""The memory breakdown: what each part holds, and that the parts sum to the peak."""

import torch
from torch import nn

from tests.profile.util import profile_model

B, D, H = 32, 64, 128


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, D))


def test_training_breakdown():
    model = mlp()
    cap, _, opt = profile_model(model, torch.randn(B, D))
    m = cap.memory
    params = (D * H + H + H * D + D) * 4
    assert m["parameters_bytes"] == params
    assert m["gradients_bytes"] == params  # one gradient per parameter, same dtype
    # AdamW: exp_avg and exp_avg_sq per parameter, and a 4-byte step count per tensor
    assert m["optimizer_state_bytes"] == 2 * params + 4 * 4
    assert m["inputs_bytes"] == B * D * 4
    # saved for backward: the ReLU's output (which the second Linear saves too: once);
    # the first Linear saves the input, which is not an activation
    assert m["activations_bytes"] == B * H * 4
    assert m["activations_by_module"] == [{"module": "1", "module_class": "ReLU", "bytes": B * H * 4}]
    at = m["at_peak"]
    assert sum(at.values()) == m["peak_bytes"]
    assert at["parameters"] == params and at["optimizer_state"] == 2 * params + 16
    assert m["peak_bytes"] >= at["parameters"] + at["optimizer_state"] + at["gradients"]


def test_inference_keeps_no_activations():
    cap, _, _ = profile_model(mlp(), torch.randn(B, D), train=False)
    m = cap.memory
    assert m["activations_bytes"] == 0 and m["gradients_bytes"] == 0 and m["optimizer_state_bytes"] == 0
    assert sum(m["at_peak"].values()) == m["peak_bytes"]
    # at the peak the first Linear's output [B, H] and the ReLU's (a new tensor) may coexist
    assert B * H * 4 <= m["at_peak"]["temporaries"] <= 2 * B * H * 4 + B * D * 4


def test_saved_bytes_are_charged_to_the_op_that_made_them():
    _, res, _ = profile_model(mlp(), torch.randn(B, D))
    saved = {r["name"]: r["saved_bytes"] for r in res["rows"] if r["saved_bytes"]}
    assert saved == {"relu": B * H * 4}


def test_default_model_activations_by_module(train_run):
    m = train_run["doc"]["memory"]
    by = {a["module"]: a["bytes"] for a in m["activations_by_module"]}
    assert sum(by.values()) == m["activations_bytes"] > 0
    assert all(by.get(f"model.layers.{i}.mlp", 0) > 0 for i in range(2))
    assert sum(m["at_peak"].values()) == m["peak_bytes"]
    assert m["parameters_bytes"] == train_run["doc"]["model"]["parameters"] * 4
