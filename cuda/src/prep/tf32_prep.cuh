// TF32 path, pass 1 (prep): chunk_tf32_prep_kernel, fully parallel over (sequence, chunk, value
// head). Per-token norms, beta, cumulative log decays G; K K^T and Q K^T on the tensor cores
// (mma.sync TF32; fp32 inputs split hi + lo); the unit lower-triangular inverse
// T = (I + B(A^- o K^K^T))^-1 in fp32 by 16 x 16 blocks (prep/invert.cuh); the read-out matrix
// P_ij = qs_i exp(G_i - G_j) (q_i . k^_j) (j <= i) and the per-token scalars. All fp32, written to
// the chunk's workspace record (layout/chunk_geometry.hpp). The scan (scan/tf32_scan.cuh) reads it.
//
// Precision: no fp32 intermediate is rounded to TF32: an fp32 operand enters as hi + lo (about 21
// significant bits), raw bf16 / fp16 inputs are exact in TF32 and enter unsplit. Decay ratios are
// exp(G_i - G_j); entries of the within-chunk matrix are bounded by eta (normalised keys).
#pragma once

#include <type_traits>

#include "arch/copy.cuh"
#include "arch/mma_tf32.cuh"
#include "layout/tf32_layout.hpp"
#include "prep/invert.cuh"
#include "prep/token_scalars.cuh"

namespace kla::kernels {

template <class E>
__global__ void __launch_bounds__(kTf32PrepThreads)
    chunk_tf32_prep_kernel(const KernelParams p, float* __restrict__ ws) {
  constexpr bool kSplitIn = std::is_same_v<E, float>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = p.K, KP = raw_pitch(int(sizeof(E)), K);
  constexpr int C = kChunk;
  const PrepTile pt = prep_tile(p);
  if (pt.L == 0) return;
  const int c = pt.c, hv = pt.hv, n = pt.n, h = pt.h, L = pt.L;
  const SeqRange sr = pt.sr;
  const int64_t tb = pt.tb;

  E* ks = reinterpret_cast<E*>(smem);  // [C][KP] raw keys
  E* qs = ks + C * KP;                 // [C][KP] raw queries
  float* tm = smem;  // [C][kMatrixPitch] T (+ scratch); aliases ks / qs after the products
  float* lm = smem + tf32_prep_kq_floats(K, int(sizeof(E)));  // [C][kMatrixPitch] B(A^- o K^K^T)
  float* ksc = lm + C * kMatrixPitch;                         // kscale
  float* bet = ksc + C;                                       // beta
  float* qsc = bet + C;                                       // read-out scale
  float* Gv = qsc + C;                                        // log decay, then cumulative
  float* vsc = Gv + C;                                        // value scale

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const E* kb = static_cast<const E*>(p.k);
  const E* qb = static_cast<const E*>(p.q);
  constexpr int VE = int(16 / sizeof(E));
  const int kvec = K / VE;
  for (int idx = tid; idx < C * kvec; idx += kTf32PrepThreads) {
    const int i = idx / kvec, r = (idx % kvec) * VE;
    const int64_t t = tb + (i < L ? i : 0);
    cp16(ks + i * KP + r, kb + sr.b * p.ks[0] + t * p.ks[1] + int64_t(h) * p.ks[2] + r, i < L);
    cp16(qs + i * KP + r, qb + sr.b * p.qs[0] + t * p.qs[1] + int64_t(h) * p.qs[2] + r, i < L);
  }
  cp_commit();
  token_scalars_preload(p, sr, tb, L, hv, bet, Gv);
  cp_wait<0>();
  __syncthreads();
  chunk_token_scalars(p, L, ks, qs, KP, K, ksc, vsc, bet, qsc, Gv);

  float* w = ws + (chunk_slot(p, n, sr, c) * p.HV + hv) * p.ws_record_floats;
  // K K^T and Q K^T on the 20 lower 16 x 8 tiles (40 units over the warps), scaled on the
  // way out: lm = B(A^- o K^K^T) (strict), P = qs_i (A o Q K^^T) into the workspace.
  for (int u = warp; u < 40; u += kTf32PrepThreads / 32) {
    const bool isq = u >= 20;
    const int tl = isq ? u - 20 : u;
    const int mi = tl < 2 ? 0 : tl < 6 ? 1 : tl < 12 ? 2 : 3, nj = tl - mi * (mi + 1);
    const E* A = isq ? qs : ks;
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    float d2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int kk = 0; kk < K; kk += 8) {
      const FragB b = load_b_nk_perm<kSplitIn>(ks, KP, kk, nj * 8, g, t4);
      const FragA a = load_a_perm<kSplitIn>(A, KP, mi * 16, kk, g, t4);
      mma3<kSplitIn, kSplitIn>(d0, d1, d2, a, b);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = mi * 16 + g + (e >> 1) * 8, j = nj * 8 + 2 * t4 + (e & 1);
      const float x = (d0[e] + d1[e]) + d2[e];
      const float gam = j <= i ? expf(Gv[i] - Gv[j]) : 0.f;
      if (isq)
        w[kTf32P + i * C + j] = j <= i ? qsc[i] * gam * ksc[j] * x : 0.f;
      else
        lm[i * kMatrixPitch + j] = j < i ? bet[i] * gam * (ksc[i] * ksc[j]) * x : 0.f;
    }
  }
  for (int idx = tid; idx < C * C; idx += kTf32PrepThreads) {  // P above the lower tiles
    const int i = idx / C, j = idx % C;
    if ((j >> 3) > 2 * (i >> 4) + 1) w[kTf32P + idx] = 0.f;
  }
  __syncthreads();  // lm complete; ks / qs free (tm aliases them)
  invert_unit_lower(lm, tm, tm + C * kMatrixPitch);
  for (int idx = tid; idx < C * C; idx += kTf32PrepThreads) {
    const int i = idx / C, j = idx % C;
    w[kTf32T + idx] = (j >> 4) > (i >> 4) ? 0.f : tm[i * kMatrixPitch + j];
  }
  // Per-token scalars: 0 rhs scale beta*vscale, 1 gamma_i*kscale_i/vscale_i (the scan forms
  // R = beta kscale (rho V - gamma K S), rho = vscale / kscale, as (beta vscale) (V - gamma / rho
  // K S); kscale = vscale, so gamma_i itself, except under the qk l2-norm), 2 gamma_i*qscale_i,
  // 3 kscale_i*gamma_L/gamma_i (0 past the chunk end), 4 [gamma_L, 0, ...].
  if (tid < C) {
    const int i = tid;
    const float Gend = Gv[L - 1], gi = expf(Gv[i]);
    w[kTf32Scalars + 0 * C + i] = bet[i] * vsc[i];
    w[kTf32Scalars + 1 * C + i] = vsc[i] > 0.f ? gi * (ksc[i] / vsc[i]) : gi;
    w[kTf32Scalars + 2 * C + i] = gi * qsc[i];
    w[kTf32Scalars + 3 * C + i] = i < L ? ksc[i] * expf(Gend - Gv[i]) : 0.f;
    w[kTf32Scalars + 4 * C + i] = i == 0 ? expf(Gend) : 0.f;
  }
}

}  // namespace kla::kernels
