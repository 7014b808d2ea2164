"""The logit soft-cap, softcap * tanh(x / softcap), with its derivative: one rounding of it
for every kernel that applies one (cross-entropy's and linear cross-entropy's logits,
attention's scores; the Gluon attention's helper reads the same constants)."""

import triton
import triton.language as tl

# tanh(y) = y * P(y^2) for |y| < TANH_SPLIT: the Taylor series through y^17, within 3 ulp
# of tanh in fp32 there (its next term is below 2^-25 of y); above it tanh(|y|) = 1 - r
# with r = 2 / (exp(2|y|) + 1), and 1 - tanh^2 = r * (2 - r) keeps full precision as
# tanh -> 1.
TANH_SPLIT = tl.constexpr(0.625)
TANH_T1 = tl.constexpr(-0.3333333333333333)
TANH_T2 = tl.constexpr(0.13333333333333333)
TANH_T3 = tl.constexpr(-0.05396825396825397)
TANH_T4 = tl.constexpr(0.021869488536155203)
TANH_T5 = tl.constexpr(-0.008863235529902197)
TANH_T6 = tl.constexpr(0.003592128036572481)
TANH_T7 = tl.constexpr(-0.0014558343870513183)
TANH_T8 = tl.constexpr(0.000590027440945586)


@triton.jit
def tanh_softcap(x, softcap):
    """(c, dc/dx) = (softcap * tanh(x / softcap), 1 - tanh^2(x / softcap)), fp32.

    +-inf maps to +-softcap with derivative 0; NaN stays NaN.
    """
    y = x / softcap
    a = tl.abs(y)
    r = 2.0 / (tl.exp(2.0 * a) + 1.0)  # 1 - tanh(|y|); 0 when exp overflows
    y2 = y * y
    p = TANH_T8 * y2 + TANH_T7
    p = p * y2 + TANH_T6
    p = p * y2 + TANH_T5
    p = p * y2 + TANH_T4
    p = p * y2 + TANH_T3
    p = p * y2 + TANH_T2
    p = p * y2 + TANH_T1
    small = y * (p * y2 + 1.0)
    near_zero = a < TANH_SPLIT
    t = tl.where(near_zero, small, tl.where(y < 0, r - 1.0, 1.0 - r))
    dt = tl.where(near_zero, 1.0 - small * small, r * (2.0 - r))
    return softcap * t, dt
