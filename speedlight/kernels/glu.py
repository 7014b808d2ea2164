"""Triton kernels of the gated linear units of transformer MLPs: out = act(gate) * up,
act one of silu (SwiGLU), gelu with the tanh approximation or exact gelu (GeGLU), with
Falcon-H1's multipliers folded in: out = act(gate_multiplier * gate) * up * down_multiplier
(the down projection being linear, its output's multiplier may scale its input instead).

Elementwise over [rows, n_cols] tiles, every pointer with its own strides, so gate and up
may be two halves of one [rows, 2 * n_cols] projection output (or any other views) and
the backward may write dgate and dup into the two halves of one buffer.
"""

import triton
import triton.language as tl

# constants of the gelus (a kernel reads module globals only when they are constexpr)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi), of the tanh approximation
GELU_CUBIC = tl.constexpr(0.044715)
SQRT_HALF = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)


@triton.jit
def _glu_activation(g, ACTIVATION: tl.constexpr):
    """act(g) and act'(g) for fp32 g; the forward leaves act' unused, and the compiler drops it.

    silu(g)      = g * s(g), s the sigmoid;  silu'(g) = s(g) * (1 + g * s(-g))
    gelu_tanh(g) = g * s(2u), u = sqrt(2/pi) * (g + 0.044715 g^3)  (0.5 (1 + tanh u) = s(2u))
                   gelu_tanh'(g) = s(2u) + g * s(2u) * s(-2u) * 2 du/dg
    gelu(g)      = g * P(g), P(g) = (1 + erf(g / sqrt 2)) / 2;  gelu'(g) = P(g) + g * phi(g)
    s(-z) is evaluated as its own sigmoid, not as 1 - s(z), so it keeps its digits in the
    tails; at g = +-inf act' is NaN and act(-inf) is NaN, as torch computes them.
    """
    if ACTIVATION == "silu":
        s = tl.sigmoid(g)
        act = g * s
        dact = s * (1.0 + g * tl.sigmoid(-g))
    elif ACTIVATION == "gelu_tanh":
        z = 2.0 * SQRT_2_OVER_PI * (g + GELU_CUBIC * g * g * g)
        dz = 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * g * g)
        s = tl.sigmoid(z)
        act = g * s
        dact = s + g * s * tl.sigmoid(-z) * dz
    else:
        tl.static_assert(ACTIVATION == "gelu", "ACTIVATION must be silu, gelu_tanh or gelu")
        cdf = 0.5 * (1.0 + tl.erf(g * SQRT_HALF))
        act = g * cdf
        dact = cdf + g * tl.exp(-0.5 * g * g) * INV_SQRT_2PI
    return act, dact


@triton.jit
def _glu_load_tile(gate_ptr, up_ptr, n_rows, n_cols, stride_gm, stride_gn, stride_um, stride_un,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's [BLOCK_M, BLOCK_N] tile: its rows [BM, 1] and cols [1, BN] (int64
    offsets), its mask, and gate and up over it in fp32. Tile (i, j) is program (i, j)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < n_rows)[:, None] & (offs_n < n_cols)[None, :]
    rows = offs_m.to(tl.int64)[:, None]
    cols = offs_n.to(tl.int64)[None, :]
    g = tl.load(gate_ptr + rows * stride_gm + cols * stride_gn, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows * stride_um + cols * stride_un, mask=mask, other=0.0).to(tl.float32)
    return rows, cols, mask, g, u


@triton.jit
def _glu_fwd_kernel(
    gate_ptr, up_ptr, out_ptr,
    n_rows, n_cols, stride_gm, stride_gn, stride_um, stride_un, stride_om,
    gate_multiplier, down_multiplier,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out = act(gate_multiplier * gate) * up * down_multiplier, in fp32, rounded once.

    gate_ptr, up_ptr [n_rows, n_cols] (own strides), out_ptr [n_rows, n_cols] (row stride
    stride_om, unit column stride). The grid is (cdiv(n_rows, BLOCK_M), cdiv(n_cols,
    BLOCK_N)), one [BLOCK_M, BLOCK_N] tile per program. ACTIVATION selects act at compile time.
    The multipliers are runtime floats (1.0 without them: exact, so the plain unit's values).
    """
    rows, cols, mask, g, u = _glu_load_tile(gate_ptr, up_ptr, n_rows, n_cols, stride_gm,
                                            stride_gn, stride_um, stride_un, BLOCK_M, BLOCK_N)
    act, _ = _glu_activation(g * gate_multiplier, ACTIVATION)
    tl.store(out_ptr + rows * stride_om + cols,
             (act * u * down_multiplier).to(out_ptr.dtype.element_ty), mask=mask)


# Backward of out = act(a) * up * m_d, a = m_g * gate:
#   dup   = dout * m_d * act(a)
#   dgate = dout * m_d * up * act'(a) * m_g
# act is recomputed from gate (reading gate costs what reading a saved act would).

@triton.jit
def _glu_bwd_kernel(
    dout_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr,
    n_rows, n_cols, stride_dom, stride_don, stride_gm, stride_gn, stride_um, stride_un,
    stride_dgm, stride_dum, gate_multiplier, down_multiplier,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dgate and dup, computed in fp32 and rounded once.

    dout_ptr, gate_ptr, up_ptr [n_rows, n_cols] (own strides); dgate_ptr, dup_ptr
    [n_rows, n_cols] (row strides stride_dgm, stride_dum, unit column stride: two halves of
    one [n_rows, 2 * n_cols] buffer when the forward took one concatenated input).
    Grid, ACTIVATION and the multipliers as in _glu_fwd_kernel.
    """
    rows, cols, mask, g, u = _glu_load_tile(gate_ptr, up_ptr, n_rows, n_cols, stride_gm,
                                            stride_gn, stride_um, stride_un, BLOCK_M, BLOCK_N)
    do = tl.load(dout_ptr + rows * stride_dom + cols * stride_don, mask=mask,
                 other=0.0).to(tl.float32) * down_multiplier
    act, dact = _glu_activation(g * gate_multiplier, ACTIVATION)
    tl.store(dgate_ptr + rows * stride_dgm + cols,
             (do * u * dact * gate_multiplier).to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + rows * stride_dum + cols, (do * act).to(dup_ptr.dtype.element_ty),
             mask=mask)
