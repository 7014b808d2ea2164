"""The Hugging Face experts loop, projected: its ops at the routed sizes uniform routing gives.

transformers' experts loop (the "eager" implementation; the only one before 5.25) asks the
data which experts got tokens (`nonzero`) and which rows each got (`torch.where`), then runs
one gather, two `linear`s, the gate unit, the routing weight and an `index_add_` per expert.
On fake tensors those answers do not exist (FakeTensorMode raises on `nonzero`), so the
projection runs this stand-in: the same ops in the same order, each expert given the rows
uniform routing gives it (workloads.moe.routed_rows), `nonzero` replaced by `nonzero_static`
at that size (the same bytes; what it saves a GPU run is the host sync, which is not on the
roof). So the expert GEMMs are costed at tokens x k rows in all, spread over the experts
(never every expert on every token), and the loop's launches (about ten per expert per
layer) are all there. The loop's host syncs (one per `nonzero`, one per expert's sentinel
check) and any load imbalance are not modelled.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F

from speedlight.workloads import moe


def loop_at_uniform_routing(self, hidden_states, top_k_index, top_k_weights):
    """transformers 5.x's experts loop (gate_up_proj [E, 2 I, H], down_proj [E, H, I],
    act_fn), op for op, at uniform routing."""
    experts = self.gate_up_proj.shape[0]
    tokens, k = top_k_index.shape
    rows = moe.routed_rows(tokens, k, experts)
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = F.one_hot(top_k_index, num_classes=experts + 1).permute(2, 1, 0)
        hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0)
        expert_hit = torch.nonzero_static(hit, size=sum(1 for n in rows if n))
    for expert_idx, (e, n) in zip(expert_hit, ((e, n) for e, n in enumerate(rows) if n)):
        expert_idx = expert_idx[0]
        _ = expert_idx == experts  # the loop's sentinel check (the host reads it: not on the roof)
        top_k_pos, token_idx = torch.nonzero_static(expert_mask[e], size=n).unbind(1)
        current_state = hidden_states[token_idx]
        gate, up = F.linear(current_state, self.gate_up_proj[e]).chunk(2, dim=-1)
        current_hidden_states = self.act_fn(gate) * up
        current_hidden_states = F.linear(current_hidden_states, self.down_proj[e])
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
    return final_hidden_states


def standard_loop(module: torch.nn.Module) -> bool:
    """Whether the module runs transformers' experts loop in the layout the stand-in
    follows: gate_up_proj [E, 2 I, H] with the gate first, down_proj [E, H, I], no biases,
    the default gate (gpt-oss's transposed, biased, clamped loop is not among them)."""
    lay = moe.layout(module)
    if lay is None or lay[3] or moe.implementation(module) != "loop":
        return False
    for flag, wanted in (("has_bias", False), ("is_transposed", False),
                         ("is_concatenated", True), ("has_gate", True),
                         ("has_post_expert_norm", False)):
        if getattr(module, flag, wanted) != wanted:
            return False
    gate = getattr(type(module), "_apply_gate", None)
    return gate is None or gate.__name__ == "_default_apply_gate"


@contextlib.contextmanager
def projected_loops(model: torch.nn.Module):
    """Every experts module of `model` that would run transformers' loop runs the stand-in
    inside the block (its instance forward, removed after). Yields how many."""
    swapped = [m for m in model.modules() if standard_loop(m)]
    for m in swapped:
        m.forward = types.MethodType(loop_at_uniform_routing, m)
    try:
        yield len(swapped)
    finally:
        for m in swapped:
            vars(m).pop("forward", None)
