// Backward, pass 1 (prep): bwd_prep_kernel, one block per (chunk, value head, sequence), fully
// parallel. The chunk's prologue in the normalised-key form (common/kernel_common.cuh token_coef,
// readout_scale): k^ = kscale k, v^ = vscale v, q^ = qscale q, beta, the inclusive cumulative log
// decay G; then the chunk system of eq. (chunk_system) (grad_chunk.hpp, _chunk_torch.py):
//   L_ij = beta_i Gamma_ij k^_i.k^_j (j < i),  A = I + L,  A^-1 (prep/invert.cuh),
//   W = A^-1 diag(beta e^G) K^,  U0 = A^-1 diag(beta) V^,  M = (Q^ K^^T) o Gamma (j <= i),
// and the state-gradient scan's terms of dO (dY = dO: the read-out scale is inside q^):
//   X = M^T dY,  Y = Q^^T diag(e^G) dY,
// all written to the chunk's record (bwd/bwd_layout.hpp) with the per-token scalars.
//
// Precision: fp32 (raw bf16 / fp16 inputs are exact in fp32; A^-1's blocks below the diagonal
// with split-TF32 products, ~2^-21 relative each, prep/invert.cuh); Gamma_ij = exp(G_i - G_j)
// (j <= i) is at most 1; the entries of L are bounded by eta (normalised keys), so the
// substitution's growth is that of the forward's chunk system.
#pragma once

#include "bwd/block_gemm.cuh"
#include "bwd/bwd_layout.hpp"
#include "bwd/bwd_params.hpp"
#include "arch/copy.cuh"
#include "arch/mma_tf32.cuh"
#include "common/kernel_common.cuh"
#include "prep/invert.cuh"
#include "prep/token_scalars.cuh"

namespace kla::kernels {

/// The record of chunk c of sequence n (token range sr) for value head hv.
__device__ __forceinline__ float* bwd_record(const BwdParams& bp, int n, const SeqRange& sr, int c,
                                             int hv) {
  return bp.ws + (chunk_slot(bp.f, n, sr, c) * bp.f.HV + hv) * bp.rec_floats;
}

/// Loads rows [0, L) of a [C][W] tile of a [B,T,heads,W] tensor (zero rows past L) as fp32 into
/// shared memory of pitch `pitch`: 16-byte vectors, four in flight per thread before any is
/// stored (the loads' latency overlaps). W a multiple of 16 / sizeof(E); base, strides 16-byte
/// aligned (validated).
template <class E>
__device__ __forceinline__ void bwd_load_rows(float* dst, int pitch, const E* base,
                                              const int64_t* st, int64_t b, int64_t tb, int head,
                                              int L, int W) {
  constexpr int VE = 16 / int(sizeof(E));
  const int wv = W / VE, total = kChunk * wv;
  for (int i0 = threadIdx.x; i0 < total; i0 += 4 * blockDim.x) {
    uint4 raw[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int idx = i0 + u * blockDim.x, i = idx / wv, c = (idx % wv) * VE;
      raw[u] = idx < total && i < L
                   ? *reinterpret_cast<const uint4*>(base + b * st[0] + (tb + i) * st[1] +
                                                     int64_t(head) * st[2] + c)
                   : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int idx = i0 + u * blockDim.x, i = idx / wv, c = (idx % wv) * VE;
      if (idx < total) {
        const E* e = reinterpret_cast<const E*>(&raw[u]);
#pragma unroll
        for (int j = 0; j < VE; ++j) dst[i * pitch + c + j] = tof(e[j]);
      }
    }
  }
}

/// Asynchronous copies (cp.async, 16 bytes each) of a [rows][W] fp32 block from global memory
/// (row pitch sp) to shared memory (pitch dp); W and both pitches multiples of 4. The caller
/// commits and waits (cp_commit, cp_wait) before a barrier.
__device__ __forceinline__ void bwd_cp_rows(float* dst, int dp, const float* src, int64_t sp,
                                            int rows, int W) {
  const int w4 = W / 4;
  for (int idx = threadIdx.x; idx < rows * w4; idx += blockDim.x) {
    const int i = idx / w4, c = (idx % w4) * 4;
    cp16(dst + i * dp + c, src + i * sp + c, true);
  }
}

/// Copies a [rows][W] fp32 matrix from shared memory (pitch sp) to global memory (pitch dp),
/// 16 bytes at a time; W and both pitches multiples of 4.
__device__ __forceinline__ void bwd_store_rows(float* dst, int64_t dp, const float* src, int sp,
                                               int rows, int W) {
  const int w4 = W / 4;
  for (int idx = threadIdx.x; idx < rows * w4; idx += blockDim.x) {
    const int i = idx / w4, c = (idx % w4) * 4;
    *reinterpret_cast<float4*>(dst + i * dp + c) =
        *reinterpret_cast<const float4*>(src + i * sp + c);
  }
}

/// x[i][.] *= f[i] for rows [0, rows) of a [rows][W] shared matrix of pitch `pitch` (W and pitch
/// multiples of 4): one warp per row, a float4 per lane.
__device__ __forceinline__ void bwd_scale_rows(float* x, int pitch, int rows, int W,
                                               const float* f) {
  const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int i = threadIdx.x >> 5; i < rows; i += nw)
    for (int c = 4 * lane; c < W; c += 128) {
      float4 v = *reinterpret_cast<float4*>(x + i * pitch + c);
      v.x *= f[i], v.y *= f[i], v.z *= f[i], v.w *= f[i];
      *reinterpret_cast<float4*>(x + i * pitch + c) = v;
    }
}

template <class E>
__global__ void __launch_bounds__(kBwdThreads) bwd_prep_kernel(const BwdParams bp) {
  const KernelParams& p = bp.f;
  constexpr int C = kChunk;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = p.K, V = p.V, PK = bwd_pitch(K), PV = bwd_pitch(V), PC = bwd_pitch(C);
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
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  bwd_load_rows(Ks, PK, static_cast<const E*>(p.k), p.ks, pt.sr.b, pt.tb, h, L, K);
  bwd_load_rows(Qs, PK, static_cast<const E*>(p.q), p.qs, pt.sr.b, pt.tb, h, L, K);
  bwd_load_rows(Vs, PV, static_cast<const E*>(p.v), p.vs, pt.sr.b, pt.tb, hv, L, V);
  bwd_load_rows(Ys, PV, static_cast<const E*>(bp.dO), bp.dos, pt.sr.b, pt.tb, hv, L, V);
  token_scalars_preload(p, pt.sr, pt.tb, L, hv, sc + 5 * C, sc + 6 * C);  // eta, g
  __syncthreads();
  // Per-token scalars, one warp per token (norms summed in a fixed order).
  for (int i = warp; i < C; i += kBwdThreads / 32) {
    float n2 = 0.f, qn2 = 0.f;
    for (int r = lane; r < K; r += 32) {
      n2 = fmaf(Ks[i * PK + r], Ks[i * PK + r], n2);
      qn2 = fmaf(Qs[i * PK + r], Qs[i * PK + r], qn2);
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
  if (warp == 0) {  // inclusive scan of the log decays (fixed shuffle order)
    float* Gv = sc + 6 * C;
    const float a0 = Gv[2 * lane], a1 = Gv[2 * lane + 1];
    float s = a0 + a1;
    for (int off = 1; off < 32; off <<= 1) {
      const float o = __shfl_up_sync(0xffffffffu, s, off);
      if (lane >= off) s += o;
    }
    const float excl = s - (a0 + a1);
    __syncwarp();
    Gv[2 * lane] = excl + a0;
    Gv[2 * lane + 1] = excl + a0 + a1;
  }
  __syncthreads();
  const float* G = sc + 6 * C;
  const float* beta = sc + 5 * C;
  bwd_scale_rows(Ks, PK, C, K, sc + 0 * C);  // k^ = kscale k
  bwd_scale_rows(Qs, PK, C, K, sc + 4 * C);  // q^ = qscale q
  bwd_scale_rows(Vs, PV, C, V, sc + 1 * C);  // v^ = vscale v
  if (tid < C) {
    const int i = tid;
    float* rs = rec + BwdRecord(K, V).sc;
    rs[kScKscale * C + i] = sc[0 * C + i];
    rs[kScVscale * C + i] = sc[1 * C + i];
    rs[kScKnorm * C + i] = sc[2 * C + i];
    rs[kScQnorm * C + i] = sc[3 * C + i];
    rs[kScQscale * C + i] = sc[4 * C + i];
    rs[kScBeta * C + i] = beta[i];
    rs[kScG * C + i] = G[i];
    rs[kScChunk * C + i] = i == 0 ? expf(G[C - 1]) : 0.f;
    sc[8 * C + i] = expf(G[i]);
    sc[7 * C + i] = beta[i] * sc[8 * C + i];
  }
  __syncthreads();
  const BwdRecord R(K, V);
  bwd_store_rows(rec + R.kh, K, Ks, PK, C, K);
  bwd_store_rows(rec + R.qh, K, Qs, PK, C, K);
  bwd_store_rows(rec + R.vh, V, Vs, PV, C, V);
  block_gemm<false, true, false>(C, C, K, Ks, PK, Ks, PK, Ls, PC, 1.f);  // K^ K^^T
  block_gemm<false, true, false>(C, C, K, Qs, PK, Ks, PK, Xs, PC, 1.f);  // Q^ K^^T
  __syncthreads();
  for (int idx = tid; idx < C * C; idx += kBwdThreads) {
    const int i = idx / C, j = idx % C;
    const float gam = j <= i ? expf(G[i] - G[j]) : 0.f;
    const float mij = j <= i ? Xs[i * PC + j] * gam : 0.f;
    Xs[i * PC + j] = mij;
    rec[R.m + idx] = mij;
    Ls[i * PC + j] = j < i ? beta[i] * gam * Ls[i * PC + j] : 0.f;
  }
  __syncthreads();
  // X = M^T dY (the state-gradient scan's output term), before Xs becomes A^-1.
  block_gemm<true, false, false>(C, V, C, Xs, PC, Ys, PV, rec + R.du, V, 1.f);
  __syncthreads();
  // A^-1 (prep/invert.cuh: diagonal blocks by substitution, the rest by the blocked recurrence
  // on split-TF32 tensor cores, fp32 grade); it leaves the blocks above the diagonal unwritten.
  invert_unit_lower(Ls, Xs, scratch);
  for (int idx = tid; idx < C * C; idx += kBwdThreads) {
    const int i = idx / C, j = idx % C;
    if ((j >> 4) > (i >> 4)) Xs[i * PC + j] = 0.f;
  }
  bwd_scale_rows(Ks, PK, C, K, sc + 7 * C);  // beta_i e^G_i k^_i
  bwd_scale_rows(Vs, PV, C, V, beta);        // beta_i v^_i
  bwd_scale_rows(Ys, PV, C, V, sc + 8 * C);  // e^G_i dO_i
  __syncthreads();
  bwd_store_rows(rec + R.ainv, C, Xs, PC, C, C);
  // Y = Q^^T diag(e^G) dY (the state-gradient scan's read-out term), into the ds slot.
  block_gemm<true, false, false>(K, V, C, Qs, PK, Ys, PV, rec + R.ds, V, 1.f);
  block_gemm<false, false, false>(C, K, C, Xs, PC, Ks, PK, rec + R.w, K, 1.f);
  block_gemm<false, false, false>(C, V, C, Xs, PC, Vs, PV, rec + R.u, V, 1.f);
}

}  // namespace kla::kernels
