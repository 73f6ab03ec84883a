// Backward, pass 1 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_prep_bf16_kernel, one block of 8 warps per (chunk, value head,
// sequence) and several blocks a multiprocessor (kBwdPrepBf16Blocks), the same record as
// bwd/bwd_prep.cuh (its file comment has the math) with every product on bf16 tensor cores
// (mma.sync m16n8k16 on 16 x 32 warp tiles, bwd/bwd_warp_tile_bf16.cuh). The raw bf16 inputs are
// exact bf16 operands, so the per-token scales leave the products:
//   K^K^^T = diag(ks) (K K^T) diag(ks),   Q^K^^T = diag(qs) (Q K^T) diag(ks)
//   M = (Q^K^^T) o Gamma split hi + lo
//   W = (A^-1 diag(beta e^G ks)) K,       U0 = (A^-1 diag(beta vs)) V,   the scaled A^-1 split
// with ks, vs, qs the record's kscale, vscale, qscale. L and M are formed where the warps' K K^T
// and Q K^T tiles leave the tensor cores (L to shared memory for the inverse, M's parts to the
// record). dY goes to the record through registers, the raw queries (in the key head's first value
// head's record) before L takes their place; while six warps form A^-1 (prep/invert.cuh), the other
// two write the raw keys. X = M^T dY and Y = Q^^T diag(e^G) dY are not formed here: the
// state-gradient scan forms them from those. Neither k^ nor q^ goes to the record (the kernels
// after it scale the raw rows themselves), nor W in fp32: W goes split hi + lo in bf16 for the two
// scans (bwd/bwd_state_forward_bf16.cuh, bwd/bwd_state_backward_bf16.cuh) beside copies of the raw
// keys and queries, and U0 and the raw dY go by value slice, all as the scans' shared memory holds
// them (bwd_bf16_record_fits); A^-1 in bf16 for bwd/bwd_input_grads_bf16.cuh.
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

/// The chunk's bounds for the segmented state-gradient chain (kScChunk's kChunkBound entries,
/// bwd/bwd_layout.hpp), by the 64 threads ti = token i of the two warps beside the inverse: |q^_i|
/// |dy_i| (qs_i times the query's norm, sc row 10; dy_i from the record's dY slices, which this
/// block wrote before a barrier) and beta_i |k^_i|^2 = beta_i ks_i^2 |k_i|^2, each warp's sum, max
/// and min over its 32 tokens (rows past the sequence's end are zero and give zero). fp32 with
/// sqrtf: the window kernel's test has a margin far larger than their rounding.
__device__ __forceinline__ void bwd_prep_chunk_bounds(float* rec, const __nv_bfloat16* dy,
                                                      const float* sc, int ti) {
  using bf16 = __nv_bfloat16;
  constexpr int C = kChunk, VS = kBwdBf16Slice, PS = kBwdBf16SlicePitch;
  const BwdRecord R(kBwdCompiledHeadDim, kBwdCompiledHeadDim);
  const int i = ti;
  float d2 = 0.f;
#pragma unroll
  for (int s = 0; s < kBwdCompiledHeadDim / VS; ++s)
#pragma unroll
    for (int u = 0; u < VS / 8; ++u) {
      const uint4 raw = *reinterpret_cast<const uint4*>(dy + (s * C + i) * PS + 8 * u);
      const uint32_t* e = reinterpret_cast<const uint32_t*>(&raw);
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const float2 y = Dtype<bf16>::unpack2(e[h]);
        d2 = fmaf(y.x, y.x, fmaf(y.y, y.y, d2));
      }
    }
  const float ks = sc[i], out = sc[4 * C + i] * sqrtf(sc[10 * C + i]) * sqrtf(d2),
              kappa = sc[5 * C + i] * (ks * ks) * sc[9 * C + i];
  const float sum = warp_sum(out);
  // max and min that keep a NaN (fmaxf would drop it): a NaN bound certifies nothing
  float hi = kappa, lo = kappa;
  for (int off = 16; off > 0; off >>= 1) {
    const float oh = __shfl_xor_sync(0xffffffffu, hi, off),
                ol = __shfl_xor_sync(0xffffffffu, lo, off);
    hi = hi != hi || oh <= hi ? hi : oh;
    lo = lo != lo || ol >= lo ? lo : ol;
  }
  if ((i & 31) == 0) {
    float* cb = rec + R.sc + kScChunk * C + kChunkBound + (i >> 5);
    cb[0] = sum;
    cb[2] = hi;
    cb[4] = lo;
  }
}

/// The record of one (chunk, value head) tile pt (pt.L > 0), by the whole block
/// (kBwdPrepBf16Threads threads, bwd_prep_bf16_smem(kSaved) bytes of dynamic shared memory). j =
/// pt.hv % group: the key head's first value head (j = 0) also writes the raw keys and queries.
/// kSaved (kla_chunk_backward_saved: the forward saved S and U) forms no U0, so it copies no V rows
/// and splits no A^-1 diag(beta vs): the rest of its record is bitwise the default's. Its last
/// accesses to shared memory and the record are not followed by a barrier: a caller that goes on
/// to another tile waits at one first. kChainBounds: the segmented chain's bounds are written
/// where bp.chain_seg > 0; false compiles them out (the prep beside the scan, which runs only where
/// the chain does not).
template <class E, bool kSaved, bool kChainBounds = true>
__device__ __forceinline__ void bwd_prep_bf16_tile(const BwdParams& bp, const PrepTile& pt, int j) {
  using namespace bwd_bf16;
  const KernelParams& p = bp.f;
  const int L = pt.L;
  const BwdRecord R(K, V);
  float* const rec = bwd_record(bp, pt.n, pt.sr, pt.c, pt.hv);
  bf16* const rb = reinterpret_cast<bf16*>(rec);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // The inverse's warps and their named barrier (id 0 is __syncthreads); one that pads the other
  // warps to as many barrier waits (kInvBarriers, invert_unit_lower_on): compute-sanitizer
  // racecheck orders two warps' accesses by how many barriers each has waited at, and without the
  // padding reports accesses ordered by the next __syncthreads as hazards (as in scan/wy_scan.cuh).
  constexpr int kInvThreads = 32 * kInvWarps, kPrepBarInverse = 1, kPrepBarPad = 2;
  static_assert(kBwdPrepBf16Threads > kInvThreads, "warps besides the inverse's");

  // Shared memory (bwd_prep_bf16_smem(kSaved)): the raw K and Q rows [C][PB] bf16, L [C][PC] fp32
  // taking Q's place once the queries are read; the inverse's scratch; A^-1 [C][PC] fp32; the
  // scalars [10][C] (bwd_prep_scalars); but kSaved, the raw V rows [C][PB] and A^-1 diag(beta vs)
  // hi, lo [C][PBC] bf16. Once A^-1 is formed, A^-1 diag(beta e^G ks) hi, lo [C][PBC] bf16 go
  // where L and the scratch were.
  extern __shared__ float4 smem4[];
  bf16* const Kb = reinterpret_cast<bf16*>(smem4);
  bf16* const Qb = Kb + C * PB;
  float* const Ls = reinterpret_cast<float*>(Qb);
  float* const scratch = Ls + C * PC;
  float* const Xs = scratch + kInvScratch;
  float* const sc = Xs + C * PC;
  bf16* const Vb = reinterpret_cast<bf16*>(sc + 11 * C);
  bf16* const Uh = Vb + C * PB;
  bf16* const Ul = Uh + C * PBC;
  bf16* const Wh = reinterpret_cast<bf16*>(Ls);
  bf16* const Wl = Wh + C * PBC;
  static_assert(C * PC * 4 == C * PB * 2, "L takes Q's place");
  static_assert(2 * C * PBC * 2 <= (C * PC + kInvScratch) * 4,
                "W's split tiles fit where L and the scratch were");
  const float *const ks = sc, *const vs = sc + 1 * C, *const qs = sc + 4 * C;
  const float *const beta = sc + 5 * C, *const G = sc + 6 * C, *const bg = sc + 7 * C;

  cp_input_rows(Kb, PB, static_cast<const E*>(p.k), p.ks, pt.sr.b, pt.tb, pt.h, L);
  cp_input_rows(Qb, PB, static_cast<const E*>(p.q), p.qs, pt.sr.b, pt.tb, pt.h, L);
  if constexpr (!kSaved)  // V is U0's alone
    cp_input_rows(Vb, PB, static_cast<const E*>(p.v), p.vs, pt.sr.b, pt.tb, pt.hv, L);
  cp_commit();
  token_scalars_preload(p, pt.sr, pt.tb, L, pt.hv, sc + 5 * C, sc + 6 * C);  // eta, g
  {  // dY by value slice, its loads in flight while the rows are copied
    uint4 dy[(kDySliceUnits + kBwdPrepBf16Threads - 1) / kBwdPrepBf16Threads];
    load_dy_slices(dy, static_cast<const E*>(bp.dO), bp.dos, pt.sr.b, pt.tb, pt.hv, L);
    store_dy_slices(rb + R.b_do, dy);
  }
  cp_wait<0>();
  __syncthreads();
  bwd_prep_key_scalars(p, Kb, Qb, PB, K, L, sc, sc + 10 * C);
  // The warp's tile (pi0, pn0) of K K^T and of Q K^T, but for the two tiles wholly above the
  // diagonal (their L and M are zero).
  const int pi0 = (warp >> 1) * 16, pn0 = (warp & 1) * 32;
  float kk[4][4] = {}, qk[4][4] = {};
  if (pn0 <= pi0 + 15) {
    warp_tile_mma<false, true>(kk, Kb, PB, pi0, Kb, PB, pn0, K);
    warp_tile_mma<false, true>(qk, Qb, PB, pi0, Kb, PB, pn0, K);
  }
  // The raw queries, as the scans copy them in, in the key head's first value head's record.
  if (j == 0) store_padded_rows<K>(rb + R.b_qr, Qb, C, tid, kBwdPrepBf16Threads);
  __syncthreads();  // rows 0-4 and 9 of the scalars; the last reads of Q
  bwd_prep_head_scalars(p, L, sc, rec + R.sc);
  // On the tiles: L_ij = beta_i Gamma_ij k^_i.k^_j (j < i) to shared memory for the inverse;
  // M_ij = Gamma_ij q^_i.k^_j (j <= i) split, to the record (M hi, lo: one [2C][PBC] tile).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = pi0 + g + 8 * h;
#pragma unroll
    for (int jt = 0; jt < 4; ++jt) {
      const int j0 = pn0 + 8 * jt + 2 * t;
      float l[2], m[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int jj = j0 + e;
        const float gam = jj <= i ? expf(G[i] - G[jj]) : 0.f;
        l[e] = jj < i ? beta[i] * gam * ((ks[i] * ks[jj]) * kk[jt][2 * h + e]) : 0.f;
        m[e] = jj <= i ? ((qs[i] * ks[jj]) * qk[jt][2 * h + e]) * gam : 0.f;
      }
      *reinterpret_cast<float2*>(Ls + i * PC + j0) = make_float2(l[0], l[1]);
      split_bf16x2(m[0], m[1], *reinterpret_cast<__nv_bfloat162*>(rb + R.b_mh + i * PBC + j0),
                   *reinterpret_cast<__nv_bfloat162*>(rb + R.b_ml + i * PBC + j0));
    }
  }
  __syncthreads();  // L complete
  if (warp < kInvWarps) {
    // A^-1 (prep/invert.cuh) into Xs, its blocks above the diagonal left unwritten, on the first
    // warps alone, their barriers a named one.
    invert_unit_lower_on(Ls, Xs, scratch, [] { named_bar_sync(kPrepBarInverse, kInvThreads); });
  } else {
    // Meanwhile the other warps write M's padding and, in the key head's first value head's
    // record, the raw keys (as the scans copy them in).
    const int ti = thread_index_here() - kInvThreads, tn = kBwdPrepBf16Threads - kInvThreads;
    for (int r = ti; r < 2 * C; r += tn)
      *reinterpret_cast<uint4*>(rb + R.b_mh + r * PBC + C) = make_uint4(0u, 0u, 0u, 0u);
    if (j == 0) store_padded_rows<K>(rb + R.b_kr, Kb, C, ti, tn);
    // the segmented chain's alone (its windows); the prep beside the scan, which runs only where
    // the chain does not, carries none of it (kChainBounds)
    if constexpr (kChainBounds)
      if (bp.chain_seg > 0) bwd_prep_chunk_bounds(rec, rb + R.b_do, sc, ti);
#pragma unroll
    for (int i = 0; i < kInvBarriers; ++i)
      named_bar_sync(kPrepBarPad, kBwdPrepBf16Threads - kInvThreads);
  }
  __syncthreads();  // A^-1 complete; L and the scratch free
  // A^-1 (zero above its diagonal blocks) to the record in bf16, and split with its column
  // scales: A^-1 diag(beta e^G ks) and A^-1 diag(beta vs). Four columns of one 16-block a step.
  for (int idx = tid; idx < C * C / 4; idx += kBwdPrepBf16Threads) {
    const int i = idx / (C / 4), j4 = 4 * (idx % (C / 4));
    const float4 a = (j4 >> 4) > (i >> 4) ? make_float4(0.f, 0.f, 0.f, 0.f)
                                          : *reinterpret_cast<const float4*>(Xs + i * PC + j4);
    store_bf16x4(rb + R.b_ainv + i * C + j4, a);
    const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int at = i * PBC + j4 + e;
      split_bf16x2(av[e] * (bg[j4 + e] * ks[j4 + e]), av[e + 1] * (bg[j4 + e + 1] * ks[j4 + e + 1]),
                   *reinterpret_cast<__nv_bfloat162*>(Wh + at),
                   *reinterpret_cast<__nv_bfloat162*>(Wl + at));
      if constexpr (!kSaved)
        split_bf16x2(av[e] * (beta[j4 + e] * vs[j4 + e]),
                     av[e + 1] * (beta[j4 + e + 1] * vs[j4 + e + 1]),
                     *reinterpret_cast<__nv_bfloat162*>(Uh + at),
                     *reinterpret_cast<__nv_bfloat162*>(Ul + at));
    }
  }
  __syncthreads();
  // W = (A^-1 diag(beta e^G ks)) K, U0 = (A^-1 diag(beta vs)) V (A^-1 lower: k < i0 + 16): the
  // [C][K] tiles 16 x 32 a warp, two a warp.
#pragma unroll 1
  for (int u = warp; u < (C / 16) * (K / 32); u += kBwdPrepBf16Threads / 32) {
    const int i0 = (u >> 2) * 16, n0 = (u & 3) * 32;
    float w[4][4] = {};
    warp_tile_mma<false, false>(w, Wh, PBC, i0, Kb, PB, n0, i0 + 16);
    warp_tile_mma<false, false>(w, Wl, PBC, i0, Kb, PB, n0, i0 + 16);
    store_tile_split(rb + R.b_wh, rb + R.b_wl, PB, i0, n0, w);  // for both scans
    // U0 is the state scan's alone, which does not run where the forward saved S and U
    // (kSaved: the kernel instantiated for kla_chunk_backward_saved).
    if constexpr (!kSaved) {
      float uu[4][4] = {};
      warp_tile_mma<false, false>(uu, Uh, PBC, i0, Vb, PB, n0, i0 + 16);
      warp_tile_mma<false, false>(uu, Ul, PBC, i0, Vb, PB, n0, i0 + 16);
      store_tile_sliced(rec + R.u, C, i0, n0, uu);
    }
  }
  zero_tile_padding(rb + R.b_wh, 2 * C);  // W's padding
}

/// Grid (chunk x value head of the key head, key head, sequence): block x = c group + j prepares
/// chunk c for value head h group + j, so a key head's value heads of one chunk run side by side
/// and read its K and Q rows from L2 once (bwd_prep_bf16_tile).
template <class E, bool kSaved = false>
__global__ void __launch_bounds__(kBwdPrepBf16Threads, kBwdPrepBf16Blocks[kSaved])
    bwd_prep_bf16_kernel(const BwdParams bp) {
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  __builtin_assume(blockDim.x == kBwdPrepBf16Threads);  // the launcher's (bwd_launch.cuh)
  const int j = int(blockIdx.x) % bp.group;
  const PrepTile pt =
      bwd_head_tile(bp.f, int(blockIdx.x) / bp.group, int(blockIdx.y) * bp.group + j);
  if (pt.L == 0) return;
  bwd_prep_bf16_tile<E, kSaved>(bp, pt, j);
}

}  // namespace kla::kernels
