// Backward, pass 1 (prep): bwd_prep_kernel, one block per (chunk, value head, sequence), fully
// parallel. The chunk's prologue in the normalised-key form (common/kernel_common.cuh token_coef,
// readout_scale): k^ = kscale k, v^ = vscale v, q^ = qscale q, beta, the inclusive cumulative log
// decay G; then the chunk system of eq. (chunk_system) (grad_chunk.hpp, _chunk_torch.py):
//   L_ij = beta_i Gamma_ij k^_i.k^_j (j < i),  A = I + L,  A^-1 (prep/invert.cuh),
//   W = A^-1 diag(beta e^G) K^,  U0 = A^-1 diag(beta) V^,  M = (Q^ K^^T) o Gamma (j <= i),
// and the state-gradient scan's terms of dO (dY = dO: the read-out scale is inside q^):
//   X = M^T dY,  Y = Q^^T diag(e^G) dY,
// written to the chunk's record (bwd/bwd_layout.hpp) with k^, q^, A^-1 and the per-token scalars
// (not v^: its one reader scales the raw values). FAST bf16 at K = V = 128 runs
// bwd/bwd_prep_bf16.cuh instead.
//
// Precision: fp32 (raw bf16 / fp16 inputs are exact in fp32; A^-1's blocks below the diagonal
// with split-TF32 products, ~2^-21 relative each, prep/invert.cuh, in both arithmetics; the other
// products in the call's, bwd/block_gemm.cuh); Gamma_ij = exp(G_i - G_j)
// (j <= i) is at most 1; the entries of L are bounded by eta (normalised keys), so the
// substitution's growth is that of the forward's chunk system.
#pragma once

#include "bwd/block_gemm.cuh"
#include "bwd/bwd_prep_scalars.cuh"
#include "prep/invert.cuh"

namespace kla::kernels {

template <class E, bool kFast, int kHD>
__global__ void __launch_bounds__(kBwdChunkThreads) bwd_prep_kernel(const BwdParams bp) {
  __builtin_assume(blockDim.x == kBwdChunkThreads);  // the launcher's (bwd_launch.cuh)
  static_assert(!kBwdBf16Record<E, kFast, kHD>, "that configuration runs bwd/bwd_prep_bf16.cuh");
  const KernelParams& p = bp.f;
  constexpr int C = kChunk;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = bwd_head_dim<kHD>(p.K), V = bwd_head_dim<kHD>(p.V), PK = bwd_pitch(K),
            PV = bwd_pitch(V), PC = bwd_pitch(C);
  const PrepTile pt = prep_tile(p);
  if (pt.L == 0) return;
  const int L = pt.L, hv = pt.hv, h = pt.h;
  float* Ks = smem;         // [C][PK] raw keys, then k^, then diag(beta e^G) k^
  float* Qs = Ks + C * PK;  // [C][PK] raw queries, then q^
  float* Vs = Qs + C * PK;  // [C][PV] raw values, then v^, then diag(beta) v^
  float* Ys = Vs + C * PV;  // [C][PV] dO, then diag(e^G) dO
  float* Ls = Ys + C * PV;  // [C][PC] K^ K^^T, then L
  float* Xs = Ls + C * PC;  // [C][PC] Q^ K^^T, then A^-1
  // [10][C] kscale, vscale, knorm, qnorm, qscale, beta, G, beta e^G, e^G
  float* sc = Xs + C * PC;
  float* scratch = sc + 10 * C;  // kInvScratch floats (invert_unit_lower)
  float* rec = bwd_record(bp, pt.n, pt.sr, pt.c, hv);
  const int tid = threadIdx.x;

  bwd_load_rows(Ks, PK, static_cast<const E*>(p.k), p.ks, pt.sr.b, pt.tb, h, L, K);
  bwd_load_rows(Qs, PK, static_cast<const E*>(p.q), p.qs, pt.sr.b, pt.tb, h, L, K);
  bwd_load_rows(Vs, PV, static_cast<const E*>(p.v), p.vs, pt.sr.b, pt.tb, hv, L, V);
  bwd_load_rows(Ys, PV, static_cast<const E*>(bp.dO), bp.dos, pt.sr.b, pt.tb, hv, L, V);
  token_scalars_preload(p, pt.sr, pt.tb, L, hv, sc + 5 * C, sc + 6 * C);  // eta, g
  __syncthreads();
  bwd_prep_scalars(p, Ks, Qs, PK, K, L, sc, rec + BwdRecord(K, V).sc);
  const float* G = sc + 6 * C;
  const float* beta = sc + 5 * C;
  bwd_scale_rows(Ks, PK, C, K, sc + 0 * C);  // k^ = kscale k
  bwd_scale_rows(Qs, PK, C, K, sc + 4 * C);  // q^ = qscale q
  bwd_scale_rows(Vs, PV, C, V, sc + 1 * C);  // v^ = vscale v
  __syncthreads();
  const BwdRecord R(K, V);
  bwd_store_rows(rec + R.kh, K, Ks, PK, C, K);
  bwd_store_rows(rec + R.qh, K, Qs, PK, C, K);
  block_gemm<kFast, false, true, false>(C, C, K, Ks, PK, Ks, PK, Ls, PC, 1.f);  // K^ K^^T
  block_gemm<kFast, false, true, false>(C, C, K, Qs, PK, Ks, PK, Xs, PC, 1.f);  // Q^ K^^T
  __syncthreads();
  for (int idx = tid; idx < C * C; idx += kBwdChunkThreads) {
    const int i = idx / C, j = idx % C;
    const float gam = j <= i ? expf(G[i] - G[j]) : 0.f;
    const float mij = j <= i ? Xs[i * PC + j] * gam : 0.f;
    Xs[i * PC + j] = mij;
    Ls[i * PC + j] = j < i ? beta[i] * gam * Ls[i * PC + j] : 0.f;
  }
  __syncthreads();
  // X = M^T dY (the state-gradient scan's output term), before Xs becomes A^-1.
  block_gemm<kFast, true, false, false, BwdTiles::kEveryWarp, sizeof(E) == 2>(
      C, V, C, Xs, PC, Ys, PV, rec + R.du, V, 1.f);  // dY raw: exact in TF32 for 16-bit E
  __syncthreads();
  // A^-1 (prep/invert.cuh: diagonal blocks by substitution, the rest by the blocked recurrence
  // on split-TF32 tensor cores, fp32 grade); it leaves the blocks above the diagonal unwritten.
  invert_unit_lower(Ls, Xs, scratch);
  for (int idx = tid; idx < C * C; idx += kBwdChunkThreads) {
    const int i = idx / C, j = idx % C;
    if ((j >> 4) > (i >> 4)) Xs[i * PC + j] = 0.f;
  }
  bwd_scale_rows(Ks, PK, C, K, sc + 7 * C);  // beta_i e^G_i k^_i
  bwd_scale_rows(Vs, PV, C, V, beta);        // beta_i v^_i
  bwd_scale_rows(Ys, PV, C, V, sc + 8 * C);  // e^G_i dO_i
  __syncthreads();
  bwd_store_rows(rec + R.ainv, C, Xs, PC, C, C);
  // Y = Q^^T diag(e^G) dY (the state-gradient scan's read-out term), into the ds slot.
  block_gemm<kFast, true, false, false>(K, V, C, Qs, PK, Ys, PV, rec + R.ds, V, 1.f);
  block_gemm<kFast, false, false, false>(C, K, C, Xs, PC, Ks, PK, rec + R.w, K, 1.f);
  block_gemm<kFast, false, false, false>(C, V, C, Xs, PC, Vs, PV, rec + R.u, V, 1.f);
}

}  // namespace kla::kernels
