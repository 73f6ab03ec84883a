// The [K, V] fp32 state slice a scan block owns, between the state tensors ([N,HV,K,V], row K
// fp32 of V columns: common/kernel_common.cuh's StateSlot) and the block's registers: read at the
// scan's start, written at its end (and, for the backward pass, at chunk boundaries). One place per
// register layout:
//   mma C fragments (the WY [token][column] scan): tile nj of a warp's 16 key rows r0.. and
//     columns c0 + 8 nj.., element e at row r0 + g + 8 (e / 2), column 2 t4 + e % 2;
//   the transposed scan's m64n64 accumulators S^T: value column c0 + 16 w + g + 8 ((i / 2) % 2),
//     key 64 pn + 8 (i / 4) + 2 t4 + i % 2, each row scaled by its power of two.
#pragma once

#include "arch/split.cuh"
#include "common/kernel_common.cuh"

namespace kla::kernels {

/// acc[nj][e] = state rows r0.. (this warp's 16), columns c0 + c1 + 8 nj.. of the state at `in`
/// (row pitch V floats; c0 the block's slice, c1 the warp's place in it), as mma C fragments (lane
/// g = lane / 4, t4 = lane % 4). float2 loads.
template <int NT>
__device__ __forceinline__ void load_state_fragments(float (&acc)[NT][4], const float* in, int V,
                                                     int r0, int c0, int c1, int g, int t4) {
#pragma unroll
  for (int nj = 0; nj < NT; ++nj)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = r0 + g + hr * 8, cc = c1 + nj * 8 + 2 * t4;
      const float2 x = *reinterpret_cast<const float2*>(in + int64_t(r) * V + c0 + cc);
      acc[nj][2 * hr] = x.x, acc[nj][2 * hr + 1] = x.y;
    }
}

/// The inverse of load_state_fragments: acc into rows r0.., columns c0 + c1 + 8 nj.. at `out`.
template <int NT>
__device__ __forceinline__ void store_state_fragments(float* out, int V, int r0, int c0, int c1,
                                                      int g, int t4, const float (&acc)[NT][4]) {
#pragma unroll
  for (int nj = 0; nj < NT; ++nj)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = r0 + g + hr * 8, cc = c1 + nj * 8 + 2 * t4;
      *reinterpret_cast<float2*>(out + int64_t(r) * V + c0 + cc) =
          make_float2(acc[nj][2 * hr], acc[nj][2 * hr + 1]);
    }
}

/// The transposed scan's state S^T (kPanels m64n64 accumulators of warp w) from the [KD, V] slice
/// at `in`, columns c0..; zeros for keys past KD, and everywhere when `in` is null (no state) or
/// the warp holds no state (`holds` false).
template <int KD, int kPanels>
__device__ __forceinline__ void load_state_transposed(float (*sT)[32], bool holds, const float* in,
                                                      int V, int c0, int warp, int g, int t4) {
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn)
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int key = 64 * pn + 8 * (i >> 2) + 2 * t4 + (i & 1),
                col = c0 + 16 * warp + g + 8 * ((i >> 1) & 1);
      sT[pn][i] = holds && in && key < KD ? in[int64_t(key) * V + col] : 0.f;
    }
}

/// The transposed scan's state S^T (kPanels m64n64 accumulators of warp w, rows scaled by
/// 2^s = sig[row half]) into the [KD, V] slice at `out`, columns c0.. (keys past KD skipped).
template <int KD, int kPanels>
__device__ __forceinline__ void store_state_transposed(float* out, int V, int c0, int warp, int g,
                                                       int t4, const float (*sT)[32],
                                                       const float (&sig)[2]) {
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn)
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int key = 64 * pn + 8 * (i >> 2) + 2 * t4 + (i & 1),
                col = c0 + 16 * warp + g + 8 * ((i >> 1) & 1);
      if (key < KD) out[int64_t(key) * V + col] = sT[pn][i] * pow2_inverse(sig[(i >> 1) & 1]);
    }
}

}  // namespace kla::kernels
