// The torch binding of speedlight's CUDA C++ RMSNorm (rms_norm.cu, interface in rms_norm.h).
//
// Thin on purpose: each function checks what the launchers assume (CUDA tensors on one
// device, [rows, hidden] with stride 1 along a row, one dtype), maps the dtype, and calls the
// launcher on the current stream with the geometry the Python launcher sized
// (speedlight/ops/rms_norm.py). Allocation happens in Python, so verify's poisoned
// allocations see every output.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "rms_norm.h"

namespace {

using speedlight::DType;

DType dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default:
      TORCH_CHECK(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  }
}

// A [rows, hidden] tensor of `like`'s dtype on its device, each row contiguous.
void check_rows(const at::Tensor& t, const char* name, const at::Tensor& like, int64_t rows,
                int64_t hidden) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), ", x on ", like.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(),
              ", x has ", like.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == hidden, name,
              " must have shape [", rows, ", ", hidden, "], got ", t.sizes());
  TORCH_CHECK(t.stride(1) == 1 || hidden == 1, name,
              " must have stride 1 along a row, got strides ", t.strides());
}

void check_fp32(const at::Tensor& t, const char* name, const at::Tensor& like,
                at::IntArrayRef shape) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous() && t.sizes() == shape, name, " must be contiguous of shape ",
              shape, ", got ", t.sizes());
}

const void* weight_ptr(const c10::optional<at::Tensor>& w, const at::Tensor& x) {
  if (!w.has_value()) return nullptr;
  TORCH_CHECK(w->is_cuda() && w->device() == x.device(), "weight must be on ", x.device());
  TORCH_CHECK(w->scalar_type() == x.scalar_type(), "weight has dtype ", w->scalar_type(),
              ", x has ", x.scalar_type());
  TORCH_CHECK(w->is_contiguous() && w->dim() == 1 && w->size(0) == x.size(1),
              "weight must be contiguous of shape [", x.size(1), "], got ", w->sizes());
  return w->data_ptr();
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

// y = RMSNorm(x [+ residual]) with h = x + residual written when residual is given.
void fwd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
         const c10::optional<at::Tensor>& weight, at::Tensor& y,
         const c10::optional<at::Tensor>& h, const c10::optional<at::Tensor>& rstd,
         double eps, double offset, int64_t grid, int64_t threads) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  check_rows(x, "x", x, rows, hidden);
  check_rows(y, "y", x, rows, hidden);
  TORCH_CHECK(residual.has_value() == h.has_value(), "residual and h come together");
  if (residual.has_value()) {
    check_rows(*residual, "residual", x, rows, hidden);
    check_rows(*h, "h", x, rows, hidden);
  }
  if (rstd.has_value()) check_fp32(*rstd, "rstd", x, {rows});
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(speedlight::rms_norm_fwd(
      dtype_of(x, "x"), x.data_ptr(), x.stride(0),
      residual ? residual->data_ptr() : nullptr, residual ? residual->stride(0) : 0,
      weight_ptr(weight, x), y.data_ptr(), y.stride(0),
      h ? h->data_ptr() : nullptr, h ? h->stride(0) : 0,
      rstd ? rstd->data_ptr<float>() : nullptr, rows, hidden, static_cast<float>(eps),
      static_cast<float>(offset), static_cast<int>(grid), static_cast<int>(threads),
      c10::cuda::getCurrentCUDAStream()), "rms_norm_fwd");
}

// dx (and, with a weight, dw_partial [grid, hidden] fp32) of RMSNorm; dh added when given.
void bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
         const at::Tensor& rstd, const c10::optional<at::Tensor>& dh, at::Tensor& dx,
         const c10::optional<at::Tensor>& dw_partial, double offset, int64_t grid,
         int64_t threads) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  check_rows(x, "x", x, rows, hidden);
  check_rows(dy, "dy", x, rows, hidden);
  check_rows(dx, "dx", x, rows, hidden);
  if (dh.has_value()) check_rows(*dh, "dh", x, rows, hidden);
  check_fp32(rstd, "rstd", x, {rows});
  TORCH_CHECK(weight.has_value() == dw_partial.has_value(), "weight and dw_partial come together");
  if (dw_partial.has_value()) check_fp32(*dw_partial, "dw_partial", x, {grid, hidden});
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(speedlight::rms_norm_bwd(
      dtype_of(x, "x"), dy.data_ptr(), dy.stride(0), x.data_ptr(), x.stride(0),
      weight_ptr(weight, x), rstd.data_ptr<float>(), dh ? dh->data_ptr() : nullptr,
      dh ? dh->stride(0) : 0, dx.data_ptr(), dx.stride(0),
      dw_partial ? dw_partial->data_ptr<float>() : nullptr, rows, hidden,
      static_cast<float>(offset), static_cast<int>(grid), static_cast<int>(threads),
      c10::cuda::getCurrentCUDAStream()), "rms_norm_bwd");
}

// dw [hidden] (weight's dtype) = the sum of dw_partial [parts, hidden] over parts.
void dw_reduce(const at::Tensor& dw_partial, at::Tensor& dw, int64_t grid, int64_t threads) {
  TORCH_CHECK(dw_partial.is_cuda() && dw_partial.scalar_type() == at::kFloat &&
                  dw_partial.dim() == 2 && dw_partial.is_contiguous(),
              "dw_partial must be a contiguous [parts, hidden] float32 CUDA tensor");
  TORCH_CHECK(dw.is_contiguous() && dw.dim() == 1 && dw.size(0) == dw_partial.size(1) &&
                  dw.device() == dw_partial.device(),
              "dw must be contiguous of shape [", dw_partial.size(1), "] on ",
              dw_partial.device());
  const c10::cuda::CUDAGuard guard(dw.device());
  check_launch(speedlight::rms_norm_dw_reduce(
      dtype_of(dw, "dw"), dw_partial.data_ptr<float>(), dw_partial.size(0), dw_partial.size(1),
      dw.data_ptr(), static_cast<int>(grid), static_cast<int>(threads),
      c10::cuda::getCurrentCUDAStream()), "rms_norm_dw_reduce");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "speedlight's CUDA C++ RMSNorm (forward, backward, dw reduction)";
  m.def("fwd", &fwd, "RMSNorm forward (optionally over x + residual)");
  m.def("bwd", &bwd, "RMSNorm backward: dx and per-program dw partial sums");
  m.def("dw_reduce", &dw_reduce, "dw from the per-program partial sums");
}
