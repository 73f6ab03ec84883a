// The unit lower-triangular inverse T = (I + B(A^- o K^K^T))^-1 of a chunk (SPEC §1 chunk form;
// paper App. B), shared by the TF32 and the WY prep.
#pragma once

#include "arch/mma_tf32.cuh"
#include "layout/chunk_geometry.hpp"

namespace kla::kernels {

/// Warps that take part in the inverse: warps 0-3 form the diagonal blocks, and the first level
/// below them has six half-block tasks (warps 0-5). Barriers it waits at: one after the diagonal
/// blocks, one after each of the three levels.
constexpr int kInvWarps = 6, kInvBarriers = 4;

/// T = (I + lm)^-1 for a strictly lower 64 x 64 lm (pitch kMatrixPitch) into tm (pitch
/// kMatrixPitch; valid on and below the diagonal blocks, exact zeros above the diagonal inside
/// them). Contract: fp32-grade (the 16 x 16 diagonal blocks by forward substitution in fp32 FMA;
/// the blocks below by the blocked recurrence T_ab = -T_aa sum_{b <= k < a} L_ak T_kb on the tensor
/// cores with both operands split TF32 hi + lo, ~2^-21 relative per product). scratch: kInvScratch
/// floats. Called by warps 0 .. kInvWarps - 1 of the block at least (the others, if they call it,
/// do nothing but wait); `sync()` is a barrier over every calling thread, called kInvBarriers
/// times, last at the end.
template <class Sync>
__device__ __forceinline__ void invert_unit_lower_on(const float* lm, float* tm, float* scratch,
                                                     Sync sync) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Diagonal block o = 16 warp, one warp each, right-looking: lane (column c, row half hh) holds
  // rows 8 hh .. 8 hh + 7 of column c; once row j is final it is broadcast and subtracted below.
  if (warp < 4) {
    const int o = warp * 16, c = lane & 15, hh = lane >> 4;
    float t[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) t[k] = 8 * hh + k == c ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < 15; ++j) {
      const float tj = __shfl_sync(0xffffffffu, t[j & 7], c + 16 * (j >> 3));
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (8 * hh + k > j) t[k] = fmaf(-lm[(o + 8 * hh + k) * kMatrixPitch + o + j], tj, t[k]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) tm[(o + 8 * hh + k) * kMatrixPitch + o + c] = t[k];
  }
  sync();
  // Blocks below the diagonal by distance d = a - b (3, 2, 1 blocks), each in two 8-column
  // halves, a warp a half: Y = sum_k L_ak T_kb, then T_ab = -T_aa Y (Y through this warp's
  // scratch, pitch 12: conflict-free B loads).
  const int g = lane >> 2, t4 = lane & 3;
  for (int d = 1; d < 4; ++d) {
    if (warp < 2 * (4 - d)) {
      const int b = warp >> 1, a = b + d, n0 = b * 16 + (warp & 1) * 8;
      float* ys = scratch + warp * 16 * 12;
      float y[3][4] = {};  // [part][c]: parts hi hi, hi lo, lo hi
      for (int kk = b * 16; kk < a * 16; kk += 8) {
        const FragA fa = load_a_perm<true>(lm, kMatrixPitch, a * 16, kk, g, t4);
        const FragB fb = load_b_kn_perm(tm, kMatrixPitch, kk, n0, g, t4);
        mma3<true, true>(y[0], y[1], y[2], fa, fb);
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *reinterpret_cast<float2*>(ys + (g + 8 * hr) * 12 + 2 * t4) =
            make_float2(parts_sum(y, 2 * hr), parts_sum(y, 2 * hr + 1));
      __syncwarp();
      float z[3][4] = {};
#pragma unroll
      for (int kk = 0; kk < 16; kk += 8) {
        const FragA fa = load_a_perm<true>(tm, kMatrixPitch, a * 16, a * 16 + kk, g, t4);
        const FragB fb = load_b_kn_perm(ys, 12, kk, 0, g, t4);
        mma3<true, true>(z[0], z[1], z[2], fa, fb);
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *reinterpret_cast<float2*>(tm + (a * 16 + g + 8 * hr) * kMatrixPitch + n0 + 2 * t4) =
            make_float2(-parts_sum(z, 2 * hr), -parts_sum(z, 2 * hr + 1));
    }
    sync();
  }
}

/// invert_unit_lower_on called by every thread of the block (8 warps or more), its barriers the
/// block's; ends with a barrier.
__device__ __forceinline__ void invert_unit_lower(const float* lm, float* tm, float* scratch) {
  invert_unit_lower_on(lm, tm, scratch, [] { __syncthreads(); });
}

}  // namespace kla::kernels
