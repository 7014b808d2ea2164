"""Gated linear units, the activation of gated transformer MLPs: act(gate) * up.

Host code shared by speedlight.swiglu (act = silu) and speedlight.geglu (act = gelu, tanh
approximation or exact): launchers, the custom ops `speedlight::glu_fwd/glu_bwd`, input
checks, and the OpSpec builder both ops' specs come from.

gate and up are two tensors of one shape, or (up=None) one [..., 2 * I] tensor holding
gate then up on its last dim, as a fused gate_up projection writes it (Phi-3's
gate_up_proj; Hugging Face's `gate, up = x.chunk(2, -1)`). Both are read through their
strides, never copied; the backward of the fused form writes one [..., 2 * I] gradient.

Falcon-H1's `mlp_multipliers` fold in: gate_multiplier scales gate before the activation,
down_multiplier the unit's output (= the down projection's output when it has no bias):
act(gate_multiplier * gate) * up * down_multiplier, in fp32 and rounded once.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

import torch
import triton

from speedlight import shapes
from speedlight.kernels.glu import _glu_bwd_kernel, _glu_fwd_kernel
from speedlight.launch import as_rows, elementwise_tile
from speedlight.ops._checks import check_choice, check_same_device, check_same_dtype, check_tensor
from speedlight.ops._dtensor import local_rows
from speedlight.ops._suites import is_call_of, rows_case, skip_huge_on_cpu
from speedlight.ops.registration import like, register_op
from speedlight.runtime import check_runtime
from speedlight.spec import Case, Chain, Cost, OpSpec, inject_nonfinite, rand_tensor

ACTIVATIONS = ("silu", "gelu_tanh", "gelu")


def _halves(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up as views: the two halves of gate's last dim when up is None."""
    if up is not None:
        return gate, up
    n = gate.shape[-1] // 2
    return gate[..., :n], gate[..., n:]


def _grid(n_rows: int, n_cols: int, block_m: int, block_n: int) -> tuple[int, int]:
    # row blocks on grid axis 0 (up to 2^31 - 1 programs), column blocks on axis 1
    return triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n)


# --- launchers (usable without autograd) --------------------------------------------------

def glu_fwd(gate: torch.Tensor, up: torch.Tensor | None, activation: str,
            gate_multiplier: float = 1.0, down_multiplier: float = 1.0) -> torch.Tensor:
    """act(gate_multiplier * gate) * up * down_multiplier: contiguous, of the gate half's
    shape and gate's dtype."""
    g, u = _halves(gate, up)
    out = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    if out.numel() == 0:
        return out
    check_runtime(gate, _glu_fwd_kernel)
    n_cols = g.shape[-1]
    g2, u2, out2 = as_rows(g, n_cols), as_rows(u, n_cols), out.view(-1, n_cols)
    n_rows = g2.shape[0]
    block_m, block_n, num_warps = elementwise_tile(n_rows, n_cols, gate.device, max_block_n=1024)
    _glu_fwd_kernel[_grid(n_rows, n_cols, block_m, block_n)](
        g2, u2, out2, n_rows, n_cols, g2.stride(0), g2.stride(1), u2.stride(0), u2.stride(1),
        out2.stride(0), gate_multiplier, down_multiplier, ACTIVATION=activation,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return out


def glu_bwd(dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None,
            activation: str, gate_multiplier: float = 1.0, down_multiplier: float = 1.0
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dgate, dup), contiguous. When up is None, dgate is the one [..., 2 * I] gradient of
    the concatenated input (dgate then dup on the last dim) and dup is None."""
    g, u = _halves(gate, up)
    if up is None:
        dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        dg, du = _halves(dgate, None)
        dup = None
    else:
        dgate = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
        dup = torch.empty(u.shape, dtype=up.dtype, device=up.device)
        dg, du = dgate, dup
    if dg.numel() == 0:
        return dgate, dup
    check_runtime(gate, _glu_bwd_kernel)
    n_cols = g.shape[-1]
    do2, g2, u2 = as_rows(dout, n_cols), as_rows(g, n_cols), as_rows(u, n_cols)
    dg2, du2 = dg.reshape(-1, n_cols), du.reshape(-1, n_cols)  # views: halves of a buffer
    n_rows = g2.shape[0]
    block_m, block_n, num_warps = elementwise_tile(n_rows, n_cols, gate.device, max_block_n=1024)
    _glu_bwd_kernel[_grid(n_rows, n_cols, block_m, block_n)](
        do2, g2, u2, dg2, du2, n_rows, n_cols, do2.stride(0), do2.stride(1),
        g2.stride(0), g2.stride(1), u2.stride(0), u2.stride(1), dg2.stride(0), du2.stride(0),
        gate_multiplier, down_multiplier, ACTIVATION=activation, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return dgate, dup


# --- registration: custom ops, fakes and autograd -----------------------------------------

def _glu_fake(gate, up, activation, gate_multiplier=1.0, down_multiplier=1.0):
    g, _ = _halves(gate, up)
    return gate.new_empty(g.shape)


GLU = register_op(
    "glu",
    forward=glu_fwd,
    outputs=("out",),
    fake=_glu_fake,
    backward=glu_bwd,
    backward_fake=lambda dout, gate, up, *_: (like(gate), like(up)),
    grads=("gate", "up"),
)


# --- the checked entry point of swiglu and geglu ------------------------------------------

@local_rows("gate", "up")
def glu(gate: torch.Tensor, up: torch.Tensor | None, activation: str,
        gate_multiplier: float = 1.0, down_multiplier: float = 1.0) -> torch.Tensor:
    """act(gate_multiplier * gate) * up * down_multiplier after the input checks;
    `activation` one of ACTIVATIONS."""
    check_tensor("gate", gate, min_dim=1)
    if up is None:
        if gate.shape[-1] % 2:
            raise ValueError(f"with up=None, gate holds gate and up concatenated on its last "
                             f"dim, which must be even; got gate of shape {tuple(gate.shape)}")
    else:
        check_tensor("up", up)
        if up.shape != gate.shape:
            raise ValueError(f"up must have gate's shape {tuple(gate.shape)}, got "
                             f"{tuple(up.shape)}")
        check_same_dtype(gate=gate, up=up)
        check_same_device(gate=gate, up=up)
    check_choice("activation", activation, ACTIVATIONS)
    for name, value in (("gate_multiplier", gate_multiplier),
                        ("down_multiplier", down_multiplier)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"{name} must be a number (Falcon-H1's mlp_multipliers), "
                            f"got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    return GLU(gate, up, activation, float(gate_multiplier), float(down_multiplier))


# --- OpSpecs -----------------------------------------------------------------------------

# FLOP per element of act(g) and of act'(g) as kernels/glu.py computes them, a
# transcendental (exp, erf) and a reciprocal counting one each:
#   silu:      s (3), g * s;                  act': s(-g) (3), g *, 1 +, s *
#   gelu_tanh: z (5), s (3), g *;             act': dz (3), s(-z) (3), 3 *, +
#   gelu:      g / sqrt 2, erf, 1 +, / 2, g *; act': g^2, * -1/2, exp, g *, / sqrt(2 pi), +
_ACT_FLOPS = {"silu": (4, 6), "gelu_tanh": (9, 10), "gelu": (5, 6)}

# Falcon-H1's mlp_multipliers, as case flags and keyword arguments (absent: 1.0)
MULTIPLIERS = ("gate_multiplier", "down_multiplier")
# the quick and full suites' multiplier variant of every gated unit
MULTIPLIED = {"gate_multiplier": 0.75, "down_multiplier": 2.5}


def gated_chains(activation: str) -> Callable:
    """The recogniser of the gated unit whose activation PyTorch records as aten
    `activation` ("silu" for swiglu, "gelu" for geglu): act(gate) * up, two tensors of one
    shape (x * act(x) is an activation, not a gated unit). Inside a mixture of experts'
    block it is part of what moe_experts replaces."""
    name = {"silu": "swiglu", "gelu": "geglu"}[activation]

    def recognise(g, calls) -> list[Chain]:
        chains = []
        for r in g.fwd:
            if r["name"] != "mul" or len(r["inputs"]) != 2 \
                    or r["inputs"][0]["shape"] != r["inputs"][1]["shape"]:
                continue
            for k in (0, 1):
                act = g.input_base(r["index"], k)
                if g.name(act) != activation:
                    continue
                other = g.input_base(r["index"], 1 - k)
                if other is not None and other == g.input_base(act, 0):
                    continue
                fwd = {act, r["index"]} | g.views_between(act, r["index"])
                case = rows_case(name, g.tensor(g.row(act)["inputs"][0]), "intermediate")
                chains.append(Chain(f"{activation}(gate) * up", fwd, r["module"], case,
                                    inside=("moe_experts",)))
                break
        return chains
    return recognise


def glu_spec(name: str, impl: Callable, reference: Callable,
             activation_of: Callable[[Case], str], extra_kwargs: Callable[[Case], dict],
             flag_sets: list[dict], notes: str, flags_of: Callable[[str], dict | None],
             model_flags: Callable[[shapes.ModelConfig], dict | None] = lambda cfg: None,
             **fields) -> OpSpec:
    """The OpSpec of one gated unit. activation_of(case) names the kernel's activation and
    flags_of(activation) the case flags of a kernel activation (None: not this unit's);
    extra_kwargs(case) are the op's own keyword arguments (e.g. approximate); flag_sets are
    the op's variants, each run on the quick shapes; model_flags(cfg) gives the case flags
    of a model whose MLP is this unit, None when it is another; fields: more OpSpec
    fields (fuses, peers...)."""

    def make_inputs(case: Case, device) -> dict:
        rows, inter = case["rows"], case["intermediate"]
        concat = case.flag("concat", False)
        # gate spans the bend of the activation and both tails; up is a plain projection.
        # A handful of elements are drawn narrower: one gate deep in the negative tail would
        # make the only output an fp16 subnormal, whose relative error measures nothing.
        scale = 2.0 if rows * inter >= 8 else 1.0
        gate = rand_tensor((rows, 2 * inter if concat else inter), case, device, scale=scale)
        up = None if concat else rand_tensor((rows, inter), case, device, salt=3)
        if case.flag("nonfinite"):
            inject_nonfinite(gate, case)
            if up is not None:  # other positions than gate's
                inject_nonfinite(up, case.with_(seed=case.seed + 1))
        multipliers = {k: float(case.flag(k)) for k in MULTIPLIERS if case.flag(k) is not None}
        return {"gate": gate, "up": up, **extra_kwargs(case), **multipliers}

    def cost(case: Case, mode: str) -> Cost:
        m, n, e = case["rows"], case["intermediate"], case.dtype.itemsize
        act, dact = _ACT_FLOPS[activation_of(case)]
        k = sum(case.flag(name) is not None for name in MULTIPLIERS)  # one product each
        if mode == "fwd":
            # read gate, up; write out. FLOP per elem: act, * up, the multipliers.
            return Cost(flops=(act + 1 + k) * m * n, bytes=3 * m * n * e)
        # read dout, gate, up; write dgate, dup. FLOP per elem: act and act', 3 products,
        # the multipliers (twice each: the forward's, recomputed, and the chain rule's).
        return Cost(flops=(act + dact + 3 + 2 * k) * m * n, bytes=5 * m * n * e)

    def cases(suite: str) -> list[Case]:
        def case(rows, inter, layout="contiguous", model=None, **flags):
            return Case(name, (("rows", rows), ("intermediate", inter)), layout=layout,
                        flags=flags, model=model)

        points = shapes.rows_and_width(suite, "intermediate")
        out = []
        for rows, inter, model in points:
            cfg = shapes.MODELS.get(model) if model else None
            # Phi-3 projects gate and up with one matmul (gate_up_proj)
            fused = {"concat": True} if cfg is not None and cfg.hf_model_type == "phi3" else {}
            out.append(case(rows, inter, model=model, **fused))
        if suite == "quick":
            out += [case(37, 128, "strided"), case(5, 781, "transposed"), case(0, 128),
                    case(37, 128, concat=True), case(5, 781, "strided", concat=True),
                    case(4, 1000, "transposed", concat=True), case(0, 64, concat=True),
                    case(5, 781, nonfinite=True), case(3, 7, concat=True, nonfinite=True)]
            out += [case(5, 781, **flags) for flags in flag_sets]
            out.append(case(5, 781, **MULTIPLIED))
        if suite == "full":
            out += [case(r, w, "strided", concat=True) for r, w, m in points
                    if m is None and r * w <= 2**24]
            out += [case(3, 100003, "transposed"), case(257, 1021, nonfinite=True),
                    case(0, 4096)] + [case(257, 4093, **flags)
                                      for flags in flag_sets + [MULTIPLIED]]
            out.append(case(257, 1021, "strided", concat=True, **MULTIPLIED))
            # rows x row stride of the concatenated input > 2^31: 64-bit offsets
            out.append(case(32769, 32771, concat=True, huge=True))
        return out

    def for_model(cfg, batch: int, seq: int) -> list[Case]:
        flags = model_flags(cfg)
        if flags is None:
            return []
        if cfg.hf_model_type == "phi3":  # gate and up from one matmul (gate_up_proj)
            flags = dict(flags, concat=True)
        return [Case(name, (("rows", batch * seq), ("intermediate", cfg.intermediate)),
                     flags=flags, model=cfg.name)]

    def case_of(call: str, args) -> Case | None:
        """gate (and up) of a call of glu's registered ops, when its activation is ours."""
        flags = flags_of(args["activation"]) if is_call_of(call, "glu") else None
        if flags is None:
            return None
        if args["up"] is None:
            flags = dict(flags, concat=True)
        flags = dict(flags, **{k: args[k] for k in MULTIPLIERS if args.get(k, 1.0) != 1.0})
        g, _ = _halves(args["gate"], args["up"])
        return rows_case(name, g, "intermediate", **flags)

    return OpSpec(name=name, impl=impl, reference=reference, make_inputs=make_inputs,
                  cost=cost, suites=shapes.suites(cases), grad_inputs=("gate", "up"),
                  skip=skip_huge_on_cpu, notes=notes, for_model=for_model, case_of=case_of,
                  patches="mlp", **fields)
