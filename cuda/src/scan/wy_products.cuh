// The WY scans' split products: a packed lower-triangular split tile (T, P T) times a split B tile
// on mma.sync (parts hi hi, hi lo, lo hi), and a shared-memory wgmma group times a split B tile.
// Every product of split operands keeps ~2^-16 relative accuracy (arch/split.cuh).
#pragma once

#include <type_traits>

#include "arch/mma_bf16.cuh"
#include "arch/wgmma.cuh"
#include "layout/wy_layout.hpp"

namespace kla::kernels {

/// One k-step of a split product: d[nt][part] += A B_ks for an A fragment as bf16 parts (ah, al)
/// and k-step ks of a split B (Bh / Bl, [k][SP]), NT 8-column tiles from column n0: parts hi hi,
/// hi lo and lo hi.
template <int NT, int SP>
__device__ __forceinline__ void split_k_step(float (&d)[NT][3][4], const uint32_t (&ah)[4],
                                             const uint32_t (&al)[4], const __nv_bfloat16* Bh,
                                             const __nv_bfloat16* Bl, int ks, int n0, int lane) {
  if constexpr (NT == 1) {
    uint32_t bh[2], bl[2];
    ldsm2_t(bh, Bh + frag_b_kn(SP, ks * 16, n0, lane));
    ldsm2_t(bl, Bl + frag_b_kn(SP, ks * 16, n0, lane));
    mma_bf16_split(d[0], ah, al, bh[0], bh[1], bl[0], bl[1]);
  } else {
    static_assert(NT % 2 == 0, "one tile or pairs of tiles");
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bh[4], bl[4];
      ldsm4_t(bh, Bh + frag_b_kn(SP, ks * 16, n0 + np * 16, lane));
      ldsm4_t(bl, Bl + frag_b_kn(SP, ks * 16, n0 + np * 16, lane));
      mma_bf16_split(d[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
      mma_bf16_split(d[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
    }
  }
}

/// d[nt][part] (row block mi) = A B for a split lower-triangular 64 x 64 A (Ah / Al, packed
/// triangles, wy_packed_offset: k-blocks 0..mi) and a split B (Bh / Bl, [64][SP], NT tiles from
/// column n0).
/// mi must be warp-uniform: each row block has its own fully unrolled body (offsets fold into
/// the instructions: fewer issued instructions; docs/prefill_notes.md, 'Design decisions').
template <int NT, int SP>
__device__ __forceinline__ void tri_split_times_split(const char* Ah, const char* Al,
                                                      const __nv_bfloat16* Bh,
                                                      const __nv_bfloat16* Bl, int mi, int n0,
                                                      float (&d)[NT][3][4]) {
  const int lane = threadIdx.x & 31;
  auto rows = [&](auto MI) {
#pragma unroll
    for (int ks = 0; ks <= decltype(MI)::value; ++ks) {
      uint32_t ah[4], al[4];
      const int off = wy_packed_offset(decltype(MI)::value * 16, ks * 16) + lane * 16;
      ldsm4(ah, Ah + off);
      ldsm4(al, Al + off);
      split_k_step<NT, SP>(d, ah, al, Bh, Bl, ks, n0, lane);
    }
  };
  switch (mi) {
    case 0: rows(std::integral_constant<int, 0>{}); break;
    case 1: rows(std::integral_constant<int, 1>{}); break;
    case 2: rows(std::integral_constant<int, 2>{}); break;
    default: rows(std::integral_constant<int, 3>{}); break;
  }
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/// r[nj] (8-column tile nj, mma C layout; this warp's 16 rows of the warpgroup's 64) = A B over
/// KSTEPS k-steps, one wgmma group with both operands read by the tensor cores from shared memory.
/// A: rows m0.. of a bf16 / fp16 tile as the TMA boxes leave it (panels of 64 columns x 64 rows x
/// 128 B, 128-byte swizzle, kAPanel bytes apart), or of its transpose (kTransA: A = tile^T, m0 a
/// multiple of 64); with kALo also its lo part, a_lo bytes further (fp32 inputs: the prep's
/// images, hi panels 16 KB apart, each lo panel 8 KB after its hi panel). B: a split tile
/// (K-major, 128-byte swizzle, rows as wy_split_row from a column group's first row, b_panel bytes
/// between 64-k panels); N counts its hi and lo rows (N / 16 column tiles), NH tiles a group. The
/// result is A B_hi + A B_lo (+ A_lo B_hi + A_lo B_lo: the last, up to 2^-18 relative, is as large
/// as the split's own error, and leaving it out costs more small wgmma than it saves;
/// docs/prefill_notes.md, 'Design decisions'). WE: the tensor cores' input type, bf16, or fp16 for
/// raw fp16 K / Q tiles (B split into fp16 hi + lo by the caller).
template <int KSTEPS, int N, int NH, bool kTransA, bool kALo, int kAPanel, class WE = __nv_bfloat16>
__device__ __forceinline__ void wg_times_split(const char* A, int a_lo, int m0, const char* B,
                                               int b_panel, float (&r)[N / 16][4]) {
  static_assert(N % (16 * NH) == 0, "whole column groups of hi and lo rows");
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wgmma_reg_fence(d);
  wgmma_fence();
  // The descriptors of k-step 0; every later k-step (and A's lo part) starts a fixed number of
  // bytes further, added to the start-address field (wgmma_desc_advance), which takes fewer
  // instructions than rebuilding each descriptor from its address (docs/prefill_notes.md, 'Design
  // decisions'). kTransA: rows = tile columns m0.. (panel m0 / 64), k = tile rows 16 ks.. (8-row
  // groups 1024 B apart); else rows = tile rows m0.., k = tile columns 16 ks.. (panel ks / 4).
  const uint64_t bd0 = wgmma_desc_sw128(B);
  const uint64_t ad0 = wgmma_desc_sw128(kTransA ? A + (m0 >> 6) * kAPanel : A + m0 * 128, kAPanel);
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    const uint64_t bd = wgmma_desc_advance(bd0, (ks >> 2) * b_panel + (ks & 3) * 32);
    const uint64_t ad =
        wgmma_desc_advance(ad0, kTransA ? ks * 2048 : (ks >> 2) * kAPanel + (ks & 3) * 32);
#pragma unroll
    for (int part = 0; part < (kALo ? 2 : 1); ++part)
      wgmma_ss<kTransA ? 1 : 0, WE>(d, wgmma_desc_advance(ad, part * a_lo), bd);
  }
  wgmma_commit();
  wgmma_wait_all();
  wgmma_reg_fence(d);
  // Tile nj's hi rows in B: its group's first tile, then its place in the group; the lo rows
  // follow NH tiles later.
#pragma unroll
  for (int nj = 0; nj < N / 16; ++nj) {
    const int th = (nj / NH) * 2 * NH + nj % NH;
#pragma unroll
    for (int e = 0; e < 4; ++e) r[nj][e] = d[4 * th + e] + d[4 * (th + NH) + e];
  }
}
#endif

}  // namespace kla::kernels
