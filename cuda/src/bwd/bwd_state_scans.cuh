// Backward, passes 2 and 3: the two sequential scans over the chunks, one block per (sequence,
// value head, slice of kBwdScanSlice value columns); a state's columns evolve independently, so
// slices never talk. Both keep a [K][VS] fp32 slice in shared memory and read each chunk's record
// (bwd/bwd_prep.cuh):
//   bwd_state_forward_kernel   S_c (the state entering chunk c) is written to the record, then
//                              U = U0 - W S  (kept in the record in place of U0)
//                              S <- gamma_C S + K_G^T U,  K_G = diag(Gamma_Cj) K^
//   bwd_state_backward_kernel  from the last chunk to the first, dS = d loss / d(chunk's outgoing
//                              state) is written to the record, then
//                              dU = M^T dY + K_G dS  (kept in the record)
//                              dS <- gamma_C dS + (e^G o Q^)^T dY - W^T dU
//                              and finally d(initial state) = dS.
// The second is the first's adjoint (eq. (chunk_state) transposed; _backward.py's loop over the
// chunks). Precision: fp32, each product summed in index order (bwd/block_gemm.cuh).
#pragma once

#include "bwd/bwd_prep.cuh"

namespace kla::kernels {

template <class E>
__global__ void __launch_bounds__(kBwdThreads) bwd_state_forward_kernel(const BwdParams bp) {
  const KernelParams& p = bp.f;
  constexpr int C = kChunk, VS = kBwdScanSlice, PS = bwd_pitch(VS);
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = p.K, V = p.V, PK = bwd_pitch(K), PC = bwd_pitch(C);
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int n = blk.n, hv = blk.hv, c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* Ws = smem + C * PC;  // (the M slot of the shared layout is unused here)
  float* KG = Ws + C * PK;
  float* Ss = KG + 2 * C * PK;  // [K][PS]
  float* Us = Ss + K * PS;      // [C][PS]
  const int tid = threadIdx.x;
  for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
    const int r = idx / VS, cc = idx % VS;
    Ss[r * PS + cc] = blk.slot.in ? blk.slot.in[int64_t(r) * V + c0 + cc] : 0.f;
  }
  const int nch = int((sr.len + C - 1) / C);
  for (int ch = 0; ch < nch; ++ch) {
    float* rec = bwd_record(bp, n, sr, ch, hv);
    const float* G = rec + R.sc + kScG * C;
    __syncthreads();  // Ss complete; the previous chunk's tiles free
    for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
      const int r = idx / VS, cc = idx % VS;
      rec[R.s + int64_t(r) * V + c0 + cc] = Ss[r * PS + cc];
    }
    for (int idx = tid; idx < C * K; idx += kBwdThreads) {
      const int i = idx / K, r = idx % K;
      Ws[i * PK + r] = rec[R.w + idx];
      KG[i * PK + r] = rec[R.kh + idx] * expf(G[C - 1] - G[i]);
    }
    for (int idx = tid; idx < C * VS; idx += kBwdThreads) {
      const int i = idx / VS, cc = idx % VS;
      Us[i * PS + cc] = rec[R.u + int64_t(i) * V + c0 + cc];
    }
    __syncthreads();
    block_gemm<false, false, true>(C, VS, K, Ws, PK, Ss, PS, Us, PS, -1.f);  // U = U0 - W S
    __syncthreads();
    const float gC = rec[R.sc + kScChunk * C];
    for (int idx = tid; idx < C * VS; idx += kBwdThreads) {
      const int i = idx / VS, cc = idx % VS;
      rec[R.u + int64_t(i) * V + c0 + cc] = Us[i * PS + cc];
    }
    for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
      const int r = idx / VS, cc = idx % VS;
      Ss[r * PS + cc] *= gC;
    }
    __syncthreads();
    block_gemm<true, false, true>(K, VS, C, KG, PK, Us, PS, Ss, PS, 1.f);  // S += K_G^T U
  }
}

template <class E>
__global__ void __launch_bounds__(kBwdThreads) bwd_state_backward_kernel(const BwdParams bp) {
  const KernelParams& p = bp.f;
  constexpr int C = kChunk, VS = kBwdScanSlice, PS = bwd_pitch(VS);
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = p.K, V = p.V, PK = bwd_pitch(K), PC = bwd_pitch(C);
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int n = blk.n, hv = blk.hv, c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* Ms = smem;         // [C][PC]
  float* Ws = Ms + C * PC;  // [C][PK]
  float* KG = Ws + C * PK;  // [C][PK]
  float* QE = KG + C * PK;  // [C][PK]
  float* dS = QE + C * PK;  // [K][PS]
  float* dY = dS + K * PS;  // [C][PS]
  float* dU = dY + C * PS;  // [C][PS]
  const int tid = threadIdx.x;
  const int64_t KV = int64_t(K) * V, head = int64_t(n) * p.HV + hv;
  for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
    const int r = idx / VS, cc = idx % VS;
    dS[r * PS + cc] = bp.dht ? bp.dht[head * KV + int64_t(r) * V + c0 + cc] : 0.f;
  }
  const E* dOb = static_cast<const E*>(bp.dO);
  const int nch = int((sr.len + C - 1) / C);
  for (int ch = nch - 1; ch >= 0; --ch) {
    float* rec = bwd_record(bp, n, sr, ch, hv);
    const float* G = rec + R.sc + kScG * C;
    const int64_t tb = sr.t0 + int64_t(ch) * C;
    const int L = int(sr.len - int64_t(ch) * C < C ? sr.len - int64_t(ch) * C : C);
    __syncthreads();
    for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
      const int r = idx / VS, cc = idx % VS;
      rec[R.ds + int64_t(r) * V + c0 + cc] = dS[r * PS + cc];
    }
    for (int idx = tid; idx < C * C; idx += kBwdThreads)
      Ms[(idx / C) * PC + idx % C] = rec[R.m + idx];
    for (int idx = tid; idx < C * K; idx += kBwdThreads) {
      const int i = idx / K, r = idx % K;
      Ws[i * PK + r] = rec[R.w + idx];
      KG[i * PK + r] = rec[R.kh + idx] * expf(G[C - 1] - G[i]);
      QE[i * PK + r] = rec[R.qh + idx] * expf(G[i]);
    }
    for (int idx = tid; idx < C * VS; idx += kBwdThreads) {
      const int i = idx / VS, cc = idx % VS;
      dY[i * PS + cc] = i < L ? tof(dOb[sr.b * bp.dos[0] + (tb + i) * bp.dos[1] +
                                        int64_t(hv) * bp.dos[2] + c0 + cc])
                              : 0.f;
    }
    __syncthreads();
    block_gemm<true, false, false>(C, VS, C, Ms, PC, dY, PS, dU, PS, 1.f);  // M^T dY
    block_gemm<false, false, true>(C, VS, K, KG, PK, dS, PS, dU, PS, 1.f);  // + K_G dS
    __syncthreads();
    const float gC = rec[R.sc + kScChunk * C];
    for (int idx = tid; idx < C * VS; idx += kBwdThreads) {
      const int i = idx / VS, cc = idx % VS;
      rec[R.du + int64_t(i) * V + c0 + cc] = dU[i * PS + cc];
    }
    for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
      const int r = idx / VS, cc = idx % VS;
      dS[r * PS + cc] *= gC;
    }
    __syncthreads();
    block_gemm<true, false, true>(K, VS, C, QE, PK, dY, PS, dS, PS, 1.f);   // + (e^G Q^)^T dY
    block_gemm<true, false, true>(K, VS, C, Ws, PK, dU, PS, dS, PS, -1.f);  // - W^T dU
  }
  __syncthreads();
  if (bp.dh0)
    for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
      const int r = idx / VS, cc = idx % VS;
      bp.dh0[head * KV + int64_t(r) * V + c0 + cc] = dS[r * PS + cc];
    }
}

}  // namespace kla::kernels
