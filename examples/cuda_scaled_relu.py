"""A team's own CUDA C++ kernel through speedlight's tools, exactly as a Triton kernel:

    speedlight verify --spec examples/cuda_scaled_relu.py --only-spec
    speedlight bench --spec examples/cuda_scaled_relu.py --only-spec
    speedlight inspect --spec examples/cuda_scaled_relu.py --target sm_90a

scale * relu(x), forward and backward, in CUDA C++: the kernels in cuda_scaled_relu.cu
(torch-free, so nvcc compiles and inspect reads them on any machine), the torch binding
inline below, both built with torch.utils.cpp_extension.load_inline on the first call on a
CUDA machine (speedlight.csrc.loader: cached per torch/CUDA/arch, build time recorded
apart). On a CPU, or with a CPU build of torch, verify and bench record every case as
skipped with the reason; nothing is built at import.
"""

from pathlib import Path

import torch
import triton

from speedlight import shapes
from speedlight.csrc import loader
from speedlight.launch import CUDA_TYPES, extension_kernel, planned_sm_count
from speedlight.spec import Case, Cost, CudaKernels, CudaLaunch, KernelDesign, OpSpec, rand_tensor

KERNELS = Path(__file__).with_name("cuda_scaled_relu.cu")
THREADS = 256
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

# The binding: torch tensors -> the launchers of cuda_scaled_relu.cu, on the current stream.
BINDING = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

extern "C" cudaError_t scaled_relu_fwd(int, const void*, void*, int64_t, float, int, int,
                                       cudaStream_t);
extern "C" cudaError_t scaled_relu_bwd(int, const void*, const void*, void*, int64_t, float,
                                       int, int, cudaStream_t);

void check(const torch::Tensor& t, const torch::Tensor& x, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == x.device(), name, " must be on ", x.device());
  TORCH_CHECK(t.is_contiguous() && t.numel() == x.numel() && t.scalar_type() == x.scalar_type(),
              name, " must be contiguous, of x's size and dtype");
}

void fwd(torch::Tensor x, torch::Tensor y, int64_t dtype, double scale, int64_t grid,
         int64_t threads) {
  check(x, x, "x");
  check(y, x, "y");
  const c10::cuda::CUDAGuard guard(x.device());
  cudaError_t err = scaled_relu_fwd(dtype, x.data_ptr(), y.data_ptr(), x.numel(), scale, grid,
                                    threads, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "scaled_relu_fwd: ", cudaGetErrorString(err));
}

void bwd(torch::Tensor x, torch::Tensor dy, torch::Tensor dx, int64_t dtype, double scale,
         int64_t grid, int64_t threads) {
  check(x, x, "x");
  check(dy, x, "dy");
  check(dx, x, "dx");
  const c10::cuda::CUDAGuard guard(x.device());
  cudaError_t err = scaled_relu_bwd(dtype, x.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                    x.numel(), scale, grid, threads,
                                    c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "scaled_relu_bwd: ", cudaGetErrorString(err));
}
"""

_EXT = {}


def _extension():
    """The built extension's launch functions (built on the first call, counted as launches)."""
    if not _EXT:
        module = loader.load_inline("example_scaled_relu", cpp_sources=BINDING,
                                    cuda_sources=KERNELS.read_text(), functions=["fwd", "bwd"])
        _EXT["fwd"] = extension_kernel(module.fwd, "scaled_relu_fwd")
        _EXT["bwd"] = extension_kernel(module.bwd, "scaled_relu_bwd")
    return _EXT


def grid_for(numel: int, itemsize: int, sm_count: int) -> int:
    """A grid-stride grid: one 16-byte vector per thread per step, at most 8 blocks of
    THREADS per SM (2048 resident threads)."""
    per_block = THREADS * 16 // itemsize
    return max(1, min(triton.cdiv(numel, per_block), 8 * sm_count))


def _grid(x: torch.Tensor) -> int:
    return grid_for(x.numel(), x.element_size(), planned_sm_count(x.device))


def _launch(x: torch.Tensor, scale: float, dy: torch.Tensor | None = None) -> torch.Tensor:
    reason = loader.unavailable(x.device)
    if reason:
        raise loader.CudaBuildError(f"scaled_relu: {reason}")
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        ext = _extension()
        if dy is None:
            ext["fwd"](x, out, DTYPES[x.dtype], scale, _grid(x), THREADS)
        else:
            ext["bwd"](x, dy.contiguous(), out, DTYPES[x.dtype], scale, _grid(x), THREADS)
    return out


class _ScaledRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return _launch(x, scale)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _launch(x, ctx.scale, dy), None


def scaled_relu(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    """scale * relu(x) by the CUDA C++ kernels (x float32/float16/bfloat16 on a CUDA device)."""
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    return _ScaledRelu.apply(x, float(scale))


def scaled_relu_reference(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    return scale * torch.relu(x)


def _cases(suite):
    return [Case("scaled_relu", {"rows": r, "cols": c}, model=m)
            for r, c, m in shapes.rows_and_width(suite, "intermediate")]


def _launches(case: Case, sm_count: int) -> list[CudaLaunch]:
    """What _launch launches for a case on a GPU of sm_count SMs (inspect compiles the .cu
    and judges these): the forward, then the backward."""
    n, dtype = case["rows"] * case["cols"], case.dtype
    if n == 0:
        return []
    grid = grid_for(n, dtype.itemsize, sm_count)
    t = CUDA_TYPES[dtype]
    return [CudaLaunch("scaled_relu_kernel", f"{t}, false", grid, THREADS),
            CudaLaunch("scaled_relu_kernel", f"{t}, true", grid, THREADS, direction="bwd")]


SPEC = OpSpec(
    name="scaled_relu",
    impl=lambda x, scale: scaled_relu(x, scale),
    reference=lambda x, scale: scaled_relu_reference(x, scale),
    make_inputs=lambda case, device: {
        "x": rand_tensor((case["rows"], case["cols"]), case, device), "scale": 2.0},
    # forward: read x, write y (2 FLOP/elem); backward: read x, dy, write dx (2 FLOP/elem)
    cost=lambda case, mode: Cost(2 * case["rows"] * case["cols"],
                                 (2 if mode == "fwd" else 3) * case["rows"] * case["cols"]
                                 * case.dtype.itemsize),
    suites=shapes.suites(_cases),
    grad_inputs=("x",),
    # the kernels are impl's own (of_impl): verify and bench run impl as a CUDA C++
    # implementation (skipped with the reason where it cannot run), inspect reads the .cu
    cuda=CudaKernels(str(KERNELS), _launches, of_impl=True),
    kernels={"scaled_relu_kernel": KernelDesign(min_occupancy=0.5)},
)
