"""A mixture of experts' <Prefix>Experts module (transformers 5.x) on speedlight's grouped
GEMM and gated unit: the forward the patch gives it, and the layout it reads."""

from __future__ import annotations

import importlib

import torch


def expert_routing(top_k_index: torch.Tensor, n_experts: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, group_offsets) of a router's choices [tokens, k]: the (token, slot) pairs
    sorted by expert (stable: a token's pairs keep their order), and each expert's
    cumulative end in that order, int32 [n_experts]. Indices outside [0, n_experts)
    (expert-parallel sentinels) sort last, past the last expert's end, where
    grouped_matmul writes zeros. Static shapes, no host sync (a CUDA graph can hold it)."""
    flat = top_k_index.reshape(-1)
    expert = torch.where((flat >= 0) & (flat < n_experts), flat, n_experts)
    order = torch.argsort(expert, stable=True)
    counts = torch.zeros(n_experts + 1, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, expert, torch.ones_like(expert, dtype=torch.int32))
    return order, counts[:n_experts].cumsum(0, dtype=torch.int32)


def experts_forward(op_name: str, op_kwargs: dict):
    """A mixture of experts' forward (transformers 5.x's <Prefix>Experts: gate_up_proj
    [E, 2I, H], down_proj [E, H, I]) on speedlight's grouped GEMM and gated unit.

    The routing arrives as the module's arguments (top_k_index, top_k_weights [tokens, k])
    and is used as it is: the (token, slot) pairs are sorted by expert on the device
    (expert_routing), gathered, projected by every expert's gate_up_proj in one
    grouped_matmul launch, the gated unit runs once over all of them ([pairs, 2I] ->
    [pairs, I]), every expert's down_proj in a second launch, then the routing weights and
    an index_add_ into the tokens. Indices >= num_experts (expert-parallel sentinels) sort
    past the last expert and contribute zeros, as the module's own loop skips them. No
    host sync anywhere; on fake tensors (the profile's projection) the grouped GEMMs cost
    every routed pair."""
    def forward(self, hidden_states, top_k_index, top_k_weights):
        from speedlight.ops.grouped_matmul import grouped_matmul
        op = getattr(importlib.import_module(f"speedlight.ops.{op_name}"), op_name)
        k = top_k_index.shape[-1]
        with torch.no_grad():
            order, offsets = expert_routing(top_k_index, self.gate_up_proj.shape[0])
            token = order // k
        x = hidden_states[token].to(self.gate_up_proj.dtype)  # [pairs, H]
        gate_up = grouped_matmul(x, self.gate_up_proj, offsets, check_offsets=False)
        h = op(gate_up, None, **op_kwargs)  # [pairs, 2I] -> [pairs, I]
        out = grouped_matmul(h, self.down_proj, offsets, check_offsets=False)  # [pairs, H]
        out = out * top_k_weights.reshape(-1)[order, None]
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
