"""A mixture of experts' routed block, counted: which modules are transformers 5.x's experts,
how many rows each expert gets under uniform routing, and the expert GEMMs' FLOPs.

Shared by the tools: profile's projection runs the Hugging Face experts loop at these
routed sizes (its shapes depend on the routing, which fake tensors do not have), and its
advice and the tests count the expert GEMMs with `expert_gemm_flops`; bench model reads
`describe` for the rows of an MoE model.

The experts layout is transformers 5.x's <Prefix>Experts: gate_up_proj [E, 2 I, H] (gate the
first I rows), down_proj [E, H, I], and act_fn; gpt-oss keeps [E, H, 2 I] / [E, I, H].
"""

from __future__ import annotations

import inspect

import torch

UNIFORM_ROUTING = ("uniform routing: the tokens x k (token, expert) pairs spread evenly over "
                   "the experts (expert e gets pairs // E rows, one more for the first "
                   "pairs % E), no expert-parallel sentinels, load imbalance not modelled")


def routed_rows(tokens: int, k: int, experts: int) -> list[int]:
    """Rows each expert's GEMMs get when `tokens` tokens each choose `k` of `experts`
    experts under uniform routing (UNIFORM_ROUTING): they sum to tokens x k."""
    for name, v in (("tokens", tokens), ("k", k), ("experts", experts)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if tokens < 0 or k < 1 or experts < 1:
        raise ValueError(f"routed_rows needs tokens >= 0, k >= 1 and experts >= 1; got "
                         f"tokens={tokens}, k={k}, experts={experts}")
    if k > experts:
        raise ValueError(f"k={k}: a token chooses at most experts={experts} distinct experts")
    pairs = tokens * k
    base, extra = divmod(pairs, experts)
    return [base + (1 if e < extra else 0) for e in range(experts)]


def expert_gemm_flops(tokens: int, k: int, hidden: int, inter: int, mode: str = "fwd") -> int:
    """FLOPs of the routed experts' three projections (gate and up [2 I, H], down [H, I]):
    2 x tokens x k x 3 x H x I forward, whatever the routing (every pair meets one expert's
    matrices); the backward's input and weight gradients are twice that."""
    if mode not in ("fwd", "bwd"):
        raise ValueError(f"mode must be 'fwd' or 'bwd', got {mode!r}")
    fwd = 2 * tokens * k * 3 * hidden * inter
    return fwd if mode == "fwd" else 2 * fwd


def layout(module: torch.nn.Module) -> tuple[int, int, int, bool] | None:
    """(experts E, hidden H, intermediate I, transposed) of a transformers 5.x experts module
    (3-D gate_up_proj and down_proj parameters and its gate unit: an act_fn, or gpt-oss's
    clamped SwiGLU constants alpha and limit), or None for any other module. transposed:
    gpt-oss's [E, H, 2 I] / [E, I, H] storage (is_transposed where the module says, else
    read from the shapes: the two layouts' shapes never both fit)."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    unit = hasattr(module, "act_fn") or (hasattr(module, "alpha") and hasattr(module, "limit"))
    if not (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)
            and gate_up.dim() == 3 and down.dim() == 3 and unit):
        return None
    e = gate_up.shape[0]
    if down.shape[0] != e:
        return None
    transposed = getattr(module, "is_transposed", None)
    if transposed is None:
        transposed = gate_up.shape[2] == 2 * down.shape[1] and down.shape[2] == gate_up.shape[1]
    transposed = bool(transposed)
    if transposed:
        hidden, inter = gate_up.shape[1], down.shape[1]
        if gate_up.shape[2] != 2 * inter or down.shape[2] != hidden:
            return None
    else:
        hidden, inter = gate_up.shape[2], down.shape[2]
        if gate_up.shape[1] != 2 * inter or down.shape[1] != hidden:
            return None
    return e, hidden, inter, transposed


def implementation(module: torch.nn.Module) -> str:
    """What an experts module's forward runs: "loop" (the class's own per-expert loop,
    transformers' "eager"), the experts-implementation registry's entry its config names
    (5.25+: "grouped_mm", "batched_mm", "speedlight", ...), or "replaced" (the instance's
    forward swapped, as speedlight.patch does where there is no registry)."""
    if "forward" in vars(module):
        return "replaced"
    config = getattr(module, "config", None)
    chosen = getattr(config, "_experts_implementation", None)
    forward = type(module).forward
    dispatched = inspect.unwrap(forward) is not forward and chosen is not None
    if not dispatched or chosen == "eager":
        return "loop"
    return str(chosen)


def experts_summary(model: torch.nn.Module) -> dict | None:
    """The routed experts of a model as one line of results: experts, k, widths, how many
    experts modules and what their forward runs (implementation); None for a dense model."""
    found = [(m, layout(m)) for m in model.modules()]
    found = [(m, lay) for m, lay in found if lay is not None]
    if not found:
        return None
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    k = getattr(text, "num_experts_per_tok", None)
    e, hidden, inter, _ = found[0][1]
    return {"experts": e, "k": k, "hidden": hidden, "inter": inter, "modules": len(found),
            "implementation": sorted({implementation(m) for m, _ in found})}
