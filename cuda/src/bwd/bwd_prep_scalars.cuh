// The backward prep's per-token scalars, shared by its two kernels (bwd/bwd_prep.cuh on fp32
// tiles, bwd/bwd_prep_bf16.cuh on bf16 ones): from a chunk's raw key and query rows, the
// normalised-key coefficients and read-out scale (common/kernel_common.cuh token_coef,
// readout_scale), the inclusive cumulative log decay G, and the record's scalar rows
// (bwd/bwd_layout.hpp BwdScalar).
#pragma once

#include "bwd/bwd_tiles.cuh"
#include "prep/token_scalars.cuh"

namespace kla::kernels {

/// Shared scalars [10][C] of the prep (rows): 0 kscale, 1 vscale, 2 knorm, 3 qnorm, 4 qscale,
/// 5 beta, 6 G, 7 beta e^G, 8 e^G, 9 the key's squared norm. Rows 0-4 and 9 depend on the key head
/// only (bwd_prep_key_scalars), rows 5-8 on the value head too (bwd_prep_head_scalars), so a block
/// running a key head's value heads forms the first once.

/// Rows 0-4 and 9 from a chunk's raw key and query rows (Ks, Qs: [C] rows of pitch pk, fp32 or
/// bf16, 16-byte aligned: raw 16-bit inputs are exact in either, so the sums below are the same),
/// zero past L. A pair of threads a row (the C key rows, then the C query rows), each squared norm
/// in a fixed order: the 32 lane-strided partial sums of element r into partial r mod 32 (r
/// increasing), then the butterfly of warp_sum over them, its first level across the pair. So the
/// divisions and square roots of the scalars run on 64 threads a norm at once, not on one lane of
/// a warp a token in turn. Called by every thread (blockDim.x a multiple of 64) after the rows are
/// visible; the rows are visible after the caller's next barrier.
/// qn2 (optional, [C]): the queries' squared norms too (the bf16 prep's chunk bounds).
template <class T>
__device__ __forceinline__ void bwd_prep_key_scalars(const KernelParams& p, const T* Ks,
                                                     const T* Qs, int pk, int K, int L, float* sc,
                                                     float* qn2 = nullptr) {
  constexpr int C = kChunk, VE = 16 / int(sizeof(T)), kHalf = 16 / VE;  // vectors a half-cycle
  const int half = int(threadIdx.x) & 1;
  // 2 C rows, 16 a warp: every lane of a warp takes a row or none (the shuffle below is the
  // warp's).
  for (int task = int(threadIdx.x) >> 1; task < 2 * C; task += int(blockDim.x) >> 1) {
    const bool isq = task >= C;
    const int i = isq ? task - C : task;
    const T* row = (isq ? Qs : Ks) + i * pk;
    // a[l]: partial 16 half + l, elements r = 32 m + 16 half + l for m = 0, 1, ...
    float a[16] = {};
    for (int v0 = 0; v0 < K / VE; v0 += 2 * kHalf) {
#pragma unroll
      for (int vv = 0; vv < kHalf; ++vv) {
        const uint4 raw = *reinterpret_cast<const uint4*>(row + VE * (v0 + kHalf * half + vv));
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int u = 0; u < VE; ++u) a[VE * vv + u] = fmaf(tof(e[u]), tof(e[u]), a[VE * vv + u]);
      }
    }
    // warp_sum's butterfly on lane 0's side: x + x^16 (across the pair), then x + x^8, ..., x +
    // x^1. The kernel mutant bwd_prep_norm_pair_unsummed drops the pair's level: each norm then
    // sums the squares of half its elements.
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const float other = __shfl_xor_sync(0xffffffffu, a[l], 1);
      if (!KLA_MUTANT(bwd_prep_norm_pair_unsummed)) a[l] += other;
    }
#pragma unroll
    for (int l = 0; l < 8; ++l) a[l] += a[l + 8];
#pragma unroll
    for (int l = 0; l < 4; ++l) a[l] += a[l + 4];
    a[0] += a[2], a[1] += a[3];
    a[0] += a[1];
    const float n2 = a[0];
    const bool ok = i < L;
    if (half == 1) continue;
    if (!isq) {
      // eta does not enter kscale or vscale (token_coef); beta is the head's (below)
      const TokenCoef tc = ok ? token_coef(n2, 0.f, p) : TokenCoef{0.f, 0.f, 0.f};
      sc[0 * C + i] = tc.kscale;
      sc[1 * C + i] = tc.vscale;
      sc[2 * C + i] = p.l2norm == 2 ? 1.0f / sqrtf(n2 + kQkL2NormEps) : 1.0f;
      sc[9 * C + i] = n2;
    } else {
      if (qn2) qn2[i] = n2;
      sc[3 * C + i] = p.l2norm == 2   ? 1.0f / sqrtf(n2 + kQkL2NormEps)
                      : p.l2norm == 1 ? (n2 > 0.f ? 1.0f / sqrtf(n2) : 0.f)
                                      : 1.0f;
      sc[4 * C + i] = ok ? readout_scale(n2, p) : 0.f;
    }
  }
}

/// Rows 5-8 of value head hv and its record's scalar rows (rs, bwd/bwd_layout.hpp BwdScalar):
/// beta (token_coef of row 9 and the eta row 5 holds on entry, token_scalars_preload), the
/// inclusive cumulative log decay G in row 6 (g on entry; a fixed shuffle scan), beta e^G, e^G.
/// Called by every thread once rows 0-6 and 9 are visible (a barrier); rows 5-6 are visible to
/// the block on return, rows 7-8 and the record's rows after the caller's next barrier.
__device__ __forceinline__ void bwd_prep_head_scalars(const KernelParams& p, int L, float* sc,
                                                      float* rs) {
  constexpr int C = kChunk;
  const int tid = threadIdx.x;
  if (tid < C) {  // warps 0 and 1: beta in place of eta (row 6 is warp 0's scan's alone)
    const int i = tid;
    sc[5 * C + i] = i < L ? token_coef(sc[9 * C + i], sc[5 * C + i], p).beta : 0.f;
  }
  if (tid < 32) chunk_log_decay_scan(sc + 6 * C, tid);  // G
  __syncthreads();
  if (tid < C) {
    const int i = tid;
    const float* G = sc + 6 * C;
    rs[kScKscale * C + i] = sc[0 * C + i];
    rs[kScVscale * C + i] = sc[1 * C + i];
    rs[kScKnorm * C + i] = sc[2 * C + i];
    rs[kScQnorm * C + i] = sc[3 * C + i];
    rs[kScQscale * C + i] = sc[4 * C + i];
    rs[kScBeta * C + i] = sc[5 * C + i];
    rs[kScG * C + i] = G[i];
    rs[kScChunk * C + i] = i == 0 ? expf(G[C - 1]) : 0.f;
    sc[8 * C + i] = expf(G[i]);
    sc[7 * C + i] = sc[5 * C + i] * sc[8 * C + i];
  }
}

/// Both: the prep of one value head (bwd/bwd_prep.cuh). Rows 5 and 6 hold eta and g from
/// token_scalars_preload on entry; called by every thread after the rows and the preload are
/// visible (a barrier); rows 0-6 are visible to the block on return, rows 7-8 and the record's
/// rows (rs) after the caller's next barrier.
template <class T>
__device__ __forceinline__ void bwd_prep_scalars(const KernelParams& p, const T* Ks, const T* Qs,
                                                 int pk, int K, int L, float* sc, float* rs) {
  bwd_prep_key_scalars(p, Ks, Qs, pk, K, L, sc);
  __syncthreads();
  bwd_prep_head_scalars(p, L, sc, rs);
}

}  // namespace kla::kernels
