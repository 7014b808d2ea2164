// Device helpers of speedlight's CUDA C++ kernels: storage-type conversions (fp32, fp16,
// bf16), 16-byte vectors of a row, and warp / block sums. Included by the .cu files of
// speedlight/csrc only (device code: nvcc compiles it, torch-free).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace speedlight {

constexpr int kWarp = 32;
constexpr int kVectorBytes = 16;

// --- storage types ---------------------------------------------------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// 16 bytes of T: one LDG.E.128 / STG.E.128 when the address is 16-byte aligned.
template <typename T>
struct alignas(kVectorBytes) Vec {
  static constexpr int kSize = kVectorBytes / sizeof(T);
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* row, int64_t vec_index) {
  return reinterpret_cast<const Vec<T>*>(row)[vec_index];
}

template <typename T>
__device__ __forceinline__ void store_vec(T* row, int64_t vec_index, const Vec<T>& value) {
  reinterpret_cast<Vec<T>*>(row)[vec_index] = value;
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & (kVectorBytes - 1)) == 0;
}

// --- reductions ------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int lane_mask = kWarp / 2; lane_mask > 0; lane_mask >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, lane_mask);
  }
  return v;
}

// The sum of v over the block, returned to every thread. `scratch` holds one float per warp;
// the barriers also order every access of the row before them against those after.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : 0.0f;
  total = warp_sum(total);  // every warp sums the per-warp partials itself: no broadcast
  __syncthreads();          // scratch is free again for the next row
  return total;
}

}  // namespace speedlight
