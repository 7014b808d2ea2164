"""A mixture of experts' <Prefix>Experts module (transformers 5.x) on speedlight's gated
unit: the forward the patch gives it, and the layout it reads."""

from __future__ import annotations

import importlib

import torch


def _per_expert(rows: torch.Tensor, weight: torch.Tensor, counts: list[int] | None) -> torch.Tensor:
    """rows [pairs, D] grouped by expert (counts[e] rows each) @ weight[e]^T ([E, out, D])
    -> [pairs, out]. counts None (fake tensors, routing unknown): the pairs spread evenly
    over the experts, as one batched product that costs what the per-expert ones would."""
    n_experts = weight.shape[0]
    if counts is None:
        share = -(-rows.shape[0] // n_experts)
        padded = torch.nn.functional.pad(rows, (0, 0, 0, share * n_experts - rows.shape[0]))
        # [E, share, D] @ [E, D, out] -> [E, share, out]
        out = torch.bmm(padded.view(n_experts, share, -1), weight.transpose(1, 2))
        return out.reshape(-1, weight.shape[1])[:rows.shape[0]]
    hit = [(e, n) for e, n in enumerate(counts) if n]
    if not hit:
        return rows.new_empty(0, weight.shape[1])
    return torch.cat([torch.nn.functional.linear(part, weight[e])
                      for (e, _), part in zip(hit, rows.split([n for _, n in hit]))])


def experts_forward(op_name: str, op_kwargs: dict):
    """A mixture of experts' forward (transformers 5.x's <Prefix>Experts: gate_up_proj
    [E, 2I, H], down_proj [E, H, I]) with every expert's gated unit in one speedlight launch.

    The routing arrives as the module's arguments (top_k_index, top_k_weights [tokens, k])
    and is used as it is: the (token, slot) pairs are sorted by expert, each expert's rows
    are projected by its own gate_up_proj, the gated unit runs once over all of them
    ([pairs, 2I] -> [pairs, I]), each expert's rows go through its down_proj, are weighted
    and summed into their tokens. Indices >= num_experts (expert-parallel sentinels) are
    skipped, as the module's own loop does. On tensors without values (the profile's
    projection, fake tensors) the routing is unknown: the pairs are costed as spread evenly
    over the experts."""
    def forward(self, hidden_states, top_k_index, top_k_weights):
        from speedlight.patching.hf_attention import _has_values
        op = getattr(importlib.import_module(f"speedlight.ops.{op_name}"), op_name)
        k = top_k_index.shape[-1]
        with torch.no_grad():
            flat = top_k_index.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = None
            if _has_values(flat):
                n_experts = self.gate_up_proj.shape[0]
                order = order[flat[order] < n_experts]  # pairs, grouped by expert
                counts = torch.bincount(flat[order], minlength=n_experts).tolist()
            token = order // k
        x = hidden_states[token]  # [pairs, H]
        h = op(_per_expert(x, self.gate_up_proj, counts), None, **op_kwargs)  # [pairs, I]
        out = _per_expert(h, self.down_proj, counts) * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden_states).index_add_(0, token, out.to(hidden_states.dtype))
    return forward


def experts_layout_problem(experts) -> str | None:
    """Why an experts module's weights are not in the layout experts_forward reads, or None."""
    if not all(isinstance(getattr(experts, n, None), torch.nn.Parameter) and
               getattr(experts, n).dim() == 3 for n in ("gate_up_proj", "down_proj")):
        return "its weights are not 3-D gate_up_proj/down_proj parameters"
    for flag, wanted in (("has_bias", False), ("is_transposed", False),
                         ("is_concatenated", True), ("has_gate", True),
                         ("has_post_expert_norm", False)):
        if getattr(experts, flag, wanted) != wanted:
            return f"its {flag} is {getattr(experts, flag)}; speedlight reads {flag}={wanted}"
    gate = getattr(type(experts), "_apply_gate", None)
    if gate is not None and gate.__name__ != "_default_apply_gate":
        return "it has its own gating function (_apply_gate)"
    return None
