"""The grouped GEMM's cases, inputs, costs and model shapes (its OpSpec's parts; the
launchers, registration and SPEC are ops/grouped_matmul.py's)."""

from __future__ import annotations

import torch

from speedlight import shapes
from speedlight.ops._suites import is_call_of, skip_huge_on_cpu
from speedlight.spec import Case, Cost, dtype_name, inject_nonfinite, rand_tensor

# how the routed rows fall into groups (make_inputs / group_sizes):
#   uniform     each row in a group drawn uniformly;  skewed: a Zipf(1) draw (group 0 the
#   hottest: 37% of the rows of 8 groups, 18% of 128);  one: every row in the middle group;
#   lead_empty / tail_empty: the first / last half of the groups empty, the rest uniform;
#   none: every group empty (every row past the last group)
ROUTINGS = ("uniform", "skewed", "one", "lead_empty", "tail_empty", "none")

# (model, N, K) of the expert projections issue 30 benches: gate_up [2I, H], down [H, I]
MOE_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b")
MOE_TOKENS = (4096, 16384, 32768)


def group_sizes(case: Case) -> list[int]:
    """The rows of each group of a case (summing to M minus the case's `tail` rows, which
    belong to no group), drawn from the case's seed: the same on every device."""
    m, groups = case["m"], case["groups"]
    routed = m - int(case.flag("tail") or 0)
    routing = case.flag("routing") or "uniform"
    if groups == 0:
        return []
    gen = torch.Generator().manual_seed(7919 * case.seed + m + 31 * groups)
    weights = torch.ones(groups, dtype=torch.float64)
    if routing == "skewed":
        weights = 1.0 / torch.arange(1, groups + 1, dtype=torch.float64)
    elif routing == "lead_empty":
        weights[: groups // 2] = 0
    elif routing == "tail_empty":
        weights[groups - groups // 2:] = 0
    elif routing == "one":
        weights = torch.zeros(groups, dtype=torch.float64)
        weights[groups // 2] = 1
    elif routing == "none" or routed == 0:
        return [0] * groups
    picks = torch.multinomial(weights, routed, replacement=True, generator=gen)
    return torch.bincount(picks, minlength=groups).tolist()


def offsets_of(sizes: list[int], device) -> torch.Tensor:
    """int32 cumulative ends of group sizes."""
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def _case(m, n, k, groups, layout="contiguous", model=None, **flags) -> Case:
    return Case("grouped_matmul", (("m", m), ("n", n), ("k", k), ("groups", groups)),
                layout=layout, flags=flags, model=model)


def _model_cases(tokens=MOE_TOKENS, routings=("uniform", "skewed")) -> list[Case]:
    out = []
    for name in MOE_MODELS:
        cfg = shapes.MODELS[name]
        for t in tokens:
            for proj, n, k in expert_projections(cfg):
                for routing in routings:
                    out.append(_case(t * cfg.experts_per_token, n, k, cfg.experts,
                                     model=cfg.name, proj=proj, tokens=t, routing=routing))
    return out


def expert_projections(cfg: shapes.ModelConfig) -> list[tuple[str, int, int]]:
    """(name, N, K) of an MoE layer's expert projections: gate_up [2I, H], down [H, I]."""
    return [("gate_up", 2 * cfg.intermediate, cfg.hidden),
            ("down", cfg.hidden, cfg.intermediate)]


def cases(suite: str) -> list[Case]:
    """quick: odd group sizes, empty groups (leading, trailing, all), one group with every
    row, one row, 64 groups (256 in tests/ops/test_grouped_matmul.py), K and N off the
    tile, strided and transposed operands (w as a [G, K, N] tensor transposed), each
    epilogue, rows past the last group, empty inputs; model: Mixtral-8x7B's and
    Qwen3-30B-A3B's expert projections at 4096, 16384 and 32768 routed tokens (times top-k
    rows), uniform and skewed routing; full: the model shapes at 4096 tokens only (the
    larger ones draw gigabytes of float64 inputs: bench's model suite has them), larger
    odd shapes and the 64-bit case."""
    shapes.check_suite(suite)
    if suite == "quick":
        return [
            _case(37, 20, 24, 4), _case(1, 8, 16, 1), _case(45, 33, 17, 7, routing="skewed"),
            _case(40, 24, 32, 6, routing="lead_empty"), _case(40, 24, 32, 6, routing="tail_empty"),
            _case(30, 16, 16, 5, routing="one"), _case(20, 16, 16, 3, routing="none"),
            _case(20, 16, 16, 64), _case(33, 24, 40, 3, "transposed"),
            _case(30, 19, 21, 4, "strided"), _case(29, 48, 32, 5, bias=True, act="silu"),
            _case(19, 24, 16, 3, bias=True, act="gelu_tanh", out="fp32"),
            _case(40, 16, 16, 4, tail=7, bias=True), _case(24, 16, 16, 3, nonfinite=True),
            _case(70, 140, 130, 3, routing="skewed"),
            _case(0, 16, 16, 4), _case(10, 16, 16, 0), _case(12, 16, 0, 3, bias=True, act="silu"),
        ]
    out = _model_cases() if suite == "model" else _model_cases(tokens=MOE_TOKENS[:1])
    if suite == "full":
        for m, n, k, g in ((257, 509, 1021, 7), (1031, 4093, 257, 64), (3, 17, 127, 2)):
            out += [_case(m, n, k, g), _case(m, n, k, g, "transposed"),
                    _case(m, n, k, g, "strided"), _case(m, n, k, g, routing="skewed"),
                    _case(m, n, k, g, bias=True, act="silu", tail=m // 5),
                    _case(m, n, k, g, act="gelu", out="fp32", routing="lead_empty")]
        out.append(_case(1031, 1021, 509, 16, nonfinite=True))
        # out past 2^31 elements: 64-bit offsets (skipped on a CPU)
        out.append(_case(65537, 32771, 16, 4, bias=True, huge=True))
    return out


def make_inputs(case: Case, device) -> dict:
    """x [M, K] and w [G, N, K] as the case lays them out: contiguous; transposed (x
    column-major, w a [G, K, N] tensor transposed); strided (rows padded, NaN in the
    padding); group_offsets from group_sizes; bias [G, N] and the epilogue its flags name."""
    m, n, k, groups = case["m"], case["n"], case["k"], case["groups"]
    x = rand_tensor((m, k), case, device)
    w = rand_tensor((groups, n, k), case, device, salt=1, scale=k ** -0.5 if k else 1.0)
    if case.flag("nonfinite"):
        inject_nonfinite(x, case)
    bias = (rand_tensor((groups, n), case, device, salt=2, layout="contiguous")
            if case.flag("bias") else None)
    out = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(
        case.flag("out"))
    return {"x": x, "w": w, "group_offsets": offsets_of(group_sizes(case), device),
            "bias": bias, "activation": case.flag("act"), "out_dtype": out}


def cost(case: Case, mode: str) -> Cost:
    """FLOPs over the rows in groups; bytes read every group's weight once (the routed
    rows' experts: groups without rows are counted too) and write every row. Only the
    count of routed rows matters, so no routing is drawn (profile costs calls here)."""
    m, n, k, groups, e = case["m"], case["n"], case["k"], case["groups"], case.dtype.itemsize
    none = groups == 0 or (case.flag("routing") or "uniform") == "none"
    routed = 0 if none else m - int(case.flag("tail") or 0)
    out = {"fp32": 4, "fp16": 2, "bf16": 2}.get(case.flag("out"), e)
    act = {None: (0, 0), "silu": (4, 6), "gelu_tanh": (9, 10), "gelu": (5, 6)}[case.flag("act")]
    bias_b = groups * n * e if case.flag("bias") else 0
    if mode == "fwd":
        # read x, w, bias, the offsets; write out
        return Cost(flops=2 * routed * n * k + (act[0] + bool(case.flag("bias"))) * routed * n,
                    bytes=(m * k + groups * n * k) * e + bias_b + 4 * groups + m * n * out)
    # read dout (and act'), x, w (twice: dx and dw read it / write it); write dx, dw, dbias
    d_bytes = m * n * out if case.flag("act") else 0
    return Cost(flops=4 * routed * n * k + (act[1] + 1) * routed * n,
                bytes=m * n * out + d_bytes + (m * k + groups * n * k) * e * 2 + bias_b)


def skip(case: Case, device) -> str | None:
    return skip_huge_on_cpu(case, device)


def case_of(call: str, args) -> Case | None:
    """The Case of one call of the registered op (profile costs it through `cost`): the
    routing is not read (that would be a host sync), so it is costed as uniform."""
    if not is_call_of(call, "grouped_matmul"):
        return None
    x, w = args.get("x"), args.get("w")
    if x is None or w is None:
        return None
    out = args.get("out_dtype")
    flags = {"bias": args.get("bias") is not None or None, "act": args.get("activation"),
             "out": dtype_name(out) if out is not None and out != x.dtype else None}
    return Case("grouped_matmul", (("m", x.shape[0]), ("n", w.shape[1]), ("k", w.shape[2]),
                                   ("groups", w.shape[0])),
                dtype=x.dtype, flags={k: v for k, v in flags.items() if v is not None})


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """The expert projections of an MoE model at batch x seq tokens (top-k rows each),
    uniform routing; none for a dense model."""
    if not getattr(cfg, "experts", 0):
        return []
    rows = batch * seq * cfg.experts_per_token
    return [_case(rows, n, k, cfg.experts, model=cfg.name, proj=proj)
            for proj, n, k in expert_projections(cfg)]
