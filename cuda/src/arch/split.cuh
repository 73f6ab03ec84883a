// Splits of fp32 values into two 16-bit parts (hi + lo), the operands that keep fp32-grade
// products on bf16 / fp16 tensor cores: bf16 hi + lo holds 16 significant bits, fp16 hi + lo 22
// (with a power-of-two scale into fp16's range).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/kernel_common.cuh"

namespace kla::kernels {

/// x, y -> hi = E2(x, y), lo = E2(x - hi.x, y - hi.y) for the 2-byte type E (bf16: 16
/// significant bits together; fp16: 22 while both stay normal, so the caller scales the pair
/// into fp16's range first, fp16_range_scale), both round to nearest; x is the lower half (the
/// element at the lower address / lower index).
template <class E>
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  hi = Dtype<E>::pack2(x, y);
  const float2 hf = Dtype<E>::unpack2(hi);
  lo = Dtype<E>::pack2(x - hf.x, y - hf.y);
}
__device__ __forceinline__ void split_bf16x2(float x, float y, uint32_t& hi, uint32_t& lo) {
  split_pair<__nv_bfloat16>(x, y, hi, lo);
}
/// The power of two 2^(14 - floor(log2 m)) that takes a magnitude m > 0 into [2^14, 2^15), fp16's
/// top binade below 2^15 (rounding may reach 2^15, still finite), its exponent held to [-64, 64]
/// so that values it scales stay inside fp32's range; 1 for m = 0. Exact to apply and to undo.
__device__ __forceinline__ float fp16_range_scale(float m) {
  if (m == 0.f) return 1.f;
  const int e = 268 - (__float_as_int(m) >> 23);  // biased: 127 + 14 - (exponent of m - 127)
  return __int_as_float(min(max(e, 127 - 64), 127 + 64) << 23);
}
/// 1 / s for a power of two s in [2^-126, 2^126] (exact).
__device__ __forceinline__ float pow2_inverse(float s) {
  return __int_as_float((254 << 23) - __float_as_int(s));
}
/// split_bf16x2 of (x, y), the hi pair stored at hi_dst and the lo pair at lo_dst (4-byte
/// aligned; shared or global memory).
__device__ __forceinline__ void store_split_bf16x2(void* hi_dst, void* lo_dst, float x, float y) {
  uint32_t hi, lo;
  split_bf16x2(x, y, hi, lo);
  *static_cast<uint32_t*>(hi_dst) = hi;
  *static_cast<uint32_t*>(lo_dst) = lo;
}

}  // namespace kla::kernels
