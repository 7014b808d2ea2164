"""The row scale every norm kernel divides by before squaring (rms_norm.py, layer_norm.py),
and the one-reduction RMS statistic that needs it only when a row is extreme.

x^2 overflows float32 above |x| ~ 1.8e19 (the mean of squares becomes inf, rstd 0, and y
silently 0) and underflows below ~1e-19 (with eps = 0, rstd becomes inf). The scaled form
sums the squares of x / p, with p a power of two near the row's largest |x|, and folds p
back into rstd: rstd = (1/p) / sqrt(mean((x/p)^2) + eps/p^2). Scaling by a power of two is
exact, so wherever every square is a normal float each value (y, rstd, mean) is bit for bit
what the unscaled formula gives. The kernels therefore take the unscaled sum of squares
first, one reduction, and scale only the rows whose sum leaves [SUM_MIN, SUM_MAX] (or is
NaN): a max and a second sum, for those tiles alone.
"""

import triton
import triton.language as tl

# The unscaled sum of squares is used where it lies in [2^-64, 2^64]: a row of that sum has
# its largest |x| within [2^-32 / sqrt(n), 2^32], so no square overflows, and a square that
# is subnormal in either form (|x| < 2^-63, or < 2^-63 p) is below 2^-60 of the sum.
SUM_MIN = tl.constexpr(5.421010862427522e-20)  # 2^-64
SUM_MAX = tl.constexpr(1.8446744073709552e19)  # 2^64


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


@triton.jit
def _rms_rstd_scaled(x, n_cols, eps):
    """rstd [BM] = 1 / sqrt(mean(x^2) + eps) of a fp32 tile x [BM, BN] (masked lanes 0),
    summed over x / p: two reductions (the max, then the sum), right for any x."""
    # [BM, BN] -> [BM]: the scale p, then mean((x / p)^2) in [0, 4)
    p, inv_p = _pow2_scale(tl.max(tl.abs(x), axis=1), eps)
    xs = x * inv_p[:, None]
    mean_sq = tl.sum(xs * xs, axis=1) / n_cols
    return inv_p / tl.sqrt(mean_sq + eps * inv_p * inv_p)


@triton.jit
def _rms_rstd(x, mask_m, n_cols, eps):
    """_rms_rstd_scaled's rstd [BM], bit for bit, from one reduction on the common path:
    the unscaled sum of squares, and the scaled form only when a row of the tile needs it
    (its sum outside [SUM_MIN, SUM_MAX], or NaN). mask_m [BM]: the tile's rows that exist
    (a row past the end, all zeros, needs nothing)."""
    # [BM, BN] -> [BM]
    sum_sq = tl.sum(x * x, axis=1)
    unsafe = tl.where(mask_m & ((sum_sq < SUM_MIN) | (sum_sq > SUM_MAX) | (sum_sq != sum_sq)),
                      1, 0)
    # [BM] -> scalar: one branch for the whole tile
    if tl.max(unsafe, axis=0) != 0:
        rstd = _rms_rstd_scaled(x, n_cols, eps)
    else:
        rstd = 1.0 / tl.sqrt(sum_sq / n_cols + eps)
    return rstd
