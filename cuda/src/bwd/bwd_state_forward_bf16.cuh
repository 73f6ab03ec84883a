// Backward, pass 2 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_state_forward_bf16_kernel, the state scan of
// bwd/bwd_state_scans.cuh (its file comment has the recurrence) on bf16 tensor cores, one block per
// (sequence, value head, slice of kBwdStateForwardBf16Slice = 32 value columns), two warps per 16
// of its columns, each holding its columns of the state transposed for half of the keys,
// S^T [16 x K / 2] fp32, in mma accumulators for the whole sequence:
//   U^T = U0^T - S^T W^T                       S^T, W split hi + lo (parts hi hi, hi lo, lo hi)
//   S^T <- gamma_C S^T + U^T diag(Gamma_C. ks) K   raw keys K (exact), the scaled U^T split
// with k^ = ks k (the record's kscale). An mma accumulator tile is, element for element, the A
// operand of the next product (rows: the warp's value columns), so S^T and U^T pass from one
// product to the next in registers (split into bf16 hi + lo there); only W and K come from shared
// memory. Per chunk the block copies in (cp.async) W's two parts (the prep writes them,
// BwdRecord::b_wh / b_wl), the raw keys, G and kscale, and each thread loads its elements of the
// U0 slice into registers at the chunk's start (read after the S^T W^T product); it writes S
// (entering the chunk, its hi part: rounded to nearest) and U to the record in bf16 for
// bwd/bwd_input_grads_bf16.cuh, their only reader in this configuration, through [row][column]
// tiles in shared memory that stmatrix fills transposed.
//
// Precision: a split operand errs below 2^-18 relative (bwd_bf16::split_bf16x2), the dropped
// lo lo product below 2^-18, raw keys are exact, so each product errs below about 2^-16: finer
// than the TF32 scan's one part an operand (2^-10); the state itself accumulates in fp32.
#pragma once

#include <type_traits>

#include "bwd/bwd_warp_tile_bf16.cuh"

namespace kla::kernels {

namespace bwd_bf16 {

/// A pair of fp32 values split into bf16 hi + lo (split_bf16x2), as two packed registers.
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  __nv_bfloat162 h, l;
  split_bf16x2(x, y, h, l);
  hi = *reinterpret_cast<uint32_t*>(&h);
  lo = *reinterpret_cast<uint32_t*>(&l);
}

/// The two warps of a column group (warps 2 cg, 2 cg + 1: the two halves of the keys) add their
/// parts u of a [16][C] product: each stores its part ([C / 2][32 lanes] fp32 at part + warp's
/// share; conflict-free), meets the other at named barrier 1 + cg (64 threads) and adds the other's
/// elements, the same lane's. Both warps get the same sum (fp32 addition commutes); the block's
/// barriers order a part's next store after the other warp's read.
template <int NJ>
__device__ __forceinline__ void exchange_pair_parts(float (&u)[NJ][4], float* part, int warp,
                                                    int lane, int cg) {
  float* const mine = part + warp * (4 * NJ) * 32 + lane;
  const float* const other = part + (warp ^ 1) * (4 * NJ) * 32 + lane;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mine[(4 * j + e) * 32] = u[j][e];
  named_bar_sync(1 + cg, 64);
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) u[j][e] += other[(4 * j + e) * 32];
}

/// The out tiles of a scan block to the record in bf16: the [K][VS + 8] tile `so` to the state
/// slot `ds` and the [C][VS + 8] tile `uo` to the token slot `du` (rows V apart, columns c0 ..
/// c0 + VS), 16 bytes a copy.
template <int VS, int NT>
__device__ __forceinline__ void copy_out_tiles(bf16* ds, const bf16* so, bf16* du, const bf16* uo,
                                               int c0, int tid) {
  constexpr int PO = VS + 8;
  for (int idx = tid; idx < (K + C) * (VS / 8); idx += NT) {
    const int r = idx / (VS / 8), c8 = (idx % (VS / 8)) * 8;
    const bool s_row = r < K;
    bf16* const to = (s_row ? ds + int64_t(r) * V : du + int64_t(r - K) * V) + c0 + c8;
    *reinterpret_cast<uint4*>(to) =
        *reinterpret_cast<const uint4*>((s_row ? so + r * PO : uo + (r - K) * PO) + c8);
  }
}

}  // namespace bwd_bf16

template <class E>
__global__ void __maxnreg__(kBwdStateForwardBf16Regs)
    bwd_state_forward_bf16_kernel(const BwdParams bp) {
  using namespace bwd_bf16;
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  constexpr int VS = kBwdStateForwardBf16Slice, NT = kBwdStateForwardBf16Threads;
  static_assert(NT == 64 * (VS / 16), "two warps per 16 value columns");
  constexpr int PO = VS + 8, KH = K / 2;  // bf16 out tiles: rows 16 bytes apart mod 128
  __builtin_assume(blockDim.x == NT);     // the launcher's (bwd_launch.cuh)
  const KernelParams& p = bp.f;
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* const rec0 = bwd_record(bp, blk.n, sr, 0, blk.hv);  // chunk ch's: rec0 + ch * rstep
  const int64_t rstep = bwd_record_step(bp);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // The warp's value columns c0 + cw .. + 16 and keys kb .. kb + K / 2 (its pair's other warp
  // holds the other half of the keys).
  const int cg = warp >> 1, cw = 16 * cg, kb = KH * (warp & 1);

  // Shared memory (bwd_state_forward_bf16_smem): one copy stage in two cp.async groups, W's (W hi,
  // W lo [C][PB] bf16, G, kscale [C] fp32: read for U) and the raw keys' (K [C][PB] bf16: read by
  // the update), each refilled for the next chunk as soon as its readers are done; the out tiles
  // S [K][PO] and U [C][PO] bf16 (the record's [row][column] layout); each warp's partial sum of
  // S^T W^T over its keys ([32 values][32 lanes] fp32). It leaves room on a multiprocessor for a
  // block of the state-gradient scan beside it (bwd_scans_share_multiprocessors).
  extern __shared__ float4 smem4[];
  bf16* const Wh = reinterpret_cast<bf16*>(smem4);
  bf16* const Wl = Wh + C * PB;
  bf16* const Kr = Wl + C * PB;
  float* const Gs = reinterpret_cast<float*>(Kr + C * PB);
  float* const ks = Gs + C;
  float* const part = ks + C;  // [warp][C / 2][32]
  bf16* const So = reinterpret_cast<bf16*>(part + (NT / 32) * (C / 2) * 32);
  bf16* const Uo = So + K * PO;
  // The state-gradient scan, launched after this one (bwd_launch.cuh), may start now: it reads
  // nothing this kernel writes.
  grid_launch_dependents();

  // S^T: st[n] the accumulator tile of keys kb + 8n .. + 8: (column cw + g + 8 (e / 2), key
  // kb + 8n + 2t + e % 2) for element e.
  float st[KH / 8][4];
#pragma unroll
  for (int n = 0; n < KH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      st[n][e] =
          blk.slot.in
              ? blk.slot.in[int64_t(kb + 8 * n + 2 * t + (e & 1)) * V + c0 + cw + g + 8 * (e >> 1)]
              : 0.f;

  const E* kraw = static_cast<const E*>(p.k);
  const int nch = int((sr.len + C - 1) / C);
  auto issue_w = [&](int ch) {  // W's parts, G, kscale of chunk ch
    const float* rec = rec0 + ch * rstep;
    const bf16* rb = reinterpret_cast<const bf16*>(rec);
    cp_tile_bf16<K>(Wh, PB, rb + R.b_wh, C);
    cp_tile_bf16<K>(Wl, PB, rb + R.b_wl, C);
    bwd_cp_rows(Gs, C, rec + R.sc + kScG * C, C, 1, C);
    bwd_cp_rows(ks, C, rec + R.sc + kScKscale * C, C, 1, C);
    cp_commit();
  };
  auto issue_k = [&](int ch) {  // the raw keys of chunk ch
    const int64_t cs = int64_t(ch) * C;
    const int L = int(sr.len - cs < C ? sr.len - cs : C);
    cp_input_rows(Kr, PB, kraw, p.ks, sr.b, sr.t0 + cs, blk.h, L);
    cp_commit();
  };
  // Lane address of stmatrix.trans for an out tile (pitch PO): matrix m = lane / 8 of a 16 x 16
  // block at row r0 (keys or tokens) holds columns cw + 8 (m % 2), rows r0 + 8 (m / 2).
  const int mrow = 8 * (lane >> 4) + (lane & 7), mcol = cw + 8 * ((lane >> 3) & 1);
  if (nch > 0) issue_w(0);
  for (int ch = 0; ch < nch; ++ch) {
    bf16* const rb = reinterpret_cast<bf16*>(rec0 + ch * rstep);
    // The thread's elements of U0 (the accumulator layout of U^T below: tokens 8j + 2t (+1),
    // columns cw + g (+8)), in flight through the product.
    float u0[C / 8][4];
    {
      const float* u0g = rec0 + ch * rstep + R.u + c0 + cw + g;
#pragma unroll
      for (int j = 0; j < C / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) u0[j][e] = u0g[(8 * j + 2 * t + (e & 1)) * V + 8 * (e >> 1)];
    }
    __syncthreads();  // the previous update is done with K, its copy-out with the out tiles
    issue_k(ch);
    cp_wait<1>();     // W's group of chunk ch (the keys may still be in flight)
    __syncthreads();  // W, G, kscale visible
    // The warp's part of S^T W^T (its keys) on the 16 x C tile (u[j]: tokens 8j .. 8j + 8): per
    // k-step of 16 keys, the A operand is S^T's two accumulator tiles split hi + lo; the hi part
    // also goes to the S out tile (S entering the chunk, rounded to nearest).
    float u[C / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < KH / 16; ++kk) {
      uint32_t ah[4], al[4];
      split_pair(st[2 * kk][0], st[2 * kk][1], ah[0], al[0]);
      split_pair(st[2 * kk][2], st[2 * kk][3], ah[1], al[1]);
      split_pair(st[2 * kk + 1][0], st[2 * kk + 1][1], ah[2], al[2]);
      split_pair(st[2 * kk + 1][2], st[2 * kk + 1][3], ah[3], al[3]);
      stsm4_t(So + (kb + 16 * kk + mrow) * PO + mcol, ah[0], ah[1], ah[2], ah[3]);
#pragma unroll
      for (int pp = 0; pp < C / 16; ++pp) {  // tokens 16 pp .. + 16: n-tiles 2 pp, 2 pp + 1
        uint32_t bh[4], bl[4];
        const int at =
            (16 * pp + (lane & 7) + (lane >> 4) * 8) * PB + kb + 16 * kk + ((lane >> 3) & 1) * 8;
        ldsm4(bh, Wh + at);
        ldsm4(bl, Wl + at);
        mma_bf16(u[2 * pp], ah, bh[0], bh[1]);
        mma_bf16(u[2 * pp + 1], ah, bh[2], bh[3]);
        mma_bf16(u[2 * pp], ah, bl[0], bl[1]);
        mma_bf16(u[2 * pp + 1], ah, bl[2], bl[3]);
        mma_bf16(u[2 * pp], al, bh[0], bh[1]);
        mma_bf16(u[2 * pp + 1], al, bh[2], bh[3]);
      }
    }
    // The pair's two parts summed (the same sum in both warps: fp32 addition commutes).
    exchange_pair_parts(u, part, warp, lane, cg);
    // U = U0 - W S: to the U out tile in bf16 (by the pair's first warp); U^T diag(Gamma_C. ks)
    // split, the update's A operand (k-steps of 16 tokens).
    const float gC = expf(Gs[C - 1]);
    uint32_t uh[C / 16][4], ul[C / 16][4];
#pragma unroll
    for (int pp = 0; pp < C / 16; ++pp) {
      uint32_t r[4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {  // n-tile j = 2 pp + jj: tokens i, i + 1
        const int j = 2 * pp + jj, i = 8 * j + 2 * t;
        const float fx = expf(Gs[C - 1] - Gs[i]) * ks[i];
        const float fy = expf(Gs[C - 1] - Gs[i + 1]) * ks[i + 1];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // columns cw + g + 8 h
          const float x = u0[j][2 * h] - u[j][2 * h];
          const float y = u0[j][2 * h + 1] - u[j][2 * h + 1];
          r[2 * jj + h] = round_bf16x2(x, y);
          // The A operand (16 x 16, row): a0 / a1 the rows g / g + 8 of tile 2 pp, a2 / a3 of
          // tile 2 pp + 1.
          split_pair(fx * x, fy * y, uh[pp][2 * jj + h], ul[pp][2 * jj + h]);
        }
      }
      if (kb == 0) stsm4_t(Uo + (16 * pp + mrow) * PO + mcol, r[0], r[1], r[2], r[3]);
    }
#pragma unroll
    for (int n = 0; n < KH / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] *= gC;
    cp_wait<0>();
    __syncthreads();  // the keys and the out tiles complete; W's group read
    if (ch + 1 < nch) issue_w(ch + 1);
    // S entering the chunk and U to the record in bf16.
    copy_out_tiles<VS, NT>(rb + R.b_s, So, rb + R.b_u, Uo, c0, tid);
    // S^T += (U^T diag(Gamma_C. ks)) K on the warp's keys: k-steps of 16 tokens, n-tiles of 8
    // keys (pairs by ldmatrix.trans of the raw key rows).
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk)
#pragma unroll
      for (int pp = 0; pp < KH / 16; ++pp) {
        uint32_t b[4];
        ldsm4_t(b, Kr + frag_b_kn(PB, 16 * kk, kb + 16 * pp, lane));
        mma_bf16(st[2 * pp], uh[kk], b[0], b[1]);
        mma_bf16(st[2 * pp + 1], uh[kk], b[2], b[3]);
        mma_bf16(st[2 * pp], ul[kk], b[0], b[1]);
        mma_bf16(st[2 * pp + 1], ul[kk], b[2], b[3]);
      }
  }
}

}  // namespace kla::kernels
