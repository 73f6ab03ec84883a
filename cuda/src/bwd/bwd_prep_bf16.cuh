// Backward, pass 1 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_prep_bf16_kernel, one block per (chunk group, key head,
// sequence) running its chunks in turn and each chunk's value heads in turn (the next chunk's rows
// copied in meanwhile), the same record as bwd/bwd_prep.cuh (its file comment has the math) with
// every product on bf16 tensor cores (mma.sync m16n8k16 on 16 x 32 warp tiles,
// bwd/bwd_warp_tile_bf16.cuh). The raw bf16 inputs are exact bf16 operands, so the per-token scales
// leave the products:
//   K^K^^T = diag(ks) (K K^T) diag(ks),   Q^K^^T = diag(qs) (Q K^T) diag(ks)
//   M = (Q^K^^T) o Gamma split hi + lo
//   W = (A^-1 diag(beta e^G ks)) K,       U0 = (A^-1 diag(beta vs)) V,   the scaled A^-1 split
// with ks, vs, qs the record's kscale, vscale, qscale. K K^T, Q K^T, the raw key and query rows and
// ks, vs, qs belong to the key head: they are formed once a chunk (the products kept in the warps'
// accumulators), the rest once per value head. While six warps form A^-1 (prep/invert.cuh), the
// other ten write M's parts, the raw queries and dY. X = M^T dY and Y = Q^^T diag(e^G) dY are not
// formed here: the state-gradient scan forms them from those. Neither k^ nor q^ goes to the record
// (the kernels after it scale the raw rows themselves), nor W in fp32: W goes split hi + lo in bf16
// for the two scans (bwd/bwd_state_forward_bf16.cuh, bwd/bwd_state_backward_bf16.cuh) beside copies
// of the raw keys and queries, and U0 and the raw dY go by value slice, all as the scans' shared
// memory holds them (bwd_bf16_record_fits); A^-1 in bf16 for bwd/bwd_input_grads_bf16.cuh.
//
// Precision: products of two raw operands are exact (fp32 sums in a fixed order); a split operand
// (bwd_bf16::split_bf16x2) errs below 2^-18 relative, so every other product below 2^-17: finer
// than the TF32 prep's one part an operand (2^-10) on every product, the state-gradient path's W
// included (and X and Y, which the scan forms on such operands), at the tensor-core cost of one
// TF32 part (two bf16 products of twice the depth). A^-1 as in bwd/bwd_prep.cuh (prep/invert.cuh,
// fp32 grade), then scaled and split.
#pragma once

#include <type_traits>

#include "bwd/bwd_prep_scalars.cuh"
#include "bwd/bwd_warp_tile_bf16.cuh"
#include "prep/invert.cuh"

namespace kla::kernels {

/// Grid (chunk group, key head, sequence): bp.prep_chunks consecutive chunks a block
/// (bwd_block_chunks), each chunk's value heads in turn; the next chunk's rows are copied while the
/// last value head of this one is prepared. The value heads' records are written as one block per
/// chunk and value head would write them (the same operands, sums and orders: bitwise the same
/// record). kSaved (kla_chunk_backward_saved: the forward saved S and U) forms no U0, so it copies
/// no V rows and splits no A^-1 diag(beta vs): the rest of its record is bitwise the default's.
template <class E, bool kSaved = false>
__global__ void __launch_bounds__(kBwdChunkThreads, 1) bwd_prep_bf16_kernel(const BwdParams bp) {
  using namespace bwd_bf16;
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  __builtin_assume(blockDim.x == kBwdChunkThreads);  // the launcher's (bwd_launch.cuh)
  const KernelParams& p = bp.f;
  // The block's first chunk, for the group's first value head.
  PrepTile pt = bwd_head_tile(p, int(blockIdx.x) * bp.prep_chunks, int(blockIdx.y) * bp.group);
  if (pt.L == 0) return;
  const BwdRecord R(K, V);
  const int tid = threadIdx.x, warp = tid >> 5;
  // The inverse's warps and their named barrier (id 0 is __syncthreads); one that pads the other
  // warps to as many barrier waits (kInvBarriers, invert_unit_lower_on): compute-sanitizer
  // racecheck orders two warps' accesses by how many barriers each has waited at, and without the
  // padding reports accesses ordered by the next __syncthreads as hazards (as in scan/wy_scan.cuh).
  constexpr int kInvThreads = 32 * kInvWarps, kPrepBarInverse = 1, kPrepBarPad = 2;

  // Shared memory (bwd_prep_bf16_smem): the raw K, Q, V, dO rows [C][PB] bf16; K K^T (then L) and
  // Q K^T (then A^-1) [C][PC] fp32; the split region: M hi, lo [C][PBC], then A^-1 diag(beta e^G
  // ks) hi, lo and A^-1 diag(beta vs) hi, lo [C][PBC]; the scalars [10][C] (bwd_prep_scalars); the
  // inverse's scratch; a second V and dO [C][PB], into which the next value head's rows are copied
  // while this one's are used (the two alternate head by head, across chunks too); a second K
  // [C][PB], the next chunk's (by the chunk's parity). The next chunk's Q goes to Q's buffer once
  // the chunk's last reads of it are done.
  extern __shared__ float4 smem4[];
  bf16* const Kb0 = reinterpret_cast<bf16*>(smem4);
  bf16* const Qb = Kb0 + C * PB;
  bf16* const Vb0 = Qb + C * PB;
  bf16* const dYb0 = Vb0 + C * PB;
  float* const Ls = reinterpret_cast<float*>(dYb0 + C * PB);
  float* const Xs = Ls + C * PC;
  bf16* const Mh = reinterpret_cast<bf16*>(Xs + C * PC);
  bf16* const Ml = Mh + C * PBC;
  bf16* const Wh = Mh;  // once M is written
  bf16* const Wl = Wh + C * PBC;
  bf16* const Uh = Wl + C * PBC;
  bf16* const Ul = Uh + C * PBC;
  float* const sc = reinterpret_cast<float*>(Ul + C * PBC);
  float* const scratch = sc + 10 * C;  // kInvScratch floats (invert_unit_lower)
  bf16* const Vb1 = reinterpret_cast<bf16*>(scratch + kInvScratch);
  bf16* const dYb1 = Vb1 + C * PB;
  bf16* const Kb1 = dYb1 + C * PB;
  const float *const ks = sc, *const vs = sc + 1 * C, *const qs = sc + 4 * C;
  const float *const beta = sc + 5 * C, *const G = sc + 6 * C, *const bg = sc + 7 * C;

  cp_input_rows(Kb0, PB, static_cast<const E*>(p.k), p.ks, pt.sr.b, pt.tb, pt.h, pt.L);
  cp_input_rows(Qb, PB, static_cast<const E*>(p.q), p.qs, pt.sr.b, pt.tb, pt.h, pt.L);
  if constexpr (!kSaved)  // V is U0's alone
    cp_input_rows(Vb0, PB, static_cast<const E*>(p.v), p.vs, pt.sr.b, pt.tb, pt.hv, pt.L);
  cp_input_rows(dYb0, PB, static_cast<const E*>(bp.dO), bp.dos, pt.sr.b, pt.tb, pt.hv, pt.L);
  cp_commit();
  token_scalars_preload(p, pt.sr, pt.tb, pt.L, pt.hv, sc + 5 * C, sc + 6 * C);  // eta, g

  // The warp's tile of W and U0 (i0, n0) and of a [C][C] product (pi0, pn0): warps 0-7 K K^T,
  // warps 8-15 Q K^T, but for the tiles wholly above the diagonal (masked below). Kept in the
  // accumulators for every value head of a chunk.
  const int i0 = (warp >> 2) * 16, n0 = (warp & 3) * 32;
  const int pi0 = ((warp & 7) >> 1) * 16, pn0 = (warp & 1) * 32;
  const bool raw_tile = pn0 <= pi0 + 15;
  float next_eta = 0.f, next_g = 0.f;  // threads [0, C): the next value head's eta, g
  int vbuf = 0;                        // the V and dO buffer of the value head being prepared
#pragma unroll 1
  for (int cc = 0;; ++cc) {
    const int L = pt.L;
    bf16* const Kb = cc & 1 ? Kb1 : Kb0;
    // Whether the block has a next chunk: its rows are copied during this chunk's last head.
    const bool more = bwd_block_has_next_chunk(pt, cc, bp.prep_chunks);
    // This chunk's first head's eta and g (the previous chunk's last reads of them were before the
    // barrier ahead of its W and U0); then its rows, copied during that chunk, visible.
    if (cc > 0 && tid < C) sc[5 * C + tid] = next_eta, sc[6 * C + tid] = next_g;
    cp_wait<0>();
    __syncthreads();
    bwd_prep_key_scalars(p, Kb, Qb, PB, K, L, sc);
    float raw[4][4] = {};
    if (raw_tile) warp_tile_mma<false, true>(raw, warp < 8 ? Kb : Qb, PB, pi0, Kb, PB, pn0, K);

#pragma unroll 1
    for (int jv = 0; jv < bp.group; ++jv, vbuf ^= 1) {
      const int hv = pt.hv + jv;
      float* rec = bwd_record(bp, pt.n, pt.sr, pt.c, hv);
      bf16* const Vb = vbuf ? Vb1 : Vb0;
      bf16* const dYb = vbuf ? dYb1 : dYb0;
      if (jv > 0) {  // this head's rows and scalars, copied and loaded during the previous head
        cp_wait<0>();
        if (tid < C) sc[5 * C + tid] = next_eta, sc[6 * C + tid] = next_g;
      }
      // The rows visible; the previous head's last reads of the other V and dO done (and of the
      // other K: the previous chunk's).
      __syncthreads();
      // The next value head's V and dO rows into the other buffer, with its eta and g: this chunk's
      // next head, or the next chunk's first (and that chunk's K rows). The kernel mutant
      // bwd_prep_stale_values skips the next head's V: it then runs on the V rows of the head two
      // before it (the block's second head: a buffer never written);
      // bwd_prep_next_chunk_keys_skipped skips the next chunk's K: it then runs on the K rows of
      // the chunk two before it (the block's second chunk: a buffer never written).
      if (jv + 1 < bp.group || more) {
        const PrepTile nt = jv + 1 < bp.group ? pt : next_chunk_tile(pt);
        const int nhv = jv + 1 < bp.group ? hv + 1 : pt.hv;
        if (!kSaved && !KLA_MUTANT(bwd_prep_stale_values))
          cp_input_rows(vbuf ? Vb0 : Vb1, PB, static_cast<const E*>(p.v), p.vs, nt.sr.b, nt.tb, nhv,
                        nt.L);
        cp_input_rows(vbuf ? dYb0 : dYb1, PB, static_cast<const E*>(bp.dO), bp.dos, nt.sr.b, nt.tb,
                      nhv, nt.L);
        if (jv + 1 == bp.group && !KLA_MUTANT(bwd_prep_next_chunk_keys_skipped))
          cp_input_rows(cc & 1 ? Kb0 : Kb1, PB, static_cast<const E*>(p.k), p.ks, nt.sr.b, nt.tb,
                        nt.h, nt.L);
        cp_commit();
        if (tid < C) {  // as token_scalars_preload, into registers
          next_eta = tid < nt.L ? token_eta(p, nt.sr.b, nt.tb + tid, nhv) : 0.f;
          next_g = tid < nt.L ? token_log_decay(p, nt.sr.b, nt.tb + tid, nhv) : 0.f;
        }
      }
      bwd_prep_head_scalars(p, L, sc, rec + R.sc);
      if (raw_tile) store_tile(warp < 8 ? Ls : Xs, PC, pi0, pn0, raw);
      __syncthreads();
      // L_ij = beta_i Gamma_ij k^_i.k^_j (j < i) in place; M_ij = Gamma_ij q^_i.k^_j (j <= i)
      // split.
      for (int idx = tid; idx < C * C / 2; idx += kBwdChunkThreads) {
        const int i = idx / (C / 2), j = 2 * (idx % (C / 2));
        float l[2], m[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = j + e;
          const float gam = jj <= i ? expf(G[i] - G[jj]) : 0.f;
          l[e] = jj < i ? beta[i] * gam * ((ks[i] * ks[jj]) * Ls[i * PC + jj]) : 0.f;
          m[e] = jj <= i ? ((qs[i] * ks[jj]) * Xs[i * PC + jj]) * gam : 0.f;
        }
        *reinterpret_cast<float2*>(Ls + i * PC + j) = make_float2(l[0], l[1]);
        split_bf16x2(m[0], m[1], *reinterpret_cast<__nv_bfloat162*>(Mh + i * PBC + j),
                     *reinterpret_cast<__nv_bfloat162*>(Ml + i * PBC + j));
      }
      __syncthreads();
      if (warp < kInvWarps) {
        // A^-1 (prep/invert.cuh) into Xs (Q K^T's, read above), its blocks above the diagonal left
        // unwritten, on the first warps alone, their barriers a named one.
        invert_unit_lower_on(Ls, Xs, scratch, [] { named_bar_sync(kPrepBarInverse, kInvThreads); });
      } else {
        // Meanwhile the other ten warps write what the state-gradient scan forms X and Y from (M's
        // parts; the raw queries, in the key head's first value head's record; the raw dY by value
        // slice): none of it reads A^-1.
        const int ti = thread_index_here() - kInvThreads, tn = kBwdChunkThreads - kInvThreads;
        bf16* const rb = reinterpret_cast<bf16*>(rec);
        store_padded_rows<C>(rb + R.b_mh, Mh, 2 * C, ti, tn);  // M hi, lo: one [2C][PBC] tile
        if (jv == 0) store_padded_rows<K>(rb + R.b_qr, Qb, C, ti, tn);
        store_slices(rb + R.b_do, dYb, ti, tn);
#pragma unroll
        for (int i = 0; i < kInvBarriers; ++i)
          named_bar_sync(kPrepBarPad, kBwdChunkThreads - kInvThreads);
      }
      __syncthreads();  // A^-1 complete; M written from the split region; the last reads of Q done
      if (jv + 1 == bp.group && more) {  // the next chunk's Q rows
        const PrepTile nt = next_chunk_tile(pt);
        cp_input_rows(Qb, PB, static_cast<const E*>(p.q), p.qs, nt.sr.b, nt.tb, nt.h, nt.L);
        cp_commit();
      }
      // A^-1 (zero above its diagonal blocks) to the record in bf16, and split with its column
      // scales: A^-1 diag(beta e^G ks) and A^-1 diag(beta vs). Four columns of one 16-block a step.
      for (int idx = tid; idx < C * C / 4; idx += kBwdChunkThreads) {
        const int i = idx / (C / 4), j = 4 * (idx % (C / 4));
        const float4 a = (j >> 4) > (i >> 4) ? make_float4(0.f, 0.f, 0.f, 0.f)
                                             : *reinterpret_cast<const float4*>(Xs + i * PC + j);
        store_bf16x4(reinterpret_cast<bf16*>(rec) + R.b_ainv + i * C + j, a);
        const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int at = i * PBC + j + e;
          split_bf16x2(av[e] * (bg[j + e] * ks[j + e]), av[e + 1] * (bg[j + e + 1] * ks[j + e + 1]),
                       *reinterpret_cast<__nv_bfloat162*>(Wh + at),
                       *reinterpret_cast<__nv_bfloat162*>(Wl + at));
          if constexpr (!kSaved)
            split_bf16x2(av[e] * (beta[j + e] * vs[j + e]),
                         av[e + 1] * (beta[j + e + 1] * vs[j + e + 1]),
                         *reinterpret_cast<__nv_bfloat162*>(Uh + at),
                         *reinterpret_cast<__nv_bfloat162*>(Ul + at));
        }
      }
      __syncthreads();
      {  // W = (A^-1 diag(beta e^G ks)) K, U0 = (A^-1 diag(beta vs)) V (A^-1 lower: k < i0 + 16)
        float w[4][4] = {};
        warp_tile_mma<false, false>(w, Wh, PBC, i0, Kb, PB, n0, i0 + 16);
        warp_tile_mma<false, false>(w, Wl, PBC, i0, Kb, PB, n0, i0 + 16);
        bf16* const rb = reinterpret_cast<bf16*>(rec);
        store_tile_split(rb + R.b_wh, rb + R.b_wl, PB, i0, n0, w);  // for both scans
        // U0 is the state scan's alone, which does not run where the forward saved S and U
        // (kSaved: the kernel instantiated for kla_chunk_backward_saved).
        if constexpr (!kSaved) {
          float u[4][4] = {};
          warp_tile_mma<false, false>(u, Uh, PBC, i0, Vb, PB, n0, i0 + 16);
          warp_tile_mma<false, false>(u, Ul, PBC, i0, Vb, PB, n0, i0 + 16);
          store_tile_sliced(rec + R.u, C, i0, n0, u);
        }
      }
      {  // W's padding, and in the key head's first value head's record the raw keys, as the scans
         // copy them in (bwd_bf16_record_fits)
        bf16* const rb = reinterpret_cast<bf16*>(rec);
        if (jv == 0)
          store_padded_rows<K>(rb + R.b_kr, Kb, C, thread_index_here(), kBwdChunkThreads);
        zero_tile_padding(rb + R.b_wh, 2 * C);
      }
    }
    if (!more) break;
    pt = next_chunk_tile(pt);
  }
}

}  // namespace kla::kernels
