"""The gated MLP's two projections in one kernel: out = act(x @ w_gate^T) * (x @ w_up^T).

Host code of kernels/matmul.py's _gated_matmul_kernel: the launcher `gated_matmul_fwd`
(usable without autograd), the registration (custom ops `speedlight::gated_matmul_fwd /
_infer / _bwd`, fake and autograd rule), the public `speedlight.gated_matmul`, and the
OpSpec. The weights are read
where they lie: two [I, H] weights (Llama's gate_proj and up_proj), or with w_up None one
[2I, H] weight whose first I rows are the gate and the rest the up projection (Phi-3's
gate_up_proj), never copied or concatenated.

Backward: the forward writes h = [g, u] ([M, 2I], one buffer, in x's dtype: what an
unfused MLP keeps) when a gradient is needed; then dgu = [dout * u * act'(g), dout *
act(g)] by the gated-unit backward kernel (ops/glu.py, fp32 inside, one rounding) and
  dx = dgu @ [w_gate; w_up]   (one GEMM over K = 2I for a [2I, H] weight; else the up
                                GEMM adds the gate GEMM's fp32 result as its residual)
  dW = dgu^T @ x              ([2I, H] in one GEMM, or each half into its own weight)
all on _matmul_kernel through strides.
"""

from __future__ import annotations

import math

import torch
import triton

from speedlight import shapes
from speedlight.kernels.matmul import _gated_matmul_kernel
from speedlight.ops._checks import check_choice, check_same_device, check_tensor
from speedlight.ops._suites import is_call_of, skip_huge_on_cpu
from speedlight.ops.glu import glu_bwd
from speedlight.ops._gemm import (ensure_allocator, gemm_config, gemm_configs, precision, programs,
                                  tma_layout, use_tma)
from speedlight.ops.matmul import ACTIVATIONS, DESIGN, matmul_fwd
from speedlight.ops.matmul_cases import MODEL_TOKENS
from speedlight.ops.registration import register_op
from speedlight.runtime import check_runtime, describe
from speedlight.spec import Case, Cost, OpSpec, inject_nonfinite, rand_tensor


def _halves(w_gate: torch.Tensor, w_up: torch.Tensor | None):
    """(gate, up) weights [I, H]: views of the two halves of a [2I, H] w_gate when w_up is None."""
    if w_up is not None:
        return w_gate, w_up
    n = w_gate.shape[0] // 2
    return w_gate[:n], w_gate[n:]


# --- launcher (usable without autograd) ----------------------------------------------------

def gated_matmul_fwd(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor | None,
                     activation: str, store_h: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, h) for 2-D x [M, H]: out = act(x @ wg^T) * (x @ wu^T) [M, I] contiguous in x's
    dtype, and with store_h h = [g, u] [M, 2I] (else None)."""
    wg, wu = _halves(w_gate, w_up)
    m, k = x.shape
    n = wg.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    h = torch.empty((m, 2 * n), dtype=x.dtype, device=x.device) if store_h else None
    if out.numel() == 0:
        return out, h
    if k == 0:  # g = u = 0: act(0) * 0 = 0
        out.zero_()
        if h is not None:
            h.zero_()
        return out, h
    check_runtime(x, _gated_matmul_kernel)
    cfg = gemm_config(GATED_MATMUL_CONFIGS, m, n, k, x.dtype, x.device, operands=2)
    h1 = h[:, :n] if h is not None else out
    h2 = h[:, n:] if h is not None else out
    x_lay, g_lay, u_lay = tma_layout(x), tma_layout(wg), tma_layout(wu)
    tma = (use_tma(x.device) and x_lay is not None and g_lay is not None and g_lay == u_lay
           and tma_layout(out) == "row" and tma_layout(h1) == "row" and tma_layout(h2) == "row")
    if tma and x.device.type == "cuda":
        ensure_allocator()
    num_tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    _gated_matmul_kernel[(programs(num_tiles, x.device),)](
        x, wg, wu, out, h1, h2, m, n, k, x.stride(0), x.stride(1), wg.stride(0), wg.stride(1),
        wu.stride(0), wu.stride(1), out.stride(0), h1.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        TMA=tma, X_KMAJOR=x_lay == "row", W_KMAJOR=g_lay == "row", ACTIVATION=activation,
        STORE_H=store_h, PRECISION=precision(x.dtype), **cfg.options())
    return out, h


def gated_matmul_bwd(dout: torch.Tensor, h: torch.Tensor, x: torch.Tensor,
                     w_gate: torch.Tensor, w_up: torch.Tensor | None, activation: str
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dx, dw_gate, dw_up) from the forward's h = [g, u]; dw_up None when w_up is None
    (then dw_gate is the [2I, H] gradient of the one weight)."""
    m, n = dout.shape
    if x.shape[1] == 0:  # H = 0: every gradient is empty
        return (torch.empty_like(x), torch.empty_like(w_gate),
                torch.empty_like(w_up) if w_up is not None else None)
    dgu, _ = glu_bwd(dout, h, None, activation)  # [dg, du], [M, 2I]
    dg, du = dgu[:, :n], dgu[:, n:]
    if w_up is None:
        dx = matmul_fwd(dgu, w_gate)[0]  # [M, 2I] @ [2I, H] -> [M, H]
        dwg = matmul_fwd(dgu.t(), x)[0]  # [2I, M] @ [M, H] -> [2I, H]
        return dx, dwg, None
    # dg @ wg in fp32, added by the up GEMM's epilogue: one rounding
    part = matmul_fwd(dg, w_gate, out_dtype=torch.float32)[0]
    dx = matmul_fwd(du, w_up, residual=part, out_dtype=x.dtype)[0]
    dwg = matmul_fwd(dg.t(), x)[0]  # [I, M] @ [M, H] -> [I, H]
    dwu = matmul_fwd(du.t(), x)[0]
    return dx, dwg, dwu


def _train_fwd(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor | None,
               activation: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward a backward follows: out and h = [g, u]."""
    return gated_matmul_fwd(x, w_gate, w_up, activation, store_h=True)


def _infer_fwd(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor | None,
               activation: str) -> torch.Tensor:
    """The forward when no gradient is needed: out alone, neither projection written."""
    return gated_matmul_fwd(x, w_gate, w_up, activation)[0]


def _fake(x, w_gate, w_up, activation):
    n = w_gate.shape[0] if w_up is not None else w_gate.shape[0] // 2
    return x.new_empty((x.shape[0], n)), x.new_empty((x.shape[0], 2 * n))


# the GEMM space and rule, with tuned tables of its own (speedlight tune sweeps it)
GATED_MATMUL_CONFIGS = gemm_configs("gated_matmul")

GATED_MATMUL = register_op(
    "gated_matmul",
    forward=_train_fwd,
    outputs=("out", "h"),
    stats=("h",),
    fake=_fake,
    inference=_infer_fwd,
    backward=gated_matmul_bwd,
    grads=("x", "w_gate", "w_up"),
)


# --- the public function -------------------------------------------------------------------

def gated_matmul(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor | None = None,
                 activation: str = "silu") -> torch.Tensor:
    """act(x @ w_gate^T) * (x @ w_up^T) in one kernel: both projections of a tile from one
    read of x, fp32 accumulators, one rounding; neither projection reaches memory.

    x: [..., H]; w_gate, w_up: [I, H] (nn.Linear's weight layout; any strides), or w_up
    None and w_gate [2I, H], gate rows then up rows (Phi-3's gate_up_proj). One dtype of
    float32, float16 or bfloat16. activation: "silu" (SwiGLU), "gelu_tanh" or "gelu"
    (GeGLU). Returns [..., I]. Differentiable in x and the weights; works under
    torch.compile(fullgraph=True).
    """
    check_tensor("x", x, min_dim=1)
    check_tensor("w_gate", w_gate)
    if w_gate.dim() != 2:
        raise ValueError(f"w_gate must be 2-D [I, H], got {describe(w_gate)}")
    if w_up is None:
        if w_gate.shape[0] % 2:
            raise ValueError(f"with w_up=None, w_gate holds the gate and up weights stacked "
                             f"[2I, H], so its first dim must be even; got {describe(w_gate)}")
    else:
        check_tensor("w_up", w_up)
        if w_up.shape != w_gate.shape:
            raise ValueError(f"w_up must have w_gate's shape {tuple(w_gate.shape)}, got "
                             f"{describe(w_up)}")
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if w is not None and w.dtype != x.dtype:
            raise TypeError(f"x and {name} must have one dtype (no mixed-precision GEMM): x "
                            f"has {x.dtype}, {name} has {w.dtype}")
    if x.shape[-1] != w_gate.shape[1]:
        raise ValueError(f"inner dimensions do not match: x is {tuple(x.shape)} (H = "
                         f"{x.shape[-1]}) but w_gate is {tuple(w_gate.shape)} (H = "
                         f"{w_gate.shape[1]})")
    check_choice("activation", activation, ACTIVATIONS)
    check_same_device(x=x, w_gate=w_gate, w_up=w_up)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(math.prod(lead), k)
    out = GATED_MATMUL(x2, w_gate, w_up, activation)
    return out.view(*lead, out.shape[-1])


# --- OpSpec ------------------------------------------------------------------------------

_ACT_FLOPS = {"silu": (4, 6), "gelu_tanh": (9, 10), "gelu": (5, 6)}


def _case(m, n, k, layout="contiguous", model=None, **flags) -> Case:
    return Case("gated_matmul", (("m", m), ("n", n), ("k", k)), layout=layout, flags=flags,
                model=model)


def _model_flags(cfg) -> dict | None:
    if cfg.mlp == "gelu":
        return None  # not gated
    flags = {"act": "gelu_tanh"} if cfg.mlp == "geglu" else {}
    if cfg.hf_model_type == "phi3":
        flags["concat"] = True
    return flags


def cases(suite: str) -> list[Case]:
    """n is the intermediate size I, k the hidden size H. quick: odd sizes, transposed
    and strided layouts, each activation, the [2I, H] weight, tiles few enough for the
    interpreter; model: every gated model's MLP at 1, 17, 512, 4096, 16384 tokens; full:
    model plus odd sizes."""
    shapes.check_suite(suite)
    if suite == "quick":
        # size-1 M and I with H = 16, not 1: each element of dx is a two-term sum
        # (dg wg + du wu), and one such sum cancelling makes the bf16 rounding of dg an O(1)
        # relative error for PyTorch and speedlight alike; over 16 elements the error
        # measures the kernel, not the luck of one cancellation.
        return [
            _case(1, 1, 16), _case(5, 7, 3), _case(37, 45, 70), _case(64, 64, 64),
            _case(33, 20, 17, "transposed"), _case(30, 19, 21, "strided"),
            _case(17, 48, 40, concat=True), _case(19, 33, 24, act="gelu_tanh"),
            _case(9, 40, 32, "transposed", act="gelu", concat=True),
            _case(0, 16, 16), _case(4, 0, 8), _case(4, 8, 0),
            _case(13, 24, 40, nonfinite=True), _case(9, 136, 130, concat=True),
        ]
    seen: dict[tuple, str] = {}
    for cfg in shapes.MODELS.values():
        flags = _model_flags(cfg)
        if flags is not None:
            seen.setdefault((cfg.intermediate, cfg.hidden, tuple(sorted(flags.items()))),
                            cfg.name)
    out = [_case(m, n, k, model=name, **dict(f)) for (n, k, f), name in seen.items()
           for m in MODEL_TOKENS]
    if suite == "full":
        for m, n, k in ((1, 1, 1), (3, 17, 127), (257, 509, 1021), (1031, 4093, 257)):
            out += [_case(m, n, k), _case(m, n, k, "transposed", concat=True),
                    _case(m, n, k, "strided", act="gelu_tanh"), _case(m, n, k, act="gelu")]
        out.append(_case(257, 1021, 509, nonfinite=True))
        # out and [g, u] past 2^31 elements: 64-bit offsets (skipped on a CPU)
        out.append(_case(65537, 32771, 16, huge=True))
    return out


def make_inputs(case: Case, device) -> dict:
    """x [M, H]; weights [I, H] (or one [2I, H] with concat) scaled by 1/sqrt(H) so the
    projections are O(1) and the gate spans the activation's bend: contiguous (row-major,
    nn.Linear's layout), transposed (x column-major, weights stored [H, I] and read
    transposed), strided (rows padded, NaN in the padding)."""
    m, n, k = case["m"], case["n"], case["k"]
    x = rand_tensor((m, k), case, device, scale=2.0)
    w_scale = 1.0 / max(1.0, k ** 0.5)
    rows = 2 * n if case.flag("concat") else n
    w_gate = rand_tensor((rows, k), case, device, salt=1, scale=w_scale)
    w_up = None if case.flag("concat") else rand_tensor((n, k), case, device, salt=2,
                                                        scale=w_scale)
    if case.flag("nonfinite"):
        inject_nonfinite(x, case)
    return {"x": x, "w_gate": w_gate, "w_up": w_up, "activation": case.flag("act", "silu")}


def cost(case: Case, mode: str) -> Cost:
    m, n, k, e = case["m"], case["n"], case["k"], case.dtype.itemsize
    act, dact = _ACT_FLOPS[case.flag("act", "silu")]
    if mode == "fwd":
        # read x, w_gate, w_up; write out. Two GEMMs, act and the product.
        return Cost(flops=4 * m * n * k + (act + 1) * m * n,
                    bytes=(m * k + 2 * n * k + m * n) * e)
    # read dout, h = [g, u] (2 M I), x, weights; write dx, dw_gate, dw_up. Four GEMMs,
    # dg and du (the [M, 2I] dgu they go through is counted neither way: a fused backward
    # would not write it).
    return Cost(flops=8 * m * n * k + (dact + 3) * m * n,
                bytes=(m * n + 2 * m * n + m * k + 2 * n * k + m * k + 2 * n * k) * e)


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    flags = _model_flags(cfg)
    if flags is None:
        return []
    return [_case(batch * seq, cfg.intermediate, cfg.hidden, model=cfg.name, **flags)]


def case_of(call: str, args) -> Case | None:
    """The Case of one call of the registered op (profile costs it through `cost`)."""
    if not is_call_of(call, "gated_matmul"):
        return None
    x, w_gate, w_up = args["x"], args["w_gate"], args.get("w_up")
    n = w_gate.shape[0] // 2 if w_up is None else w_gate.shape[0]
    flags = {"act": args["activation"] if args["activation"] != "silu" else None,
             "concat": True if w_up is None else None}
    return Case("gated_matmul", (("m", x.shape[0]), ("n", n), ("k", x.shape[1])),
                dtype=x.dtype, flags={k: v for k, v in flags.items() if v is not None})


SPEC = OpSpec(
    impl=gated_matmul,
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(cases),
    grad_inputs=("x", "w_gate", "w_up"),
    notes="act(x @ wg^T) * (x @ wu^T) with both projections of a tile in one program (two "
          "accumulators), split or stacked [2I, H] weights read in place; backward: the "
          "gated-unit kernel on the saved [g, u], then _matmul_kernel through strides.",
    family="compute-bound",
    for_model=for_model,
    case_of=case_of,
    fuses="gate_proj and up_proj matmuls + act(gate) * up",
    kernels={"_gated_matmul_kernel": DESIGN, "_matmul_kernel": DESIGN},
    count_rows=lambda case: case["m"],
    skip=skip_huge_on_cpu,
    aligned=lambda case: case.layout != "strided" and all(
        case[p] % 16 == 0 for p in ("m", "n", "k")),
    configs=GATED_MATMUL_CONFIGS,
)
