"""A team's own CUDA C++ op as `speedlight inspect --spec` reads it: the kernel's source
inline, its launch geometry, its design. Inspected only (nvcc, no GPU); never run here."""

from __future__ import annotations

import torch

from speedlight.spec import Case, Cost, CudaKernels, CudaLaunch, KernelDesign, OpSpec, rand_tensor

SOURCE = r"""
#include <cuda_bf16.h>
#include <cstdint>

// y[r, :] = x[r, :] * s, 8 bf16 (16 bytes) per thread per step; hidden % 8 == 0
template <typename T>
__global__ void scale_rows(const T* x, T* y, float s, int64_t rows, int64_t hidden) {
  const int64_t vecs = hidden / 8;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * hidden);
    uint4* yr = reinterpret_cast<uint4*>(y + row * hidden);
    for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
      uint4 v = xr[i];
      T* e = reinterpret_cast<T*>(&v);
      for (int k = 0; k < 8; ++k) e[k] = T(float(e[k]) * s);
      yr[i] = v;
    }
  }
}

template __global__ void scale_rows<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*,
                                                   float, int64_t, int64_t);
"""


def scale(x: torch.Tensor, s: float) -> torch.Tensor:
    raise RuntimeError("tests/inspect/cuda_spec.py is inspected only: its kernel is not built")


def _launches(case: Case, sm_count: int) -> list[CudaLaunch]:
    return [CudaLaunch("scale_rows", "__nv_bfloat16", min(case["rows"], 8 * sm_count), 128)]


SPEC = OpSpec(
    name="scale",
    impl=scale,
    reference=lambda x, s: x * s,
    make_inputs=lambda case, device: {"x": rand_tensor((case["rows"], case["hidden"]), case,
                                                       device), "s": 0.5},
    cost=lambda case, mode: Cost(case["rows"] * case["hidden"],
                                 2 * case["rows"] * case["hidden"] * case.dtype.itemsize),
    suites={"quick": lambda: [Case("scale", (("rows", 4096), ("hidden", 4096)))]},
    dtypes=(torch.bfloat16,),
    skip=lambda case, device: None if device.type == "cuda" else "needs a CUDA GPU",
    kernels={"scale_rows": KernelDesign(min_occupancy=0.5)},
    cuda=CudaKernels(SOURCE, _launches, of_impl=True),
)
