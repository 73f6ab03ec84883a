// The WY prep's tile loads: rows [0, 64) of a chunk's K / Q / V tile by 16-byte cp.async copies,
// into padded rows or into the 128-byte-swizzled wgmma layout; rows past the chunk zero-filled.
#pragma once

#include "arch/copy.cuh"
#include "layout/wy_layout.hpp"

namespace kla::kernels {

/// Issues cp.async copies of rows [0, kChunk) of a [.., T, head, NCOLS] tensor (row stride rs,
/// first row at src) into dst (pitch DP elements); rows >= L are zero-filled. Not committed. Called
/// by all kWyPrepThreads threads. When whole rows fit a pass, thread tid keeps one 16-byte column
/// piece and steps rows (no index arithmetic per copy); otherwise it takes pieces tid, tid +
/// kWyPrepThreads, ... with (row, piece) stepped, not divided.
template <class E, int NCOLS>
__device__ __forceinline__ void load_rows_async(E* dst, int DP, const E* src, int64_t rs, int L) {
  constexpr int VE = int(16 / sizeof(E)), nv = NCOLS / VE;
  if constexpr (kWyPrepThreads % nv == 0 && kChunk % (kWyPrepThreads / nv) == 0) {
    constexpr int di = kWyPrepThreads / nv;
    const int r = (int(threadIdx.x) % nv) * VE, i0 = int(threadIdx.x) / nv;
    // The source offset is stepped by di rows, not multiplied per row (64-bit products).
    const int64_t step = int64_t(di) * rs;
    int64_t off = int64_t(i0) * rs + r;
#pragma unroll
    for (int k = 0; k < kChunk / di; ++k, off += step) {
      const int i = i0 + k * di;
      cp16(dst + i * DP + r, src + (i < L ? off : int64_t(r)), i < L);
    }
  } else {
    constexpr int di = kWyPrepThreads / nv, dr = (kWyPrepThreads - di * nv) * VE;
    int i = int(threadIdx.x) / nv, r = (int(threadIdx.x) - i * nv) * VE;
    while (i < kChunk) {
      cp16(dst + i * DP + r, src + int64_t(i < L ? i : 0) * rs + r, i < L);
      i += di, r += dr;
      if (r >= NCOLS) r -= NCOLS, ++i;
    }
  }
}

/// Issues cp.async copies of rows [0, kChunk) of a 2-byte [.., T, head, KD] tensor (row stride rs,
/// first row at src) into dst as the wgmma K-major layout: 64-column panels of kChunk rows x 128 B,
/// 16-byte piece c of row r at c ^ r % 8 (the 128-byte swizzle of the TMA boxes). Rows >= L and
/// columns >= KD (the last panel's tail) are zero-filled. Not committed. Called by all
/// kWyPrepThreads threads.
template <class E, int KD>
__device__ __forceinline__ void load_rows_sw128(void* dst, const E* src, int64_t rs, int L) {
  static_assert(sizeof(E) == 2, "8 elements a piece");
  constexpr int nv = (KD + 63) / 64 * 8, di = kWyPrepThreads / nv;  // pieces a row, rows a pass
  static_assert(kWyPrepThreads % nv == 0 && kChunk % di == 0, "whole rows a pass");
  const int c = int(threadIdx.x) % nv, i0 = int(threadIdx.x) / nv;
  const bool col_in = c * 8 < KD;
  // The source offset is stepped by di rows, not multiplied per row (64-bit products).
  const int64_t step = int64_t(di) * rs;
  int64_t off = int64_t(i0) * rs + (col_in ? c * 8 : 0);
  char* d = static_cast<char*>(dst);
#pragma unroll
  for (int k = 0; k < kChunk / di; ++k, off += step) {
    const int i = i0 + k * di;
    cp16(d + kmajor_sw128_offset(i, c * 8, kChunk), src + (i < L ? off : 0), i < L && col_in);
  }
}

}  // namespace kla::kernels
