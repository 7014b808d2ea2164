"""What profile reports of the mixture-of-experts block's memory: the activation it saves
(z alone) and its backward's own peak (outputs and intermediates, seen from inside the
launcher), at two expert granularities with k I and E I fixed (the same active and total
widths in 4x as many, 4x narrower experts): the saved bytes are equal and the backward's
peak differs by per-pair scalars only (no [tokens x k, H] tensor)."""

import torch
from torch import nn

import speedlight
from tests.profile.util import profile_model

TOKENS, HIDDEN = 8, 64


class Experts(nn.Module):
    def __init__(self, experts: int, inter: int):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inter, HIDDEN, generator=g)
                                         * HIDDEN ** -0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, HIDDEN, inter, generator=g)
                                      * inter ** -0.5)

    def forward(self, hidden, top_k_index, top_k_weights):
        return speedlight.moe_experts(hidden, top_k_index, top_k_weights, self.gate_up_proj,
                                      self.down_proj)


def _memory(experts: int, k: int, inter: int) -> dict:
    g = torch.Generator().manual_seed(1)
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(TOKENS)])
    inputs = {"hidden": torch.randn(TOKENS, HIDDEN, generator=g).requires_grad_(True),
              "top_k_index": index,
              "top_k_weights": torch.softmax(torch.randn(TOKENS, k, generator=g), -1)}
    cap, _, _ = profile_model(Experts(experts, inter), inputs, warmup=0)
    return cap.memory


def test_saved_bytes_and_backward_peak_do_not_grow_with_granularity():
    coarse, fine = (2, 1, 8), (8, 4, 2)  # (E, k, I): k I = 8, E I = 16
    got = {}
    for e, k, i in (coarse, fine):
        m = _memory(e, k, i)
        peaks = {p["op"]: p["bytes"] for p in m["op_peaks"]}
        got[k] = (m["activations_bytes"], peaks["moe_experts_bwd"])
        # saved for backward: z [tokens x k, 2 I] alone, 2 k I fp32 values per token
        assert m["activations_by_module"] == [
            {"module": "", "module_class": "Experts", "bytes": TOKENS * 2 * k * i * 4}]
        # the backward's own peak: its outputs (dhidden, both weight gradients) and per pair
        # g, w h, dz (4 I fp32 values) and a few scalars: far below one [pairs, H] tensor
        outputs = (TOKENS * HIDDEN + e * 3 * i * HIDDEN) * 4
        assert outputs < peaks["moe_experts_bwd"] <= outputs + TOKENS * k * (16 * i + 64)
    (saved_c, peak_c), (saved_f, peak_f) = got[1], got[4]
    assert saved_c == saved_f
    extra_pairs = TOKENS * (4 - 1)
    assert abs(peak_f - peak_c) <= 64 * extra_pairs < extra_pairs * HIDDEN * 4 // 2
