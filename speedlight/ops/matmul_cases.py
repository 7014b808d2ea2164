"""matmul's cases and cost: the suites (every model's projections among them), the
inputs of a case (fp8 operands with their scales), what cannot run where, the FLOPs and
bytes of a call, the Case of a call and a model's cases. The OpSpec that uses them is
declared in ops/matmul.py."""

from __future__ import annotations

import torch

from speedlight import shapes
from speedlight.ops._gemm import FP8_DTYPES, default_out_dtype
from speedlight.ops._suites import is_call_of, skip_huge_on_cpu
from speedlight.spec import Case, Cost, dtype_name, inject_nonfinite, rand_tensor

# FLOP per output element of each activation (and its derivative), as kernels/glu.py
# computes them (glu.py's table)
_ACT_FLOPS = {None: (0, 0), "silu": (4, 6), "gelu_tanh": (9, 10), "gelu": (5, 6)}

MODEL_TOKENS = (1, 17, 512, 4096, 16384)


def projections(cfg: shapes.ModelConfig) -> list[tuple[str, int, int]]:
    """(name, N, K) of every projection of a model's layer and its head: qkv (fused),
    o, gate/up (each), down, lm_head."""
    qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
    return [("qkv", qkv, cfg.hidden), ("o", cfg.hidden, cfg.heads * cfg.head_dim),
            ("up", cfg.intermediate, cfg.hidden), ("down", cfg.hidden, cfg.intermediate),
            ("lm_head", cfg.vocab, cfg.hidden)]


def _model_points() -> list[tuple[int, int, int, str, str]]:
    """(M, N, K, model, projection) over every model at MODEL_TOKENS, each distinct
    (N, K) once (the first model that has it)."""
    seen: dict[tuple[int, int], tuple[str, str]] = {}
    for cfg in shapes.MODELS.values():
        for proj, n, k in projections(cfg):
            seen.setdefault((n, k), (cfg.name, proj))
    return [(m, n, k, model, proj) for (n, k), (model, proj) in seen.items()
            for m in MODEL_TOKENS]


def _case(m, n, k, layout="contiguous", model=None, **flags) -> Case:
    return Case("matmul", (("m", m), ("n", n), ("k", k)), layout=layout, flags=flags,
                model=model)


def cases(suite: str) -> list[Case]:
    """quick: odd M, N, K, transposed and strided operands, each epilogue, tiles few
    enough for the interpreter; model: every model's projections (linear: b = W^T, as
    nn.Linear runs) at 1, 17, 512, 4096, 16384 tokens with the epilogue each takes in a
    model (bias where GPT-2 has one; none else), and the gated MLP's activations on up;
    full: model plus odd sizes with every epilogue."""
    shapes.check_suite(suite)
    if suite == "quick":
        return [
            _case(1, 1, 1), _case(5, 7, 3), _case(37, 45, 70), _case(64, 64, 64, linear=True),
            _case(33, 20, 17, "transposed"), _case(30, 19, 21, "strided"),
            _case(17, 48, 40, linear=True, bias=True, act="silu"),
            _case(19, 33, 24, bias=True, act="gelu_tanh", residual=True),
            _case(9, 40, 32, "transposed", act="gelu", scale=0.5),
            _case(16, 24, 36, residual=True, out="fp32"),
            _case(0, 16, 16), _case(4, 0, 8), _case(4, 8, 0, bias=True, act="silu"),
            _case(13, 24, 40, nonfinite=True),
            _case(9, 140, 130, linear=True, bias=True),  # two column tiles, a k loop
            # K-major, K a multiple of 16: fp8 runs these too (per-tensor scales, and per
            # row / column with `rowscale`, which only fp8 takes); amax of the output
            _case(17, 48, 32, linear=True, bias=True, act="silu", amax=True),
            _case(19, 33, 48, linear=True, rowscale=True, act="gelu_tanh", residual=True,
                  amax=True),
            _case(9, 40, 16, linear=True, rowscale=True, scale=0.5, out="fp32"),
        ]
    out = [_case(m, n, k, model=model, linear=True, proj=proj)
           for m, n, k, model, proj in _model_points()]
    if suite == "full":
        for m, n, k in ((1, 1, 1), (3, 17, 127), (257, 509, 1021), (1031, 4093, 257)):
            out += [_case(m, n, k), _case(m, n, k, "transposed"), _case(m, n, k, "strided"),
                    _case(m, n, k, linear=True, bias=True, act="silu", residual=True),
                    _case(m, n, k, act="gelu_tanh", scale=0.125),
                    _case(m, n, k, act="gelu", out="fp32")]
        out.append(_case(257, 1021, 509, nonfinite=True))
        # c past 2^31 elements: 64-bit offsets (skipped on a CPU)
        out.append(_case(65537, 32771, 16, bias=True, huge=True))
    return out


def make_inputs(case: Case, device) -> dict:
    """a [M, K] and b [K, N] as the case lays them out: contiguous (row-major), transposed
    (both column-major), strided (rows padded, NaN in the padding), linear (b = W^T of a
    row-major W [N, K], as nn.Linear multiplies); the epilogue's inputs its flags name.
    fp8: a, b of N(0, 1) values rounded to e4m3, with their dequantization scales in
    [0.25, 1.25) (not powers of two: the fp32 multiply rounds), one per tensor (a 0-d
    scale_a, a [1] scale_b) or, with `rowscale`, [M, 1] and [1, N]; bias and residual in
    bf16, the output's dtype."""
    m, n, k = case["m"], case["n"], case["k"]
    fp8 = case.dtype in FP8_DTYPES
    a = rand_tensor((m, k), case, device)
    if case.flag("linear"):
        b = rand_tensor((n, k), case, device, salt=1, layout="contiguous").t()
    else:
        b = rand_tensor((k, n), case, device, salt=1)
    if case.flag("nonfinite"):
        inject_nonfinite(a, case)
    scales = {}
    if fp8:
        per_row = case.flag("rowscale")
        draw = lambda shape, salt: rand_tensor(  # noqa: E731
            shape, case, device, dtype=torch.float32, layout="contiguous", salt=salt,
            dist="uniform", shift=0.25)
        scales = {"scale_a": draw((m, 1) if per_row else (), 4),
                  "scale_b": draw((1, n) if per_row else (1,), 5)}
    # bias and residual of the order of a @ b (whose elements are ~sqrt(K))
    mag = max(1.0, k ** 0.5)
    side = torch.bfloat16 if fp8 else None
    bias = rand_tensor((n,), case, device, dtype=side, salt=2, scale=mag,
                       layout="contiguous") if case.flag("bias") else None
    residual = rand_tensor((m, n), case, device, dtype=side, salt=3, scale=mag) \
        if case.flag("residual") else None
    out = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(
        case.flag("out"))
    extra = {"return_amax": True} if case.flag("amax") else {}
    return {"a": a, "b": b, "bias": bias, "activation": case.flag("act"), "residual": residual,
            "scale": case.flag("scale"), "out_dtype": out, **scales, **extra}


def skip(case: Case, device) -> str | None:
    """Why a case cannot run here: fp8 takes K-major operands with K a multiple of 16 and
    has no Inf; per-row scales are fp8's; the 64-bit case needs a GPU."""
    if case.dtype in FP8_DTYPES:
        if case.layout != "contiguous" or not case.flag("linear"):
            return ("fp8 operands are K-major (a row-major, b = W^T of a row-major W [N, K]), "
                    "as TMA and fp8 wgmma read them; this case lays them out otherwise")
        if case["k"] % 16:
            return (f"fp8 rows are 16-byte TMA rows: K must be a multiple of 16, this case "
                    f"has K = {case['k']}")
        if case.flag("nonfinite"):
            return "float8_e4m3fn has no Inf to inject (it saturates at 448)"
    elif case.flag("rowscale"):
        return "per-row scales dequantize fp8 operands; this case runs in fp8 only"
    return skip_huge_on_cpu(case, device)


def cost(case: Case, mode: str) -> Cost:
    """fp8: a and b are 1 byte an element, everything else (bias, residual, the output
    and the backward's dy, act') 2 (bf16) unless `out` says otherwise; the scales' 4-byte
    values and the dequantization's multiply count too."""
    m, n, k, e = case["m"], case["n"], case["k"], case.dtype.itemsize
    fp8 = case.dtype in FP8_DTYPES
    side = 2 if fp8 else e  # bias, residual: bf16 beside fp8 operands
    out = {"fp32": 4, "fp16": 2, "bf16": 2}.get(case.flag("out"), side)
    act, dact = _ACT_FLOPS[case.flag("act")]
    epi = (act + bool(case.flag("bias")) + bool(case.flag("residual"))
           + bool(case.flag("scale")) + 2 * fp8 + bool(case.flag("amax"))) * m * n
    bias_b = n * side if case.flag("bias") else 0
    res_b = m * n * side if case.flag("residual") else 0
    scale_b = ((m + n) * 4 if case.flag("rowscale") else 8) if fp8 else 0
    if mode == "fwd":
        # read a, b, their scales, bias, residual; write c (and amax)
        return Cost(flops=2 * m * n * k + epi, bytes=(m * k + k * n) * e + scale_b + bias_b
                    + res_b + m * n * out + 4 * bool(case.flag("amax")))
    # read dy (and act' when there is an activation), a, b; write da, db, dbias, dresidual
    d_bytes = m * n * out if case.flag("act") else 0
    return Cost(flops=4 * m * n * k + (dact + 1) * m * n,
                bytes=m * n * out + d_bytes + (m * k + k * n) * e * 2 + bias_b + res_b)


def case_of(call: str, args) -> Case | None:
    """The Case of one call of the registered op (profile costs it through `cost`)."""
    if not is_call_of(call, "matmul"):
        return None
    a, b = args["a"], args["b"]
    out = args.get("out_dtype")
    scale_a = args.get("scale_a")
    flags = {"bias": args.get("bias") is not None or None, "act": args.get("activation"),
             "residual": args.get("residual") is not None or None, "scale": args.get("scale"),
             "out": dtype_name(out) if out is not None and out != default_out_dtype(a.dtype)
             else None,
             "rowscale": scale_a is not None and scale_a.numel() > 1 or None,
             "amax": bool(args.get("return_amax")) or None}
    return Case("matmul", (("m", a.shape[0]), ("n", b.shape[1]), ("k", a.shape[1])),
                dtype=a.dtype, flags={k: v for k, v in flags.items() if v is not None})


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    return [_case(batch * seq, n, k, model=cfg.name, linear=True, proj=proj)
            for proj, n, k in projections(cfg)]
