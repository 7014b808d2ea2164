"""The row scale every norm kernel divides by before squaring (rms_norm.py, layer_norm.py).

x^2 overflows float32 above |x| ~ 1.8e19 (the mean of squares becomes inf, rstd 0, and y
silently 0) and underflows below ~1e-19 (with eps = 0, rstd becomes inf). Each kernel
therefore sums the squares of x / p, with p a power of two near the row's largest |x|, and
folds p back into rstd: rstd = (1/p) / sqrt(mean((x/p)^2) + eps/p^2). Scaling by a power of
two is exact, so wherever nothing overflowed before, every value (y, rstd, mean) is bit for
bit what the unscaled formula gives; the scale costs a max over the row, no extra pass.
"""

import triton
import triton.language as tl


@triton.jit
def _pow2_scale(max_abs, eps):
    """(p, 1/p) for a row whose largest |x| is max_abs (a scalar or one per row).

    p is the power of two at or below max_abs, held within [2^-126, 2^126] (both p and 1/p
    normal floats, and (x/p)^2 < 4 for any finite x) and not below ~sqrt(eps)/2, so that
    eps/p^2 <= 4 cannot overflow either. A NaN or inf max gives a p that keeps the row's
    NaN/inf result what float64's is (inf: rstd 0; NaN: NaN).
    """
    m = tl.maximum(max_abs, tl.maximum(tl.sqrt(eps), 1.1754943508222875e-38))  # 2^-126
    m = tl.minimum(m, 8.507059173023462e37)  # 2^126
    exponent = m.to(tl.int32, bitcast=True) & 0x7F800000
    # 1/p: biased exponent 254 - e, i.e. (254 << 23) - (e << 23)
    inverse = 0x7F000000 - exponent
    return exponent.to(tl.float32, bitcast=True), inverse.to(tl.float32, bitcast=True)
