// The bf16 tensor-core tiles of the backward's bf16 kernels (bwd/bwd_prep_bf16.cuh,
// bwd/bwd_input_grads_bf16.cuh; FAST, bf16 storage, K = V = kBwdCompiledHeadDim): a warp's
// 16 x 32 tile of a product on mma.sync m16n8k16 (arch/mma_bf16.cuh) with its operands read from
// bf16 shared memory by ldmatrix, the tile's stores, the record's bf16 tiles and the raw inputs'
// rows copied in (as they are, or scaled per row and rounded), and the two-part split of fp32
// values into bf16 hi + lo.
// Layouts: [rows][pitch] row-major; the bf16 pitches put consecutive rows 16 bytes apart mod 128
// (conflict-free ldmatrix), every row 16-byte aligned.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>

#include "arch/mma_bf16.cuh"
#include "bwd/bwd_tiles.cuh"

namespace kla::kernels {

namespace bwd_bf16 {

constexpr int C = kChunk, K = kBwdCompiledHeadDim, V = K;
constexpr int PB = K + 8, PBC = C + 8;               // bf16 pitches: rows 16 bytes apart mod 128
constexpr int PK = bwd_pitch(K), PC = bwd_pitch(C);  // fp32 pitches
using bf16 = __nv_bfloat16;

/// x = hi + lo + r for a pair of fp32 values: hi = bf16(x) and lo = bf16(x - hi), each rounded to
/// nearest (x - hi is exact in fp32), so |r| <= 2^-9 |x - hi| <= 2^-18 |x|: a product with one
/// operand so split and the other exact in bf16 (a raw bf16 input) errs below 2^-17 relative,
/// finer than one TF32 part (2^-10). The kernel mutant bwd_prep_split_hi_only drops lo (the
/// prep's and the state scan's split operands at bf16's one part).
__device__ __forceinline__ void split_bf16x2(float x, float y, __nv_bfloat162& hi,
                                             __nv_bfloat162& lo) {
  hi = __floats2bfloat162_rn(x, y);
  const float2 h = __bfloat1622float2(hi);
  lo = KLA_MUTANT(bwd_prep_split_hi_only) ? __floats2bfloat162_rn(0.f, 0.f)
                                          : __floats2bfloat162_rn(x - h.x, y - h.y);
}

/// Adds op(A)[i0 .. i0 + 16, kb .. KD) op(B)[kb .. KD, n0 .. n0 + 16 NP) to the warp's 16 x 16 NP
/// tile d (NP = 2: 16 x 32; d[j]: columns n0 + 8 j .. + 8, the mma C layout): bf16 tiles in
/// shared memory,
///   op(A)(i, k) = TA ? A[k][i] : A[i][k],   op(B)(k, n) = TB ? B[n][k] : B[k][n],
/// k-steps of 16 in order (kb, KD multiples of 16: a triangular op(A) skips its zero steps).
/// Pitches (elements) make every ldmatrix row 16 bytes apart mod 128.
template <bool TA, bool TB, int NP = 2>
__device__ __forceinline__ void warp_tile_mma(float (&d)[2 * NP][4], const bf16* A, int lda, int i0,
                                              const bf16* B, int ldb, int n0, int KD, int kb = 0) {
  const int lane = threadIdx.x & 31;
#pragma unroll 4
  for (int k0 = kb; k0 < KD; k0 += 16) {
    uint32_t a[4];
    if constexpr (TA)
      ldsm4_t(a, A + (k0 + (lane >> 4) * 8 + (lane & 7)) * lda + i0 + ((lane >> 3) & 1) * 8);
    else
      ldsm4(a, A + (i0 + (lane & 15)) * lda + k0 + (lane >> 4) * 8);
#pragma unroll
    for (int p = 0; p < NP; ++p) {  // n-tiles 2p, 2p + 1
      const int nb = n0 + 16 * p;
      uint32_t b[4];
      if constexpr (TB)
        ldsm4(b, B + (nb + (lane & 7) + (lane >> 4) * 8) * ldb + k0 + ((lane >> 3) & 1) * 8);
      else
        ldsm4_t(b, B + frag_b_kn(ldb, k0, nb, lane));
      mma_bf16(d[2 * p], a, b[0], b[1]);
      mma_bf16(d[2 * p + 1], a, b[2], b[3]);
    }
  }
}

/// The warp's tile d (rows i0 + g, i0 + g + 8; columns n0 + 8 j + 2 t, + 1) at dst (pitch ld), a
/// pair at a time: fp32 (eight bytes; shared or global memory) or bf16 rounded to nearest (four
/// bytes; shared memory).
template <class T>
__device__ __forceinline__ void store_tile(T* dst, int ld, int i0, int n0, const float (&d)[4][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x = d[j][2 * h], y = d[j][2 * h + 1];
      if constexpr (std::is_same_v<T, float>)
        *reinterpret_cast<float2*>(dst + int64_t(i0 + g + 8 * h) * ld + n0 + 8 * j + 2 * t) =
            make_float2(x, y);
      else
        *reinterpret_cast<__nv_bfloat162*>(dst + (i0 + g + 8 * h) * ld + n0 + 8 * j + 2 * t) =
            __floats2bfloat162_rn(x, y);
    }
}

/// The warp's 16 x 32 tile d split (split_bf16x2) into bf16 tiles hi and lo of pitch ld (shared
/// or global memory), a pair at a time.
__device__ __forceinline__ void store_tile_split(bf16* hi, bf16* lo, int ld, int i0, int n0,
                                                 const float (&d)[4][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t at = int64_t(i0 + g + 8 * h) * ld + n0 + 8 * j + 2 * t;
      split_bf16x2(d[j][2 * h], d[j][2 * h + 1], *reinterpret_cast<__nv_bfloat162*>(hi + at),
                   *reinterpret_cast<__nv_bfloat162*>(lo + at));
    }
}

/// A [rows][W] bf16 tile of the record (row pitch W) to shared memory of pitch dp by cp.async (16
/// bytes a copy); the caller commits and waits.
template <int W>
__device__ __forceinline__ void cp_tile_bf16(bf16* dst, int dp, const bf16* src, int rows) {
  constexpr int W8 = W / 8;
  for (int idx = threadIdx.x; idx < rows * W8; idx += blockDim.x)
    cp16(dst + (idx / W8) * dp + (idx % W8) * 8, src + 8 * idx, true);
}

/// Rows [0, L) of a chunk's [C][K] tile of a raw [B,T,heads,K] bf16 input (batch row b, tokens
/// from tb, head `head`, strides st) to shared memory of pitch dp by cp.async, 16 bytes a copy,
/// rows past L zero-filled (K = V here); the caller commits and waits.
__device__ __forceinline__ void cp_input_rows(bf16* dst, int dp, const bf16* base,
                                              const int64_t* st, int64_t b, int64_t tb, int head,
                                              int L) {
  for (int idx = threadIdx.x; idx < C * (K / 8); idx += blockDim.x) {
    const int i = idx / (K / 8), c8 = (idx % (K / 8)) * 8;
    const bool ok = i < L;
    cp16(dst + i * dp + c8,
         base + b * st[0] + (tb + (ok ? i : 0)) * st[1] + int64_t(head) * st[2] + c8, ok);
  }
}

/// Rows [0, L) of a chunk's [C][K] tile of a raw [B,T,heads,K] bf16 input, row i scaled by s[i]
/// in fp32 and rounded to bf16 (round_bf16x2), into shared memory of pitch dp (rows past L zero):
/// the prep's fp32 rows fl(s_i x) rounded, without reading them. All of a thread's 16-byte loads
/// are in flight before any is stored.
__device__ __forceinline__ void load_scaled_rows(bf16* dst, int dp, const bf16* base,
                                                 const int64_t* st, int64_t b, int64_t tb, int head,
                                                 int L, const float* s) {
  constexpr int W8 = K / 8, kPer = C * W8 / kBwdChunkThreads;
  static_assert(C * W8 % kBwdChunkThreads == 0, "whole 16-byte rows a thread");
  uint4 x[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int idx = threadIdx.x + u * kBwdChunkThreads, i = idx / W8, c8 = (idx % W8) * 8;
    x[u] = i < L ? *reinterpret_cast<const uint4*>(base + b * st[0] + (tb + i) * st[1] +
                                                   int64_t(head) * st[2] + c8)
                 : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int idx = threadIdx.x + u * kBwdChunkThreads, i = idx / W8, c8 = (idx % W8) * 8;
    const float si = i < L ? s[i] : 0.f;
    uint32_t* e = reinterpret_cast<uint32_t*>(&x[u]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = Dtype<bf16>::unpack2(e[j]);
      e[j] = round_bf16x2(si * f.x, si * f.y);
    }
    *reinterpret_cast<uint4*>(dst + i * dp + c8) = x[u];
  }
}

}  // namespace bwd_bf16

}  // namespace kla::kernels
