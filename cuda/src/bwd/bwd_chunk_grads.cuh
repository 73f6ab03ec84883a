// Backward, pass 4: every input gradient, fully parallel over (chunk, value head, sequence), from
// the records the scans completed (bwd/bwd_state_scans.cuh): the chunk's incoming state S, its
// outgoing state's gradient dS, U and dU. The chunk form's adjoint (grad_chunk.hpp, _backward.py),
// dY = dO (the read-out scale is inside q^), in one kernel, bwd_chunk_grads_kernel:
//   over V panels   dR = A^-T dU (to the record in place of dU, for the per-token writes),
//                   dY U^T, dR U^T (C x C), dY S^T, U dS^T, dR S^T (C x K), sum(dS o S);
//   then            Pm = (dY U^T) o Gamma,  dL = -(dR U^T) o Gamma strictly lower,  Z = beta dL,
//                   the parts of dG, dbeta the [C][C] matrices give (row and column sums of
//                   Pm o Q^K^^T and dL o K^K^^T),
//                   dq^ = e^G o (dY S^T) + Pm K^,
//                   dk^ = Pm^T Q^ + Gamma_C o (U dS^T) + Z K^ + Z^T K^ - e^G beta o (dR S^T),
//                   dv^ = beta dR, dbeta += dR_i . v^_i, dg = the reverse cumulative sum of dG
//                   within the chunk, and the prologue backwards: x^ = x s(x) gives
//                   dx = s (dx^ - x^ (x^ . dx^)) (the key's with the value's share: + v^ . dv^),
//                   proofs_check grad.normalized_key.
//   bwd_group_sum_kernel   dq, dk of each key head: its value heads' in order (no atomics).
// Precision: fp32, each product in the call's arithmetic and summed in index order
// (bwd/block_gemm.cuh); every other sum in a fixed order, whatever the block's size. The steps
// after the products are bwd/bwd_grads_parts.cuh's, shared with bwd/bwd_input_grads_bf16.cuh
// (FAST, bf16, K = V = 128).
#pragma once

#include "bwd/block_gemm.cuh"
#include "bwd/bwd_grads_parts.cuh"

namespace kla::kernels {

template <class E, bool kFast, int kHD>
__global__ void __launch_bounds__(kBwdChunkThreads) bwd_chunk_grads_kernel(const BwdParams bp) {
  __builtin_assume(blockDim.x == kBwdChunkThreads);  // the launcher's (bwd_launch.cuh)
  const KernelParams& p = bp.f;
  constexpr int C = kChunk, VP = kBwdPanel, PP = bwd_pitch(VP);
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = bwd_head_dim<kHD>(p.K), V = bwd_head_dim<kHD>(p.V), PK = bwd_pitch(K),
            PC = bwd_pitch(C);
  const PrepTile pt = prep_tile(p);
  if (pt.L == 0) return;
  const int L = pt.L, hv = pt.hv;
  const BwdRecord R(K, V);
  // Products on 16 x 32 warp tiles (BwdTiles::kWidest). Under ACCURATE (three products a step)
  // the C x C products and dR, 4 to 8 such tiles, run on narrower ones (BwdTiles::kEveryWarp)
  // so that no warp waits at the next barrier for four others' work; under FAST the narrow
  // tiles' extra fragment loads cost more than the wait (docs/prefill_notes.md, backward v11).
  // Either way bitwise the same (bwd/block_gemm.cuh).
  constexpr BwdTiles kGT = BwdTiles::kWidest;
  constexpr BwdTiles kSmall = kFast ? BwdTiles::kWidest : BwdTiles::kEveryWarp;
  float* rec = bwd_record(bp, pt.n, pt.sr, pt.c, hv);
  // Shared memory (bwd_grads_smem): the [C][K] accumulators, the [C][C] matrices, a region for
  // the V panels and then the K^, Q^ tiles, the scalars.
  float* A1 = smem;         // [C][PK] dY S^T, then dq^
  float* A2 = A1 + C * PK;  // [C][PK] U dS^T, then dk^
  float* A3 = A2 + C * PK;  // [C][PK] dR S^T
  float* Ai = A3 + C * PK;  // [C][PC] A^-1, then Q^ K^^T, then K^ K^^T
  float* Pa = Ai + C * PC;  // [C][PC] dY U^T, then Pm
  float* Da = Pa + C * PC;  // [C][PC] dR U^T, then dL o Gamma, then Z
  float* Rg = Da + C * PC;
  const int64_t panels = 2 * int64_t(K) * PP + 4 * C * PP, tiles = 2 * C * PK;
  float* sc = Rg + (tiles > panels ? tiles : panels);
  float* G = sc;            // G_i
  float* beta = sc + C;     // beta_i
  float* dGs = sc + 2 * C;  // dG_i, then dg_i
  float* dbs = sc + 3 * C;  // dbeta_i
  float* zs = sc + 4 * C;   // z_i = Gamma_Ci k^_i . (dS u_i)
  float* eg = sc + 5 * C;   // e^G_i
  float* gc = sc + 6 * C;   // Gamma_Ci
  float* red = sc + 8 * C;  // [kBwdCarryParts] partial sums of dS o S
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  bwd_cp_rows(Ai, PC, rec + R.ainv, C, C, C);
  cp_commit();
  for (int idx = tid; idx < 3 * C * PK / 4; idx += kBwdChunkThreads)
    reinterpret_cast<float4*>(A1)[idx] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int idx = tid; idx < C * C; idx += kBwdChunkThreads) {
    Pa[(idx / C) * PC + idx % C] = 0.f;
    Da[(idx / C) * PC + idx % C] = 0.f;
  }
  if (tid < C) {
    G[tid] = rec[R.sc + kScG * C + tid];
    beta[tid] = rec[R.sc + kScBeta * C + tid];
    eg[tid] = expf(G[tid]);
    gc[tid] = expf(rec[R.sc + kScG * C + C - 1] - G[tid]);
  }
  float* Sp = Rg;             // [K][PP] the state's panel
  float* dSp = Sp + K * PP;   // [K][PP] its gradient's
  float* dUp = dSp + K * PP;  // [C][PP]
  float* Up = dUp + C * PP;
  float* dYp = Up + C * PP;
  float* dRp = dYp + C * PP;
  const E* dOb = static_cast<const E*>(bp.dO);
  float carry = 0.f;  // this thread's part of sum(dS o S), in a fixed order
  for (int c0 = 0; c0 < V; c0 += VP) {
    __syncthreads();  // the previous panel is consumed
    bwd_cp_rows(Sp, PP, rec + R.s + c0, V, K, VP);
    bwd_cp_rows(dSp, PP, rec + R.ds + c0, V, K, VP);
    bwd_cp_rows(dUp, PP, rec + R.du + c0, V, C, VP);
    bwd_cp_rows(Up, PP, rec + R.u + c0, V, C, VP);
    cp_commit();
    bwd_load_rows(dYp, PP, dOb + c0, bp.dos, pt.sr.b, pt.tb, hv, L, VP);
    cp_wait<0>();
    __syncthreads();
    // dR = A^-T dU
    block_gemm<kFast, true, false, false, kSmall>(C, VP, C, Ai, PC, dUp, PP, dRp, PP, 1.f);
    // sum(dS o S) in kBwdCarryParts fixed parts (red), whatever the block's size.
    for (int idx = tid; tid < kBwdCarryParts && idx < K * VP; idx += kBwdCarryParts) {
      const int r = idx / VP, cc = idx % VP;
      carry = fmaf(Sp[r * PP + cc], dSp[r * PP + cc], carry);
    }
    block_gemm<kFast, false, true, true, kSmall>(C, C, VP, dYp, PP, Up, PP, Pa, PC, 1.f);  // dY U^T
    block_gemm<kFast, false, true, true, kGT>(C, K, VP, dYp, PP, Sp, PP, A1, PK, 1.f);  // + dY S^T
    block_gemm<kFast, false, true, true, kGT>(C, K, VP, Up, PP, dSp, PP, A2, PK, 1.f);  // + U dS^T
    __syncthreads();  // dR is complete
    bwd_store_rows(rec + R.du + c0, V, dRp, PP, C, VP);
    block_gemm<kFast, false, true, true, kSmall>(C, C, VP, dRp, PP, Up, PP, Da, PC, 1.f);  // dR U^T
    block_gemm<kFast, false, true, true, kGT>(C, K, VP, dRp, PP, Sp, PP, A3, PK, 1.f);  // + dR S^T
  }
  __syncthreads();
  float* Khs = Rg;            // [C][PK]
  float* Qhs = Khs + C * PK;  // [C][PK]
  if (tid < kBwdCarryParts) red[tid] = carry;
  bwd_cp_rows(Khs, PK, rec + R.kh, K, C, K);
  bwd_cp_rows(Qhs, PK, rec + R.qh, K, C, K);
  cp_commit();
  bwd_gamma_masks(Pa, Da, PC, G);  // Pm, dL o Gamma
  cp_wait<0>();
  __syncthreads();
  block_gemm<kFast, false, true, false, kSmall>(C, C, K, Qhs, PK, Khs, PK, Ai, PC, 1.f);  // Q^K^^T
  // Row terms: e^G_i q^_i.(S dy_i), z_i, and k^_i.(S dR_i), one warp per token.
  for (int i = warp; i < C; i += kBwdChunkThreads / 32) {
    float a = 0.f, zk = 0.f, c = 0.f;
    for (int r = lane; r < K; r += 32) {
      a = fmaf(Qhs[i * PK + r], A1[i * PK + r], a);
      zk = fmaf(Khs[i * PK + r], A2[i * PK + r], zk);
      c = fmaf(Khs[i * PK + r], A3[i * PK + r], c);
    }
    a = warp_sum(a);
    zk = warp_sum(zk);
    c = warp_sum(c);
    if (lane == 0) {
      const float eG = eg[i], z = gc[i] * zk;
      zs[i] = z;
      dGs[i] = eG * a - z - eG * beta[i] * c;
      dbs[i] = -eG * c;
    }
  }
  __syncthreads();
  for (int i = warp; i < C; i += kBwdChunkThreads / 32)  // one warp a row, a float4 a lane
    for (int c = 4 * lane; c < K; c += 128) {
      const float eG = eg[i], a = gc[i], bb = eG * beta[i];
      float4 x1 = *reinterpret_cast<float4*>(A1 + i * PK + c);
      float4 x2 = *reinterpret_cast<float4*>(A2 + i * PK + c);
      const float4 x3 = *reinterpret_cast<const float4*>(A3 + i * PK + c);
      x1.x *= eG, x1.y *= eG, x1.z *= eG, x1.w *= eG;
      x2.x = a * x2.x - bb * x3.x, x2.y = a * x2.y - bb * x3.y;
      x2.z = a * x2.z - bb * x3.z, x2.w = a * x2.w - bb * x3.w;
      *reinterpret_cast<float4*>(A1 + i * PK + c) = x1;
      *reinterpret_cast<float4*>(A2 + i * PK + c) = x2;
    }
  const float rq = bwd_readout_gate_sum(Pa, Ai, PC);
  __syncthreads();
  block_gemm<kFast, false, true, false, kSmall>(C, C, K, Khs, PK, Khs, PK, Ai, PC, 1.f);  // K^K^^T
  __syncthreads();
  bwd_system_gate_sums(Da, Ai, PC, beta, rq, dGs, dbs);
  __syncthreads();                                             // the sums above read dL o Gamma
  for (int idx = tid; idx < C * C; idx += kBwdChunkThreads) {  // Z = diag(beta) (dL o Gamma)
    const int i = idx / C, j = idx % C;
    Da[i * PC + j] *= beta[i];
  }
  __syncthreads();
  bwd_carry_and_cumsum(red, kBwdCarryParts, zs, rec[R.sc + kScChunk * C], dGs);
  block_gemm<kFast, false, false, true, kGT>(C, K, C, Pa, PC, Khs, PK, A1, PK, 1.f);  // + Pm K^
  block_gemm<kFast, true, false, true, kGT>(C, K, C, Pa, PC, Qhs, PK, A2, PK, 1.f);   // + Pm^T Q^
  block_gemm<kFast, false, false, true, kGT>(C, K, C, Da, PC, Khs, PK, A2, PK, 1.f);  // + Z K^
  block_gemm<kFast, true, false, true, kGT>(C, K, C, Da, PC, Khs, PK, A2, PK, 1.f);   // + Z^T K^
  __syncthreads();

  bwd_token_grads<E>(bp, pt, rec, K, V, A1, A2, PK, Khs, PK, beta, dGs, dbs);
}

/// dq, dk of key head h (grid: chunk, key head, sequence): the sum of its value heads' rows in
/// the records, in value-head order.
template <class E>
__global__ void __launch_bounds__(kBwdThreads) bwd_group_sum_kernel(const BwdParams bp) {
  const KernelParams& p = bp.f;
  constexpr int C = kChunk;
  const int c = int(blockIdx.x), h = int(blockIdx.y), n = int(blockIdx.z), K = p.K;
  const SeqRange sr = seq_range(p, n);
  const int64_t cs = int64_t(c) * C;
  if (cs >= sr.len) return;
  const int L = int(sr.len - cs < C ? sr.len - cs : C);
  const BwdRecord R(K, p.V);
  // Four consecutive elements of a row a thread (K is a multiple of 16; the record's rows are
  // 16-byte aligned), so that each load moves 16 bytes; each element's sum in value-head order.
#pragma unroll 2
  for (int idx = 4 * int(threadIdx.x); idx < L * K; idx += 4 * kBwdThreads) {
    const int i = idx / K, r = idx % K;
    float4 sq = make_float4(0.f, 0.f, 0.f, 0.f), sk = sq;
    for (int j = 0; j < bp.group; ++j) {
      const float* rec = bwd_record(bp, n, sr, c, h * bp.group + j);
      const float4 a = *reinterpret_cast<const float4*>(rec + R.dq + idx);
      const float4 b = *reinterpret_cast<const float4*>(rec + R.dk + idx);
      sq.x += a.x, sq.y += a.y, sq.z += a.z, sq.w += a.w;
      sk.x += b.x, sk.y += b.y, sk.z += b.z, sk.w += b.w;
    }
    const int64_t t = sr.t0 + cs + i;
    E* const dq =
        static_cast<E*>(bp.dq) + sr.b * bp.dqs[0] + t * bp.dqs[1] + int64_t(h) * bp.dqs[2];
    E* const dk =
        static_cast<E*>(bp.dk) + sr.b * bp.dks[0] + t * bp.dks[1] + int64_t(h) * bp.dks[2];
    const float q4[4] = {sq.x, sq.y, sq.z, sq.w}, k4[4] = {sk.x, sk.y, sk.z, sk.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dq[r + e] = Dtype<E>::from_float(q4[e]);
      dk[r + e] = Dtype<E>::from_float(k4[e]);
    }
  }
}

}  // namespace kla::kernels
