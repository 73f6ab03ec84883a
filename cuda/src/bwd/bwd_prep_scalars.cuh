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
/// 5 beta, 6 G, 7 beta e^G, 8 e^G. Rows 5 and 6 hold eta and g from token_scalars_preload on entry.
/// Ks, Qs: the chunk's raw key and query rows ([C] rows of pitch pk, fp32 or bf16: raw 16-bit
/// inputs are exact in either, so the sums below are the same), zero past L. Norms are summed
/// in a fixed order (lane-strided, then the warp's shuffle tree), G by a fixed shuffle scan.
/// Called by every thread after the rows and the preload are visible (a barrier); rows 0-6 are
/// visible to the block on return, rows 7-8 and the record's rows (rs) after the caller's next
/// barrier.
template <class T>
__device__ __forceinline__ void bwd_prep_scalars(const KernelParams& p, const T* Ks, const T* Qs,
                                                 int pk, int K, int L, float* sc, float* rs) {
  constexpr int C = kChunk;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // One warp per token.
  for (int i = warp; i < C; i += int(blockDim.x >> 5)) {
    float n2 = 0.f, qn2 = 0.f;
    for (int r = lane; r < K; r += 32) {
      n2 = fmaf(tof(Ks[i * pk + r]), tof(Ks[i * pk + r]), n2);
      qn2 = fmaf(tof(Qs[i * pk + r]), tof(Qs[i * pk + r]), qn2);
    }
    n2 = warp_sum(n2);
    qn2 = warp_sum(qn2);
    if (lane == 0) {
      const bool ok = i < L;
      const float eta = sc[5 * C + i];  // 0 past L (token_scalars_preload)
      const TokenCoef tc = ok ? token_coef(n2, eta, p) : TokenCoef{0.f, 0.f, 0.f};
      sc[0 * C + i] = tc.kscale;
      sc[1 * C + i] = tc.vscale;
      sc[2 * C + i] = p.l2norm == 2 ? 1.0f / sqrtf(n2 + kQkL2NormEps) : 1.0f;
      sc[3 * C + i] = p.l2norm == 2   ? 1.0f / sqrtf(qn2 + kQkL2NormEps)
                      : p.l2norm == 1 ? (qn2 > 0.f ? 1.0f / sqrtf(qn2) : 0.f)
                                      : 1.0f;
      sc[4 * C + i] = ok ? readout_scale(qn2, p) : 0.f;
      sc[5 * C + i] = tc.beta;
    }
  }
  __syncthreads();
  if (warp == 0) chunk_log_decay_scan(sc + 6 * C, lane);  // G
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

}  // namespace kla::kernels
