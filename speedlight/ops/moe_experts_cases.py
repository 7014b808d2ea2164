"""moe_experts' cases and cost: the suites, the inputs of a case (a router's choices drawn
per token), the FLOPs and bytes of the ideal fused block, the model cases and the Case of a
call. The OpSpec that uses them is declared in ops/moe_experts.py."""

from __future__ import annotations

import torch

from speedlight import shapes
from speedlight.ops._suites import is_call_of, skip_huge_on_cpu
from speedlight.spec import Case, Chain, Cost, generator, inject_nonfinite, rand_tensor

# the clamped SwiGLU's limit in the quick suite's fp32 clamp test is lower, so that it clamps
GPT_OSS = {"act": "clamped_swiglu", "interleaved": True, "bias": True}


def _block(name: str) -> tuple:
    cfg = shapes.MODELS[name]
    return cfg.hidden, cfg.intermediate, cfg.experts, cfg.experts_per_token, "contiguous", {}


# The expert blocks the model suite benches: (hidden, inter, experts, k, layout, flags).
# DeepSeek-V3 (huggingface.co/deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168,
# moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8,
# n_shared_experts 1): its shared expert runs in the same grouped GEMMs as one more expert
# that every token picks with weight 1 (flag `shared`). gpt-oss-20B
# (huggingface.co/openai/gpt-oss-20b config.json: hidden_size 2880, intermediate_size
# 2880, num_local_experts 32, experts_per_token 4, swiglu_limit 7.0): its clamped,
# interleaved, biased unit on [E, H, 2 I] / [E, I, H] weights (transposed).
MOE_BLOCKS = {
    "mixtral-8x7b": _block("mixtral-8x7b"),
    "qwen3-30b-a3b": _block("qwen3-30b-a3b"),
    "deepseek-v3": (7168, 2048, 256, 8, "contiguous", {"shared": 1}),
    "gpt-oss-20b": (2880, 2880, 32, 4, "transposed", GPT_OSS),
}
# the token counts the model suite benches each block at
MOE_TOKENS = (4096, 32768)
# the same blocks at widths a CPU verifies (hidden and intermediate / 16 or / 32, experts
# / 4 to / 16, k kept; 32 tokens), in the full suite: gpt-oss's and the fine-grained
# routings' paths at their shapes' proportions
CPU_BLOCKS = {
    "qwen3-30b-a3b": (128, 48, 16, 8),
    "deepseek-v3": (224, 64, 16, 8),
    "gpt-oss-20b": (180, 180, 8, 4),
}
# FLOP per element of the gate unit (forward, backward) as kernels/moe.py computes it
_GATE_FLOPS = {"silu": (5, 9), "gelu_tanh": (10, 13), "gelu": (6, 9), "clamped_swiglu": (9, 14)}
# a case this large (tokens x hidden x intermediate) takes minutes or more under the
# interpreter: the GPU's sizes
CPU_MAX_WORK = 2 ** 24


def _case(tokens, hidden, inter, experts, k, layout="contiguous", model=None, **flags) -> Case:
    return Case("moe_experts", (("tokens", tokens), ("hidden", hidden), ("inter", inter),
                                ("experts", experts), ("k", k)),
                layout=layout, flags=flags, model=model)


def block_case(name: str, tokens: int, routing: str = "uniform") -> Case:
    """The expert block of MOE_BLOCKS' model `name` at `tokens` tokens."""
    hidden, inter, experts, k, layout, flags = MOE_BLOCKS[name]
    return _case(tokens, hidden, inter, experts, k, layout, model=name, routing=routing,
                 **flags)


def cpu_block_case(name: str) -> Case:
    """The block of model `name` at CPU_BLOCKS' widths, its layout and flags kept."""
    _, _, _, _, layout, flags = MOE_BLOCKS[name]
    hidden, inter, experts, k = CPU_BLOCKS[name]
    return _case(32, hidden, inter, experts, k, layout, routing="skewed", **flags)


def _model_cases(tokens=MOE_TOKENS) -> list[Case]:
    return [block_case(name, t, routing) for name in MOE_BLOCKS for t in tokens
            for routing in ("uniform", "skewed")]


def cases(suite: str) -> list[Case]:
    """quick: tiny shapes (a few experts, tens of tokens): every gate unit, gpt-oss's
    options (interleaved, biases, weights as [E, H, 2 I] transposed, its clamp's constants
    given, so the fuzz tests mutate them), skewed routing, sentinel indices with top-1 (a
    token routed nowhere), Falcon multipliers, an empty batch; model: MOE_BLOCKS
    (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3 with its shared expert, gpt-oss-20B) at 4096
    and 32768 tokens, uniform and skewed routing (GPU sizes); full: the model blocks at
    4096 tokens, the same blocks at CPU widths (CPU_BLOCKS), odd larger shapes and the
    64-bit case."""
    shapes.check_suite(suite)
    if suite == "quick":
        return [
            _case(6, 16, 8, 3, 2),
            _case(9, 24, 12, 4, 2, "transposed", swiglu_alpha=1.702, swiglu_limit=7.0,
                  **GPT_OSS),
            _case(7, 20, 10, 4, 3, "strided", routing="skewed", act="gelu", bias=True),
            _case(8, 16, 8, 4, 1, act="gelu_tanh", sentinel=True, gate_multiplier=0.75,
                  down_multiplier=2.5),
            _case(0, 16, 8, 3, 2),
        ]
    out = _model_cases() if suite == "model" else _model_cases(tokens=MOE_TOKENS[:1])
    if suite == "full":
        out += [cpu_block_case(name) for name in CPU_BLOCKS]
        out += [_case(257, 509, 383, 7, 2), _case(1031, 1024, 257, 64, 6, routing="skewed"),
                _case(257, 509, 383, 7, 2, "transposed", **GPT_OSS),
                _case(333, 256, 128, 16, 4, sentinel=True, act="gelu_tanh")]
        # hidden past 2^31 elements: 64-bit offsets (skipped on a CPU)
        out.append(_case(65537, 32771, 16, 2, 1, huge=True))
    return out


def routed(case: Case) -> tuple[int, int]:
    """(experts, k) the block's inputs hold: a shared expert is one more expert that every
    token picks (the last index, weight 1)."""
    shared = int(case.flag("shared") or 0)
    return case["experts"] + shared, case["k"] + shared


def top_k_choices(case: Case) -> torch.Tensor:
    """The router's choices [tokens, k] int64 of a case, drawn from its seed: k distinct
    experts per token, uniform or skewed (Zipf(1): expert 0 the hottest); with the
    `sentinel` flag every 4th pair holds an index >= E (an expert held elsewhere). With
    k > E (an expert-parallel rank holding fewer experts than the router picks) a token
    chooses every expert and its other slots hold sentinels E, E + 1, ... With `shared`
    (DeepSeek-V3's shared expert) the last column is index E, an expert every token picks."""
    tokens, experts, k = case["tokens"], case["experts"], case["k"]
    shared = int(case.flag("shared") or 0)
    if shared:  # the routed choices, then the shared experts' indices E, E + 1, ...
        routed_choices = top_k_choices(case.with_(flags={
            n: v for n, v in case.flags if n != "shared"}))
        always = experts + torch.arange(shared, dtype=torch.int64).expand(tokens, shared)
        return torch.cat([routed_choices, always], dim=1)
    weights = torch.ones(experts, dtype=torch.float64)
    if case.flag("routing") == "skewed":
        weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64)
    local = min(k, experts)
    index = experts + torch.arange(k, dtype=torch.int64).expand(tokens, k).clone()
    if tokens == 0 or local == 0:
        return index
    g = generator(case, salt=11)
    index[:, k - local:] = torch.multinomial(weights.expand(tokens, experts), local,
                                             replacement=False, generator=g)
    if case.flag("sentinel"):
        flat = index.view(-1)
        at = torch.arange(3, flat.numel(), 4)
        flat[at] = experts + at % 3  # E, E + 1, E + 2
    return index


def sentinel_pairs(case: Case) -> int:
    """How many of the case's pairs hold a sentinel index (top_k_choices)."""
    return case["tokens"] * case["k"] // 4 if case.flag("sentinel") else 0


def make_inputs(case: Case, device) -> dict:
    """hidden [tokens, H] as the case lays it out; the router's choices and softmax
    weights; gate_up_proj [E, 2 I, H] and down_proj [E, H, I] (transposed: gpt-oss's
    [E, H, 2 I] and [E, I, H] tensors transposed; strided: rows padded, NaN in the
    padding); the biases and gate unit the flags name; with `shared`, the shared experts
    after the routed ones, chosen by every token with weight 1."""
    tokens, hidden, inter = case["tokens"], case["hidden"], case["inter"]
    experts, k = routed(case)
    shared = k - case["k"]
    x = rand_tensor((tokens, hidden), case, device)
    if case.flag("nonfinite"):
        inject_nonfinite(x, case)
    logits = rand_tensor((tokens, case["k"]), case, device, dtype=torch.float32,
                         layout="contiguous", salt=5)
    weights = torch.softmax(logits, -1)
    weights = torch.cat([weights, weights.new_ones((tokens, shared))], 1).to(case.dtype)
    gate_up = rand_tensor((experts, 2 * inter, hidden), case, device, salt=1,
                          scale=hidden ** -0.5 if hidden else 1.0)
    down = rand_tensor((experts, hidden, inter), case, device, salt=2,
                       scale=inter ** -0.5 if inter else 1.0)
    bias = case.flag("bias")
    out = {"hidden": x, "top_k_index": top_k_choices(case).to(device), "top_k_weights": weights,
           "gate_up_proj": gate_up, "down_proj": down,
           "gate_up_bias": rand_tensor((experts, 2 * inter), case, device, salt=3,
                                       layout="contiguous", scale=0.5) if bias else None,
           "down_bias": rand_tensor((experts, hidden), case, device, salt=4,
                                    layout="contiguous", scale=0.5) if bias else None,
           "activation": case.flag("act") or "silu",
           "interleaved": bool(case.flag("interleaved"))}
    for name in ("gate_multiplier", "down_multiplier", "swiglu_alpha", "swiglu_limit"):
        if case.flag(name) is not None:
            out[name] = float(case.flag(name))
    return out


def cost(case: Case, mode: str) -> Cost:
    """FLOPs of the routed pairs (sentinels excluded); bytes of the ideal fused block:
    hidden, the routing and every expert's weights read once, the output written once (the
    intermediates z and h stay on chip). The backward reads dout, hidden, the routing, the
    weights and z (saved), and writes dhidden, the routing weights' and weights' gradients."""
    tokens, hidden, inter = case["tokens"], case["hidden"], case["inter"]
    experts, k = routed(case)
    e = case.dtype.itemsize
    pairs = tokens * k - sentinel_pairs(case)
    gemm = 2 * pairs * 3 * inter * hidden  # gate_up [2I, H] and down [H, I] per pair
    act, dact = _GATE_FLOPS[case.flag("act") or "silu"]
    weights = experts * 3 * inter * hidden * e
    bias = experts * (2 * inter + hidden) * e if case.flag("bias") else 0
    routing = tokens * k * (8 + e)  # int64 index, a weight per choice
    if mode == "fwd":
        # gate unit per [pair, I]; the weight and the sum over k per [pair, H]; z [pairs, 2 I]
        # kept for the backward (the sort is redone there)
        return Cost(flops=gemm + act * pairs * inter + 2 * pairs * hidden,
                    bytes=2 * tokens * hidden * e + weights + bias + routing,
                    saved=pairs * 2 * inter * e)
    # dx and dW of both GEMMs (twice the forward's); the gate unit's backward; <g, h>
    return Cost(flops=2 * gemm + dact * pairs * inter + 2 * pairs * inter + 2 * pairs * hidden,
                bytes=3 * tokens * hidden * e + 2 * (weights + bias) + routing + tokens * k * e
                + pairs * 2 * inter * e)


def skip(case: Case, device) -> str | None:
    reason = skip_huge_on_cpu(case, device)
    if reason or torch.device(device).type == "cuda":
        return reason
    if case["tokens"] * case["hidden"] * case["inter"] > CPU_MAX_WORK:
        return ("GPU-size case (a model's expert block): minutes or more under the Triton "
                "interpreter; it runs on a GPU")
    return None


def case_of(call: str, args) -> Case | None:
    """The Case of one call of the registered op (profile costs it through `cost`): the
    routing is not read (a host sync), so it is costed as uniform."""
    if not is_call_of(call, "moe_experts"):
        return None
    x, index, w = args.get("hidden"), args.get("top_k_index"), args.get("gate_up_proj")
    if x is None or index is None or w is None:
        return None
    flags = {"act": args.get("activation") if args.get("activation") != "silu" else None,
             "bias": True if args.get("gate_up_bias") is not None else None,
             "interleaved": True if args.get("interleaved") else None}
    return Case("moe_experts", (("tokens", x.shape[0]), ("hidden", x.shape[1]),
                                ("inter", w.shape[1] // 2), ("experts", w.shape[0]),
                                ("k", index.shape[1])),
                dtype=x.dtype, flags={k: v for k, v in flags.items() if v is not None})


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """The routed experts of an MoE model at batch x seq tokens (uniform routing); none
    for a dense model."""
    if not getattr(cfg, "experts", 0):
        return []
    return [_case(batch * seq, cfg.hidden, cfg.intermediate, cfg.experts,
                  cfg.experts_per_token, model=cfg.name)]


# --- recognise: routed experts run as many PyTorch ops ------------------------------------

def _gate_up_down(params: list[dict]) -> tuple[dict, dict] | None:
    """(gate_up_proj, down_proj) among 3-D parameter metas: [E, 2 I, H] and [E, H, I]."""
    for a in params:
        for b in params:
            (e, two_i, h), (e2, h2, i) = a["shape"], b["shape"]
            if e == e2 and two_i == 2 * i and h == h2 and a is not b:
                return a, b
    return None


def recognise(g, calls) -> list[Chain]:
    """A mixture of experts' routed experts run as many ops (transformers 5.x's
    <Prefix>Experts: the per-expert loop, or a torch grouped_mm chain): a module call whose
    own ops read a gate_up_proj [E, 2 I, H] / down_proj [E, H, I] parameter pair, with every
    forward op under it (its act_fn too). A module already running speedlight's op is not
    one. The Case: tokens x k routed to E experts, in the weights' dtype."""
    chains = []
    own: dict[int, list[dict]] = {}
    for r in g.fwd:
        if r["call"] is not None:
            own.setdefault(r["call"], []).append(r)
    for call in calls:
        params = {}
        for r in own.get(call.id, []):
            for t, p in zip(r["inputs"], r["producers"]):
                if p is None and len(t["shape"]) == 3:
                    params[tuple(t["shape"]), t["dtype"]] = t
        pair = _gate_up_down(list(params.values()))
        if pair is None:
            continue
        prefix = call.module
        rows = [r for r in g.fwd if r["module"] is not None
                and (r["module"] == prefix or r["module"].startswith(prefix + "."))]
        if any(r["op"].startswith("speedlight.") for r in rows):
            continue
        fwd = {r["index"] for r in rows}
        outside = [t for r in rows for t, p in zip(r["inputs"], r["producers"])
                   if p is None or p not in fwd]
        experts, two_i, hidden = pair[0]["shape"]
        index = next((t for t in outside if t["dtype"] == "int64" and len(t["shape"]) == 2
                      and t["shape"][1] <= experts), None)
        states = next((t for t in outside if len(t["shape"]) == 2 and t["shape"][-1] == hidden
                       and t["dtype"] != "int64"), None)
        if index is None or states is None:
            continue
        how = "a torch grouped_mm chain" if any(r["name"] == "_grouped_mm" for r in rows) \
            else "a per-expert loop"
        tokens, k = index["shape"]
        case = Case("moe_experts", (("tokens", tokens), ("hidden", hidden), ("inter", two_i // 2),
                                    ("experts", experts), ("k", k)),
                    dtype=g.tensor(pair[0]).dtype)
        chains.append(Chain(f"{call.module_class}: {how} in {g.kernel_ops(fwd)} kernel ops",
                            fwd, prefix, case))
    return chains
