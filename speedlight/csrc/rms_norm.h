// speedlight's CUDA C++ RMSNorm: the host launchers the kernels in rms_norm.cu define.
//
// Torch-free: nvcc compiles rms_norm.cu alone (so a machine without CUDA torch can compile
// and inspect it); the torch binding (rms_norm_binding.cpp) calls these launchers. Every
// launch geometry (grid, threads per block) is chosen in Python by speedlight's launch
// sizing and passed in, so `speedlight inspect` reads the kernel a user would run.
//
// Rows are the leading dims flattened; a row's elements are contiguous (stride 1); rows are
// `*_row_stride` elements apart (64-bit). Accumulation is fp32 whatever the storage dtype.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace speedlight {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Forward, over h = x + residual when residual is not null (h written to h_out), else over x:
//   y = h * rstd * (w + offset),  rstd = 1 / sqrt(mean(h^2) + eps)   (w null: no weight)
// rstd [rows] fp32 is written when not null (a backward will read it).
cudaError_t rms_norm_fwd(DType dtype, const void* x, int64_t x_row_stride,
                         const void* residual, int64_t residual_row_stride,
                         const void* w, void* y, int64_t y_row_stride,
                         void* h_out, int64_t h_row_stride, float* rstd,
                         int64_t rows, int64_t hidden, float eps, float offset,
                         int grid, int threads, cudaStream_t stream);

// Backward: dx = rstd * (w' * dy - h * rstd^2 * mean(w' * dy * h)) + dh,  w' = w + offset
// (dh null: no second gradient path). dx may alias dy (each element of dy is read before
// the element of dx at the same place is written). With a weight, each of the `grid`
// programs writes its partial sum of dy * h * rstd per column into dw_partial [grid, hidden]
// fp32 (no atomics); rms_norm_dw_reduce then sums the partials into dw.
cudaError_t rms_norm_bwd(DType dtype, const void* dy, int64_t dy_row_stride,
                         const void* x, int64_t x_row_stride, const void* w,
                         const float* rstd, const void* dh, int64_t dh_row_stride,
                         void* dx, int64_t dx_row_stride, float* dw_partial,
                         int64_t rows, int64_t hidden, float offset,
                         int grid, int threads, cudaStream_t stream);

// dw[c] = sum over p < parts of dw_partial[p, c], rounded once to dtype.
cudaError_t rms_norm_dw_reduce(DType dtype, const float* dw_partial, int64_t parts,
                               int64_t hidden, void* dw, int grid, int threads,
                               cudaStream_t stream);

}  // namespace speedlight
