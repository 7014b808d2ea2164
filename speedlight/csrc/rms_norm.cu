// speedlight's CUDA C++ RMSNorm: the kernels and host launchers declared in rms_norm.h.
//
// Torch-free: `nvcc -cubin -arch=sm_90a speedlight/csrc/rms_norm.cu` compiles it alone.
// Launch geometry (grid, threads) comes from the caller (cuda_row_launch and
// cuda_column_launch in speedlight/ops/rms_norm_cuda.py), so what `speedlight inspect`
// reads is what a user runs.
//
// Shape of the work: a persistent grid over rows. Program p (one thread block) handles
// rows p, p + grid, p + 2 grid, ...; within a row each thread moves 16-byte vectors
// (8 bf16 / 8 fp16 / 4 fp32) at vector indices t, t + threads, ... and a scalar tail covers
// the hidden % vector elements that remain. A row whose pointers are not all 16-byte
// aligned (an odd row stride, an offset view) takes the scalar path for the whole row.
// Sums are fp32: a warp-shuffle reduction, then one value per warp in shared memory.
// Offsets are 64-bit (row * row_stride can pass 2^31 elements).
//
// `// speedlight: scalar` marks a line, or the block it opens, whose global accesses are
// narrower than 16 bytes by design (the scalar tail and misaligned rows, a row's rstd, what
// a program does once): `speedlight inspect` holds every other access to 128 bits.
#include "rms_norm.h"

#include "device.h"

namespace speedlight {
namespace {

constexpr int kMaxThreads = 1024;
// The forward's register cap (speedlight.launch.CUDA_FWD_REGISTERS sizes its grid by it):
// 48 holds kHeld vectors of a row per thread without spills on sm_80 to sm_100a (ptxas's
// own choice under __launch_bounds__(1024) is 32 on sm_100a, with spills) and keeps 40 of
// 64 warps resident. The backward compiles under __launch_bounds__(1024): at most 64
// (CUDA_BWD_REGISTERS).
constexpr int kFwdRegisters = 48;
// __maxnreg__ needs nvcc 12.4 or later; an older nvcc builds the forward under
// __launch_bounds__(1024, 1) (at most 64 registers: the grid may then take a partial
// second wave).
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)
#define SPEEDLIGHT_FWD_REGISTER_CAP __maxnreg__(kFwdRegisters)
#else
#define SPEEDLIGHT_FWD_REGISTER_CAP __launch_bounds__(kMaxThreads, 1)
#endif
// The backward sums dw in shared memory (hidden fp32 values per program) up to this size;
// wider rows accumulate in the program's own row of dw_partial in global memory instead.
constexpr int64_t kMaxSharedDwBytes = 96 * 1024;

// --- scalar paths ------------------------------------------------------------------------

// The scalar paths: a row's elements from `from` on (the tail after its vectors, or the
// whole row when its pointers are not 16-byte aligned), thread t taking from + t,
// from + t + blockDim.x, ... Functions of their own so that the SASS attributes their
// accesses to these marked lines (inlined: a call would spill around it on sm_100a).

// Forward pass 1: this thread's sum of h^2, h = x + residual rounded to T as the residual
// stream stores it (written to h_row), else x.
template <typename T>
__device__ __forceinline__ float fwd_sum_sq_scalar(const T* x_row, const T* res_row, T* h_row,
                                                int64_t from, int64_t hidden) {
  float sum_sq = 0.0f;
  for (int64_t j = from + threadIdx.x; j < hidden; j += blockDim.x) {  // speedlight: scalar
    float h = to_float(x_row[j]);
    if (res_row != nullptr) {
      const T hj = from_float<T>(h + to_float(res_row[j]));
      h_row[j] = hj;
      h = to_float(hj);
    }
    sum_sq += h * h;
  }
  return sum_sq;
}

// Forward pass 2: y = h * r * (w + offset) (w null: y = h * r).
template <typename T>
__device__ __forceinline__ void fwd_write_scalar(const T* h_row, const T* w, T* y_row, float r,
                                              float offset, int64_t from, int64_t hidden) {
  for (int64_t j = from + threadIdx.x; j < hidden; j += blockDim.x) {  // speedlight: scalar
    const float scale = w != nullptr ? to_float(w[j]) + offset : 1.0f;
    y_row[j] = from_float<T>(to_float(h_row[j]) * r * scale);
  }
}

// Backward pass 1: this thread's sum of w' * dy * h.
template <typename T>
__device__ __forceinline__ float bwd_dot_scalar(const T* dy_row, const T* x_row, const T* w,
                                             float offset, int64_t from, int64_t hidden) {
  float dot = 0.0f;
  for (int64_t j = from + threadIdx.x; j < hidden; j += blockDim.x) {  // speedlight: scalar
    const float wk = w != nullptr ? to_float(w[j]) + offset : 1.0f;
    dot += wk * to_float(dy_row[j]) * to_float(x_row[j]);
  }
  return dot;
}

// Backward pass 2: dx = r * (w' * dy - h * c) (+ dh), and dw_acc[j] += dy * h * r when
// dw_acc is not null (shared or global memory: a generic pointer).
template <typename T>
__device__ __forceinline__ void bwd_write_scalar(const T* dy_row, const T* x_row, const T* w,
                                              const T* dh_row, T* dx_row, float* dw_acc,
                                              float r, float c, float offset, int64_t from,
                                              int64_t hidden) {
  for (int64_t j = from + threadIdx.x; j < hidden; j += blockDim.x) {  // speedlight: scalar
    const float g = to_float(dy_row[j]);
    const float h = to_float(x_row[j]);
    const float wk = w != nullptr ? to_float(w[j]) + offset : 1.0f;
    float d = r * (wk * g - h * c);
    if (dh_row != nullptr) d += to_float(dh_row[j]);
    dx_row[j] = from_float<T>(d);
    if (dw_acc != nullptr) dw_acc[j] += g * h * r;
  }
}

// --- forward -----------------------------------------------------------------------------

// Vectors of a row each thread keeps in registers between the forward's two passes: with
// cuda_row_launch's ~2 vectors per thread, every row up to 2048 vectors (hidden
// 16384 in bf16) is read once; longer rows re-read the rest (mostly from L2).
constexpr int kHeld = 2;

// Vector i of a row's h: x, or x + residual rounded to T (as the residual stream stores
// it), also written to h_row.
template <typename T>
__device__ __forceinline__ Vec<T> load_h(const T* x_row, const T* res_row, T* h_row,
                                         int64_t i) {
  Vec<T> h = load_vec(x_row, i);  // [kVec] of one row
  if (res_row != nullptr) {
    const Vec<T> res = load_vec(res_row, i);
#pragma unroll
    for (int k = 0; k < Vec<T>::kSize; ++k) {
      h.v[k] = from_float<T>(to_float(h.v[k]) + to_float(res.v[k]));
    }
    store_vec(h_row, i, h);
  }
  return h;
}

template <typename T>
__device__ __forceinline__ float sum_squares(const Vec<T>& v) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < Vec<T>::kSize; ++k) s += to_float(v.v[k]) * to_float(v.v[k]);
  return s;
}

// y_row's vector i = h * r * (w + offset) (w null: h * r).
template <typename T>
__device__ __forceinline__ void write_y(T* y_row, const T* w, int64_t i, const Vec<T>& h,
                                        float r, float offset) {
  Vec<T> y;
  if (w != nullptr) {
    const Vec<T> wv = load_vec(w, i);
#pragma unroll
    for (int k = 0; k < Vec<T>::kSize; ++k) {
      y.v[k] = from_float<T>(to_float(h.v[k]) * r * (to_float(wv.v[k]) + offset));
    }
  } else {
#pragma unroll
    for (int k = 0; k < Vec<T>::kSize; ++k) y.v[k] = from_float<T>(to_float(h.v[k]) * r);
  }
  store_vec(y_row, i, y);
}

// y = h * rstd * (w + offset), rstd = 1 / sqrt(mean(h^2) + eps), h = x (+ residual).
//
// x, residual, y, h_out: [rows, hidden], rows `*_row_stride` elements apart, unit column
// stride; w [hidden] or null; residual null: no residual (h_out unused); rstd [rows] fp32
// or null. Block: any multiple of 32 threads up to 1024; grid: any (programs loop over rows).
// Pass 1 reads x (and residual, writing h) and keeps each thread's first kHeld vectors of
// h in registers; pass 2 writes y from them, reading back only what a row has beyond them
// (x, or the h this thread wrote itself at the same places).
template <typename T>
__global__ void SPEEDLIGHT_FWD_REGISTER_CAP
rms_norm_fwd_kernel(const T* x, int64_t x_row_stride, const T* residual,
                    int64_t residual_row_stride, const T* w, T* y, int64_t y_row_stride,
                    T* h_out, int64_t h_row_stride, float* rstd, int64_t rows,
                    int64_t hidden, float eps, float offset) {
  constexpr int kVec = Vec<T>::kSize;
  __shared__ float scratch[kMaxThreads / kWarp];
  const int64_t n_vec = hidden / kVec;
  const int64_t tail = n_vec * kVec;
  const bool has_res = residual != nullptr;
  const bool w_vec = w == nullptr || aligned16(w);

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * x_row_stride;
    const T* res_row = has_res ? residual + row * residual_row_stride : nullptr;
    T* h_row = has_res ? h_out + row * h_row_stride : nullptr;
    T* y_row = y + row * y_row_stride;
    const bool vec = w_vec && aligned16(x_row) && aligned16(y_row) &&
                     (!has_res || (aligned16(res_row) && aligned16(h_row)));
    const T* src_row = has_res ? h_row : x_row;  // what pass 2 reads h from

    // pass 1: sum of h^2, keeping this thread's first kHeld vectors of h in registers
    float sum_sq = 0.0f;
    int64_t rest = 0;
    Vec<T> held[kHeld];
    if (vec) {
#pragma unroll
      for (int c = 0; c < kHeld; ++c) {
        const int64_t i = threadIdx.x + c * static_cast<int64_t>(blockDim.x);
        if (i < n_vec) {
          held[c] = load_h(x_row, res_row, h_row, i);
          sum_sq += sum_squares(held[c]);
        }
      }
      for (int64_t i = threadIdx.x + kHeld * static_cast<int64_t>(blockDim.x); i < n_vec;
           i += blockDim.x) {
        sum_sq += sum_squares(load_h(x_row, res_row, h_row, i));
      }
      rest = tail;
    }
    if (rest < hidden) {  // speedlight: scalar
      sum_sq += fwd_sum_sq_scalar(x_row, res_row, h_row, rest, hidden);
    }
    sum_sq = block_sum(sum_sq, scratch);
    const float r = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
    if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;  // speedlight: scalar

    // pass 2: y = h * r * (w + offset), from the held vectors, then (rows longer than
    // kHeld vectors per thread) from h read back: x, or the h this thread wrote in pass 1
    if (vec) {
#pragma unroll
      for (int c = 0; c < kHeld; ++c) {
        const int64_t i = threadIdx.x + c * static_cast<int64_t>(blockDim.x);
        if (i < n_vec) write_y(y_row, w, i, held[c], r, offset);
      }
      for (int64_t i = threadIdx.x + kHeld * static_cast<int64_t>(blockDim.x); i < n_vec;
           i += blockDim.x) {
        write_y(y_row, w, i, load_vec(src_row, i), r, offset);
      }
    }
    if (rest < hidden) {  // speedlight: scalar
      fwd_write_scalar(src_row, w, y_row, r, offset, rest, hidden);
    }
  }
}

// --- backward ----------------------------------------------------------------------------

// dx = rstd * (w' * dy - h * rstd^2 * mean(w' * dy * h)) + dh,  w' = w + offset,
// and (w not null) this program's dw partial: sum over its rows of dy * h * rstd per column.
//
// dy, x (= h), dh, dx: [rows, hidden], own row strides, unit column stride; w [hidden] or
// null; rstd [rows] fp32; dh null: none; dw_partial [gridDim.x, hidden] fp32 (row p written
// by program p only, every column, zeros when it had no rows). dx may alias dy: each thread
// reads dy at a place before it writes dx there, and no thread reads it after.
// kSharedDw: the partial sums in dynamic shared memory (hidden fp32), written out once at
// the end; else in dw_partial's row directly (rows too wide for shared memory).
template <typename T, bool kSharedDw>
__global__ void __launch_bounds__(kMaxThreads)
rms_norm_bwd_kernel(const T* dy, int64_t dy_row_stride, const T* x, int64_t x_row_stride,
                    const T* w, const float* rstd, const T* dh, int64_t dh_row_stride, T* dx,
                    int64_t dx_row_stride, float* dw_partial, int64_t rows, int64_t hidden,
                    float offset) {
  constexpr int kVec = Vec<T>::kSize;
  __shared__ float scratch[kMaxThreads / kWarp];
  extern __shared__ float4 shared_dw[];  // [hidden / 4, rounded up] when kSharedDw
  const int64_t n_vec = hidden / kVec;
  const int64_t tail = n_vec * kVec;
  const bool has_w = w != nullptr;
  const bool has_dh = dh != nullptr;
  float* dw_acc = nullptr;  // [hidden]: this program's running dw sums
  if (has_w) {
    dw_acc = kSharedDw ? reinterpret_cast<float*>(shared_dw)
                       : dw_partial + static_cast<int64_t>(blockIdx.x) * hidden;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {  // speedlight: scalar
      dw_acc[j] = 0.0f;
    }
    // the first row's block_sum barrier orders these zeros before any accumulation
  }
  // dw_acc is updated a float4 at a time on the vector path: its row must be aligned too
  const bool w_vec = !has_w || (aligned16(w) && aligned16(dw_acc));

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dy_row = dy + row * dy_row_stride;
    const T* x_row = x + row * x_row_stride;
    const T* dh_row = has_dh ? dh + row * dh_row_stride : nullptr;
    T* dx_row = dx + row * dx_row_stride;
    const bool vec = w_vec && aligned16(dy_row) && aligned16(x_row) && aligned16(dx_row) &&
                     (!has_dh || aligned16(dh_row));
    const float r = rstd[row];  // speedlight: scalar

    // pass 1: sum of w' * dy * h
    float dot = 0.0f;
    int64_t rest = 0;
    if (vec) {
      for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) {
        const Vec<T> dyv = load_vec(dy_row, i);
        const Vec<T> xv = load_vec(x_row, i);
        Vec<T> wv;
        if (has_w) wv = load_vec(w, i);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float wk = has_w ? to_float(wv.v[k]) + offset : 1.0f;
          dot += wk * to_float(dyv.v[k]) * to_float(xv.v[k]);
        }
      }
      rest = tail;
    }
    if (rest < hidden) {  // speedlight: scalar
      dot += bwd_dot_scalar(dy_row, x_row, w, offset, rest, hidden);
    }
    dot = block_sum(dot, scratch);
    const float c = dot / static_cast<float>(hidden) * r * r;

    // pass 2: dx, and dw's partial sums
    if (vec) {
      for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) {
        const Vec<T> dyv = load_vec(dy_row, i);
        const Vec<T> xv = load_vec(x_row, i);
        Vec<T> wv, dhv;
        if (has_w) wv = load_vec(w, i);
        if (has_dh) dhv = load_vec(dh_row, i);
        Vec<T> dxv;
        float dw_row[kVec];  // this row's dy * h * rstd at the vector's columns
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float g = to_float(dyv.v[k]);
          const float h = to_float(xv.v[k]);
          const float wk = has_w ? to_float(wv.v[k]) + offset : 1.0f;
          float d = r * (wk * g - h * c);
          if (has_dh) d += to_float(dhv.v[k]);
          dxv.v[k] = from_float<T>(d);
          dw_row[k] = g * h * r;
        }
        store_vec(dx_row, i, dxv);
        if (has_w) {
          float4* acc = reinterpret_cast<float4*>(dw_acc + i * kVec);  // [kVec / 4]
#pragma unroll
          for (int q = 0; q < kVec / 4; ++q) {
            float4 a = acc[q];
            a.x += dw_row[4 * q];
            a.y += dw_row[4 * q + 1];
            a.z += dw_row[4 * q + 2];
            a.w += dw_row[4 * q + 3];
            acc[q] = a;
          }
        }
      }
    }
    if (rest < hidden) {  // speedlight: scalar
      bwd_write_scalar(dy_row, x_row, w, dh_row, dx_row, dw_acc, r, c, offset, rest, hidden);
    }
    // the next row's block_sum barrier orders these dw_acc updates before the next ones
    // (a row on the scalar path gives a column to another thread than a vector row does)
  }

  if (kSharedDw && has_w) {
    __syncthreads();
    float* out = dw_partial + static_cast<int64_t>(blockIdx.x) * hidden;
    const float* acc = reinterpret_cast<const float*>(shared_dw);
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {  // speedlight: scalar
      out[j] = acc[j];
    }
  }
}

// dw[c] = sum over p < parts of dw_partial[p, c], rounded once to T. A block takes 32
// columns at a time, one per lane (each warp reads 128 contiguous bytes of a partial row),
// and splits the parts among its warps; the warps' sums meet in shared memory. Blocks
// walk column tiles b, b + grid, ... Block: any multiple of 32 threads up to 1024.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
rms_norm_dw_reduce_kernel(const float* dw_partial, int64_t parts, int64_t hidden, T* dw) {
  __shared__ float sums[kMaxThreads / kWarp][kWarp];  // [warp][lane]
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarp;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kWarp; first < hidden;
       first += step) {
    const int64_t col = first + lane;
    float sum = 0.0f;
    if (col < hidden) {
#pragma unroll 4
      for (int64_t p = warp; p < parts; p += warps) sum += dw_partial[p * hidden + col];
    }
    sums[warp][lane] = sum;
    __syncthreads();
    if (warp == 0) {
      for (int k = 1; k < warps; ++k) sum += sums[k][lane];
      if (col < hidden) dw[col] = from_float<T>(sum);  // speedlight: scalar
    }
    __syncthreads();  // sums is free again for the next tile
  }
}

// --- host launchers ----------------------------------------------------------------------

bool valid_geometry(int grid, int threads) {
  return grid > 0 && threads > 0 && threads <= kMaxThreads && threads % kWarp == 0;
}

template <typename T>
cudaError_t launch_fwd(const void* x, int64_t x_row_stride, const void* residual,
                       int64_t residual_row_stride, const void* w, void* y,
                       int64_t y_row_stride, void* h_out, int64_t h_row_stride, float* rstd,
                       int64_t rows, int64_t hidden, float eps, float offset, int grid,
                       int threads, cudaStream_t stream) {
  rms_norm_fwd_kernel<T><<<grid, threads, 0, stream>>>(
      static_cast<const T*>(x), x_row_stride, static_cast<const T*>(residual),
      residual_row_stride, static_cast<const T*>(w), static_cast<T*>(y), y_row_stride,
      static_cast<T*>(h_out), h_row_stride, rstd, rows, hidden, eps, offset);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_bwd(const void* dy, int64_t dy_row_stride, const void* x,
                       int64_t x_row_stride, const void* w, const float* rstd, const void* dh,
                       int64_t dh_row_stride, void* dx, int64_t dx_row_stride,
                       float* dw_partial, int64_t rows, int64_t hidden, float offset,
                       int grid, int threads, cudaStream_t stream) {
  const int64_t dw_bytes = (hidden + 3) / 4 * static_cast<int64_t>(sizeof(float4));
  const bool shared_dw = w != nullptr && dw_bytes <= kMaxSharedDwBytes;
  if (shared_dw) {
    auto kernel = rms_norm_bwd_kernel<T, true>;
    const int smem = static_cast<int>(dw_bytes);
    cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    kernel<<<grid, threads, smem, stream>>>(
        static_cast<const T*>(dy), dy_row_stride, static_cast<const T*>(x), x_row_stride,
        static_cast<const T*>(w), rstd, static_cast<const T*>(dh), dh_row_stride,
        static_cast<T*>(dx), dx_row_stride, dw_partial, rows, hidden, offset);
  } else {
    rms_norm_bwd_kernel<T, false><<<grid, threads, 0, stream>>>(
        static_cast<const T*>(dy), dy_row_stride, static_cast<const T*>(x), x_row_stride,
        static_cast<const T*>(w), rstd, static_cast<const T*>(dh), dh_row_stride,
        static_cast<T*>(dx), dx_row_stride, dw_partial, rows, hidden, offset);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dw_reduce(const float* dw_partial, int64_t parts, int64_t hidden, void* dw,
                             int grid, int threads, cudaStream_t stream) {
  rms_norm_dw_reduce_kernel<T><<<grid, threads, 0, stream>>>(dw_partial, parts, hidden,
                                                             static_cast<T*>(dw));
  return cudaGetLastError();
}

}  // namespace

cudaError_t rms_norm_fwd(DType dtype, const void* x, int64_t x_row_stride,
                         const void* residual, int64_t residual_row_stride, const void* w,
                         void* y, int64_t y_row_stride, void* h_out, int64_t h_row_stride,
                         float* rstd, int64_t rows, int64_t hidden, float eps, float offset,
                         int grid, int threads, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;  // nothing to do: no launch
  if (!valid_geometry(grid, threads) || rows < 0 || hidden < 0 ||
      (residual != nullptr && h_out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
    case DType::kFloat32:
      return launch_fwd<float>(x, x_row_stride, residual, residual_row_stride, w, y,
                               y_row_stride, h_out, h_row_stride, rstd, rows, hidden, eps,
                               offset, grid, threads, stream);
    case DType::kFloat16:
      return launch_fwd<__half>(x, x_row_stride, residual, residual_row_stride, w, y,
                                y_row_stride, h_out, h_row_stride, rstd, rows, hidden, eps,
                                offset, grid, threads, stream);
    case DType::kBFloat16:
      return launch_fwd<__nv_bfloat16>(x, x_row_stride, residual, residual_row_stride, w, y,
                                       y_row_stride, h_out, h_row_stride, rstd, rows, hidden,
                                       eps, offset, grid, threads, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t rms_norm_bwd(DType dtype, const void* dy, int64_t dy_row_stride, const void* x,
                         int64_t x_row_stride, const void* w, const float* rstd,
                         const void* dh, int64_t dh_row_stride, void* dx,
                         int64_t dx_row_stride, float* dw_partial, int64_t rows,
                         int64_t hidden, float offset, int grid, int threads,
                         cudaStream_t stream) {
  if (hidden == 0 || (rows == 0 && w == nullptr)) return cudaSuccess;
  // rows == 0 with a weight still launches: every program writes its zero dw partial
  if (!valid_geometry(grid, threads) || rows < 0 || hidden < 0 ||
      (w != nullptr && dw_partial == nullptr)) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
    case DType::kFloat32:
      return launch_bwd<float>(dy, dy_row_stride, x, x_row_stride, w, rstd, dh,
                               dh_row_stride, dx, dx_row_stride, dw_partial, rows, hidden,
                               offset, grid, threads, stream);
    case DType::kFloat16:
      return launch_bwd<__half>(dy, dy_row_stride, x, x_row_stride, w, rstd, dh,
                                dh_row_stride, dx, dx_row_stride, dw_partial, rows, hidden,
                                offset, grid, threads, stream);
    case DType::kBFloat16:
      return launch_bwd<__nv_bfloat16>(dy, dy_row_stride, x, x_row_stride, w, rstd, dh,
                                       dh_row_stride, dx, dx_row_stride, dw_partial, rows,
                                       hidden, offset, grid, threads, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t rms_norm_dw_reduce(DType dtype, const float* dw_partial, int64_t parts,
                               int64_t hidden, void* dw, int grid, int threads,
                               cudaStream_t stream) {
  if (hidden == 0) return cudaSuccess;
  if (!valid_geometry(grid, threads) || parts < 0 || hidden < 0) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kFloat32:
      return launch_dw_reduce<float>(dw_partial, parts, hidden, dw, grid, threads, stream);
    case DType::kFloat16:
      return launch_dw_reduce<__half>(dw_partial, parts, hidden, dw, grid, threads, stream);
    case DType::kBFloat16:
      return launch_dw_reduce<__nv_bfloat16>(dw_partial, parts, hidden, dw, grid, threads,
                                             stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace speedlight
