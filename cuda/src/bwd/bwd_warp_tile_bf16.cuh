// The bf16 tensor-core tiles of the backward's bf16 kernels (bwd/bwd_prep_bf16.cuh,
// bwd/bwd_input_grads_bf16.cuh; FAST, bf16 storage, K = V = kBwdCompiledHeadDim): a warp's
// 16 x 32 tile of a product on mma.sync m16n8k16 (arch/mma_bf16.cuh) with its operands read from
// bf16 shared memory by ldmatrix, the tile's stores, the record's bf16 tiles and the raw inputs'
// rows copied in, and the two-part split of fp32 values into bf16 hi + lo.
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

/// This lane's ldmatrix row address for op(A)'s 16 x 16 block at rows i0, k-step k0 (op(A)(i, k) =
/// TA ? A[k][i] : A[i][k], pitch lda), loaded by load_frag<TA>.
template <bool TA>
__device__ __forceinline__ int frag_a_at(int lda, int i0, int k0, int lane) {
  return TA ? (k0 + (lane >> 4) * 8 + (lane & 7)) * lda + i0 + ((lane >> 3) & 1) * 8
            : (i0 + (lane & 15)) * lda + k0 + (lane >> 4) * 8;
}
/// This lane's ldmatrix row address for op(B)'s two 16 x 8 blocks at k-step k0, columns nb .. nb +
/// 16 (op(B)(k, n) = TB ? B[n][k] : B[k][n], pitch ldb), loaded by load_frag<!TB>: r0, r1 the
/// first n-tile's fragment, r2, r3 the second's.
template <bool TB>
__device__ __forceinline__ int frag_b_at(int ldb, int nb, int k0, int lane) {
  return TB ? (nb + (lane & 7) + (lane >> 4) * 8) * ldb + k0 + ((lane >> 3) & 1) * 8
            : frag_b_kn(ldb, k0, nb, lane);
}
/// One ldmatrix x4 at this lane's row address, transposed (.trans) or not.
template <bool kTrans>
__device__ __forceinline__ void load_frag(uint32_t (&r)[4], const bf16* at) {
  if constexpr (kTrans)
    ldsm4_t(r, at);
  else
    ldsm4(r, at);
}

/// Both parts' fragments (load_frag) of a split op(B) = Bh + Bl at k-step k0, columns nb .. nb
/// + 16.
template <bool TB>
__device__ __forceinline__ void load_split_frag_b(uint32_t (&bh)[4], uint32_t (&bl)[4],
                                                  const bf16* Bh, const bf16* Bl, int ldb, int nb,
                                                  int k0, int lane) {
  const int at = frag_b_at<TB>(ldb, nb, k0, lane);
  load_frag<!TB>(bh, Bh + at);
  load_frag<!TB>(bl, Bl + at);
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
    load_frag<TA>(a, A + frag_a_at<TA>(lda, i0, k0, lane));
#pragma unroll
    for (int p = 0; p < NP; ++p) {  // n-tiles 2p, 2p + 1
      uint32_t b[4];
      load_frag<!TB>(b, B + frag_b_at<TB>(ldb, n0 + 16 * p, k0, lane));
      mma_bf16(d[2 * p], a, b[0], b[1]);
      mma_bf16(d[2 * p + 1], a, b[2], b[3]);
    }
  }
}

/// As warp_tile_mma for op(A) times a split op(B) = Bh + Bl: each k-step's A fragment loaded once
/// for both parts, which go to two accumulators (dh += op(A) Bh, dl += op(A) Bl): two independent
/// chains of KD / 16 mma each, where one accumulator would chain 2 KD / 16. The caller sums them.
template <bool TA, bool TB, int NP = 2>
__device__ __forceinline__ void warp_tile_mma_split_b(float (&dh)[2 * NP][4],
                                                      float (&dl)[2 * NP][4], const bf16* A,
                                                      int lda, int i0, const bf16* Bh,
                                                      const bf16* Bl, int ldb, int n0, int KD) {
  const int lane = threadIdx.x & 31;
#pragma unroll 4
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t a[4];
    load_frag<TA>(a, A + frag_a_at<TA>(lda, i0, k0, lane));
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      uint32_t bh[4], bl[4];
      load_split_frag_b<TB>(bh, bl, Bh, Bl, ldb, n0 + 16 * p, k0, lane);
      mma_bf16(dh[2 * p], a, bh[0], bh[1]);
      mma_bf16(dh[2 * p + 1], a, bh[2], bh[3]);
      mma_bf16(dl[2 * p], a, bl[0], bl[1]);
      mma_bf16(dl[2 * p + 1], a, bl[2], bl[3]);
    }
  }
}

/// As warp_tile_mma for a split op(A) = Ah + Al times a split op(B) = Bh + Bl (Al Bl, below the
/// split's precision, dropped): each k-step's four fragments loaded once, its three parts into
/// dhh += Ah Bh, dhl += Ah Bl, dlh += Al Bh (dhl and dlh may be one accumulator): independent
/// chains of KD / 16 mma (2 KD / 16 for a shared one) where one accumulator would chain 3 KD / 16.
/// The caller sums the parts, small ones first (parts_sum).
template <bool TA, bool TB, int NP = 2>
__device__ __forceinline__ void warp_tile_mma_split(float (&dhh)[2 * NP][4],
                                                    float (&dhl)[2 * NP][4],
                                                    float (&dlh)[2 * NP][4], const bf16* Ah,
                                                    const bf16* Al, int lda, int i0, const bf16* Bh,
                                                    const bf16* Bl, int ldb, int n0, int KD) {
  const int lane = threadIdx.x & 31;
#pragma unroll 2
  for (int k0 = 0; k0 < KD; k0 += 16) {
    const int aat = frag_a_at<TA>(lda, i0, k0, lane);
    uint32_t ah[4], al[4];
    load_frag<TA>(ah, Ah + aat);
    load_frag<TA>(al, Al + aat);
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      uint32_t bh[4], bl[4];
      load_split_frag_b<TB>(bh, bl, Bh, Bl, ldb, n0 + 16 * p, k0, lane);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        mma_bf16(dhh[2 * p + q], ah, bh[2 * q], bh[2 * q + 1]);
        mma_bf16(dhl[2 * p + q], ah, bl[2 * q], bl[2 * q + 1]);
        mma_bf16(dlh[2 * p + q], al, bh[2 * q], bh[2 * q + 1]);
      }
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

/// d += the same elements of a [rows][ld] fp32 tile in global memory (the bf16 input gradients'
/// running sum of dq^, dk^ over a key head's value heads). The kernel mutant
/// bwd_running_sum_restarts skips the add, so each key head keeps its last value head's share.
__device__ __forceinline__ void add_tile(float (&d)[4][4], const float* src, int ld, int i0,
                                         int n0) {
  if (KLA_MUTANT(bwd_running_sum_restarts)) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float2 x[4][2];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      x[j][h] =
          *reinterpret_cast<const float2*>(src + int64_t(i0 + g + 8 * h) * ld + n0 + 8 * j + 2 * t);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[j][2 * h] += x[j][h].x;
      d[j][2 * h + 1] += x[j][h].y;
    }
}

/// The warp's tile d (i0 a multiple of 4, n0 of kBwdBf16Slice) into a [rows][V] fp32 tile of the
/// record kept by value slice (bwd_sliced_index), a pair at a time: U0 for the bf16 state scan.
__device__ __forceinline__ void store_tile_sliced(float* dst, int rows, int i0, int n0,
                                                  const float (&d)[4][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // bwd_sliced_index(rows, i0 + r, n0 + c) with (i0 + r) mod 4 = r mod 4 and c < 32
  float* const at = dst + bwd_sliced_index(rows, i0, n0) + g * kBwdBf16Slice + 2 * t;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(at + 8 * h * kBwdBf16Slice + 8 * (j ^ (g & 3))) =
          make_float2(d[j][2 * h], d[j][2 * h + 1]);
}

/// Elements (r, c), (r, c + 1) (c even, below kBwdBf16Slice) of one value slice of such a tile in
/// shared memory, as the bf16 state scan copies it in whole (U0).
__device__ __forceinline__ float2 sliced_pair(const float* slice, int r, int c) {
  return *reinterpret_cast<const float2*>(slice + bwd_sliced_index(0, r, c));
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

/// A [rows][W + 8] bf16 tile of shared memory (its W columns; the padding written as zeros) to the
/// record as it is (bwd_bf16_record_fits), 16 bytes a copy, by threads i of n: the raw keys and
/// queries and M's two parts, for the bf16 scans' bulk copies.
template <int W>
__device__ __forceinline__ void store_padded_rows(bf16* dst, const bf16* src, int rows, int i,
                                                  int n) {
  constexpr int U = (W + 8) / 8;  // 16-byte units a row, the last one padding
  for (int idx = i; idx < rows * U; idx += n)
    *reinterpret_cast<uint4*>(dst + 8 * idx) = idx % U < U - 1
                                                   ? *reinterpret_cast<const uint4*>(src + 8 * idx)
                                                   : make_uint4(0u, 0u, 0u, 0u);
}

/// The raw dY of a chunk ([C][V] rows [0, L) of a [B,T,HV,V] bf16 input; batch row b, tokens from
/// tb, head `head`, strides st) to the record by value slice, as the state-gradient scan copies a
/// slice in (bwd_bf16_record_fits, BwdRecord::b_do): slice s [C][kBwdBf16SlicePitch] whole, rows
/// past L and the padding zero, through registers (no shared memory): a thread's 16-byte units
/// idx = threadIdx.x + u blockDim.x of the record's tile in order, all loaded (load_dy_slices)
/// before any is stored (store_dy_slices), so that a thread's loads are in flight together (the
/// bf16 prep issues them beside its rows' cp.async copies).
constexpr int kDySliceUnits = (V / kBwdBf16Slice) * C * (kBwdBf16SlicePitch / 8);
template <int kPer>
__device__ __forceinline__ void load_dy_slices(uint4 (&x)[kPer], const bf16* base,
                                               const int64_t* st, int64_t b, int64_t tb, int head,
                                               int L) {
  constexpr int U = kBwdBf16SlicePitch / 8;  // 16-byte units a slice's row, the last one padding
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    // idx = (s * C + r) * U + w
    const int idx = int(threadIdx.x) + u * int(blockDim.x);
    const int w = idx % U, r = (idx / U) % C, sl = idx / (U * C);
    x[u] = idx < kDySliceUnits && w < U - 1 && r < L
               ? *reinterpret_cast<const uint4*>(base + b * st[0] + (tb + r) * st[1] +
                                                 int64_t(head) * st[2] + sl * kBwdBf16Slice + 8 * w)
               : make_uint4(0u, 0u, 0u, 0u);
  }
}
template <int kPer>
__device__ __forceinline__ void store_dy_slices(bf16* dst, const uint4 (&x)[kPer]) {
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int idx = int(threadIdx.x) + u * int(blockDim.x);
    if (idx < kDySliceUnits) *reinterpret_cast<uint4*>(dst + 8 * idx) = x[u];
  }
}

/// Zeros the padding (columns K .. PB) of `rows` rows of a [rows][PB] bf16 tile of the record.
__device__ __forceinline__ void zero_tile_padding(bf16* dst, int rows) {
  for (int i = threadIdx.x; i < rows; i += blockDim.x)
    *reinterpret_cast<uint4*>(dst + i * PB + K) = make_uint4(0u, 0u, 0u, 0u);
}

/// One copy group of a bf16 scan: tiles the prep laid out as the scan holds them
/// (bwd_bf16_record_fits), one contiguous copy a tile, refilled once a chunk. On sm_90: bulk copies
/// issued by thread 0, completing on the group's mbarrier (its n-th phase: the n-th refill), on
/// which every thread waits. Before sm_90: 16-byte cp.async by every thread in one commit group,
/// waited for (kNewer groups committed after it may still be in flight) and published by a block
/// barrier.
struct ScanCopyGroup {
  uint64_t* bar;
  /// By every thread before the kernel's first block barrier.
  __device__ __forceinline__ void init() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) mbar_init(bar, 1);
#endif
  }
  /// A refill: `bytes` in all, then its copies (16-byte multiples, 16-byte aligned), then commit.
  __device__ __forceinline__ void expect(unsigned bytes) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) mbar_expect_tx(bar, bytes);
#endif
  }
  __device__ __forceinline__ void copy(void* dst, const void* src, unsigned bytes) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) bulk_load(dst, src, bytes, bar);
#else
    for (unsigned o = 16 * threadIdx.x; o < bytes; o += 16 * blockDim.x)
      cp16(static_cast<char*>(dst) + o, static_cast<const char*>(src) + o, true);
#endif
  }
  __device__ __forceinline__ void commit() const {
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    cp_commit();
#endif
  }
  /// Until refill n (counted from 0) is complete and visible to the calling thread (before sm_90:
  /// to the block).
  template <int kNewer>
  __device__ __forceinline__ void wait(int n) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    mbar_wait(bar, unsigned(n) & 1u);
#else
    cp_wait<kNewer>();
    __syncthreads();
#endif
  }
};

/// Rows [0, L) of a chunk's [C][K] tile of a raw [B,T,heads,K] bf16 input (batch row b, tokens
/// from tb, head `head`, strides st) to shared memory of pitch dp by cp.async, 16 bytes a copy,
/// rows past L zero-filled (K = V here); the caller commits and waits.
__device__ __forceinline__ void cp_input_rows(bf16* dst, int dp, const bf16* base,
                                              const int64_t* st, int64_t b, int64_t tb, int head,
                                              int L) {
  for (int idx = thread_index_here(); idx < C * (K / 8); idx += blockDim.x) {
    const int i = idx / (K / 8), c8 = (idx % (K / 8)) * 8;
    const bool ok = i < L;
    cp16(dst + i * dp + c8,
         base + b * st[0] + (tb + (ok ? i : 0)) * st[1] + int64_t(head) * st[2] + c8, ok);
  }
}

}  // namespace bwd_bf16

}  // namespace kla::kernels
