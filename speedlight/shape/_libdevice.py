"""Stand-ins for the libdevice functions inductor's kernels call, for the Triton interpreter
only (it runs no libdevice function: they are calls into NVIDIA's bitcode). Each is written
in Triton's own math, close enough for what shape runs inductor's kernels for on a CPU
(where each access lands and how many bytes it moves; the values are not checked). The
kernels compiled for the target GPU keep libdevice.
"""

import triton
import triton.language as tl


@triton.jit
def rsqrt(x):
    return tl.rsqrt(x)


@triton.jit
def sqrt(x):
    return tl.sqrt(x)


@triton.jit
def exp(x):
    return tl.exp(x)


@triton.jit
def exp2(x):
    return tl.exp2(x)


@triton.jit
def expm1(x):
    return tl.exp(x) - 1.0


@triton.jit
def log(x):
    return tl.log(x)


@triton.jit
def log2(x):
    return tl.log2(x)


@triton.jit
def log1p(x):
    return tl.log(1.0 + x)


@triton.jit
def sin(x):
    return tl.sin(x)


@triton.jit
def cos(x):
    return tl.cos(x)


@triton.jit
def erf(x):
    return tl.erf(x)


@triton.jit
def tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def pow(x, y):
    return tl.exp2(y * tl.log2(x))


@triton.jit
def floor(x):
    return tl.floor(x)


@triton.jit
def ceil(x):
    return tl.ceil(x)


@triton.jit
def isnan(x):
    return x != x


@triton.jit
def isinf(x):
    return tl.abs(x) == float("inf")


@triton.jit
def nearbyint(x):
    return tl.floor(x + 0.5)
