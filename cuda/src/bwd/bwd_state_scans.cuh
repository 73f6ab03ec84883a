// Backward, passes 2 and 3: the two sequential scans over the chunks, one block per (sequence,
// value head, slice of VS = bwd_scan_slice(V) value columns); a state's columns evolve
// independently, so slices never talk. Both keep a [K][VS] fp32 slice in shared memory and read
// each chunk's record (bwd/bwd_prep.cuh), the next chunk's tiles copied in (cp.async, two stages)
// while this one's are used:
//   bwd_state_forward_kernel   S_c (the state entering chunk c) is written to the record, then
//                              U = U0 - W S  (kept in the record in place of U0)
//                              S <- gamma_C S + K^^T diag(Gamma_C.) U
//   bwd_state_backward_kernel  from the last chunk to the first, dS = d loss / d(chunk's outgoing
//                              state) is written to the record (in place of Y), then
//                              dU = diag(Gamma_C.) K^ dS + X  (kept in the record in place of X)
//                              dS <- gamma_C dS + Y - W^T dU
//                              and finally d(initial state) = dS,
// with X = M^T dY and Y = Q^^T diag(e^G) dY from the prep. The second is the first's adjoint
// (eq. (chunk_state) transposed; _backward.py's loop over the chunks), Gamma_Cj = e^{G_{C-1} -
// G_j}. Precision: the products of bwd/block_gemm.cuh (fixed summation order; fp32 grade under
// ACCURATE, one TF32 part an operand under FAST). S, U, dS and dU go to the record in fp32; the
// configuration of the bf16 input-gradient kernel (kBwdBf16Record) runs its own scans
// (bwd/bwd_state_forward_bf16.cuh, bwd/bwd_state_backward_bf16.cuh); the scans keep their state in
// fp32.
#pragma once

#include "bwd/block_gemm.cuh"
#include "bwd/bwd_tiles.cuh"

namespace kla::kernels {

template <class E, int VS, bool kFast, int kHD>
__global__ void __launch_bounds__(kBwdThreads) bwd_state_forward_kernel(const BwdParams bp) {
  __builtin_assume(blockDim.x == kBwdThreads);  // the launcher's (bwd_launch.cuh)
  static_assert(!kBwdBf16Record<E, kFast, kHD>, "that configuration runs its own state scan");
  const KernelParams& p = bp.f;
  constexpr int C = kChunk, PS = bwd_pitch(VS);
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = bwd_head_dim<kHD>(p.K), V = bwd_head_dim<kHD>(p.V), PK = bwd_pitch(K);
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int n = blk.n, hv = blk.hv, c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* const rec0 = bwd_record(bp, n, sr, 0, hv);  // chunk ch's record: rec0 + ch * rstep
  const int64_t rstep = bwd_record_step(bp);
  // Stage st: W [C][PK], k^ [C][PK], the U0 slice [C][PS], G [C]; then the state slice.
  const int stage = int(bwd_scan_stage_floats(K, VS, false));
  float* Ss = smem + 2 * stage;  // [K][PS]
  const int tid = threadIdx.x;
  for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
    const int r = idx / VS, cc = idx % VS;
    Ss[r * PS + cc] = blk.slot.in ? blk.slot.in[int64_t(r) * V + c0 + cc] : 0.f;
  }
  const int nch = int((sr.len + C - 1) / C);
  auto issue = [&](int st, int ch) {
    float* base = smem + st * stage;
    const float* rec = rec0 + ch * rstep;
    bwd_cp_rows(base, PK, rec + R.w, K, C, K);
    bwd_cp_rows(base + C * PK, PK, rec + R.kh, K, C, K);
    bwd_cp_rows(base + 2 * C * PK, PS, rec + R.u + c0, V, C, VS);
    bwd_cp_rows(base + 2 * C * PK + C * PS, C, rec + R.sc + kScG * C, C, 1, C);
    cp_commit();
  };
  if (nch > 0) issue(0, 0);
  for (int ch = 0; ch < nch; ++ch) {
    const int st = ch & 1;
    float* rec = rec0 + ch * rstep;
    float* Ws = smem + st * stage;
    float* Khs = Ws + C * PK;
    float* Us = Khs + C * PK;  // U0, then U, then diag(Gamma_C.) U
    const float* Gs = Us + C * PS;
    __syncthreads();  // the previous chunk is done with stage st ^ 1 and with Ss
    if (ch + 1 < nch) {
      issue(st ^ 1, ch + 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    bwd_store_rows(rec + R.s + c0, V, Ss, PS, K, VS);
    block_gemm<kFast, false, false, true>(C, VS, K, Ws, PK, Ss, PS, Us, PS, -1.f);  // U = U0 - W S
    __syncthreads();
    const float gC = expf(Gs[C - 1]);
    for (int idx = tid; idx < C * (VS / 4); idx += kBwdThreads) {  // U out, then Gamma_Ci u_i
      const int i = idx / (VS / 4), cc = (idx % (VS / 4)) * 4;
      const float gci = expf(Gs[C - 1] - Gs[i]);
      float4 u = *reinterpret_cast<float4*>(Us + i * PS + cc);
      *reinterpret_cast<float4*>(rec + R.u + int64_t(i) * V + c0 + cc) = u;
      u.x *= gci, u.y *= gci, u.z *= gci, u.w *= gci;
      *reinterpret_cast<float4*>(Us + i * PS + cc) = u;
    }
    for (int idx = tid; idx < K * (VS / 4); idx += kBwdThreads) {  // gamma_C S
      float4* s4 = reinterpret_cast<float4*>(Ss + (idx / (VS / 4)) * PS + (idx % (VS / 4)) * 4);
      float4 s = *s4;
      s.x *= gC, s.y *= gC, s.z *= gC, s.w *= gC;
      *s4 = s;
    }
    __syncthreads();
    block_gemm<kFast, true, false, true>(K, VS, C, Khs, PK, Us, PS, Ss, PS, 1.f);  // + K^^T diag U
  }
}

template <class E, int VS, bool kFast, int kHD>
__global__ void __launch_bounds__(kBwdThreads) bwd_state_backward_kernel(const BwdParams bp) {
  __builtin_assume(blockDim.x == kBwdThreads);  // the launcher's (bwd_launch.cuh)
  static_assert(!kBwdBf16Record<E, kFast, kHD>, "that configuration runs its own state scan");
  const KernelParams& p = bp.f;
  constexpr int C = kChunk, PS = bwd_pitch(VS);
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = bwd_head_dim<kHD>(p.K), V = bwd_head_dim<kHD>(p.V), PK = bwd_pitch(K);
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int n = blk.n, hv = blk.hv, c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* const rec0 = bwd_record(bp, n, sr, 0, hv);  // chunk ch's record: rec0 + ch * rstep
  const int64_t rstep = bwd_record_step(bp);
  // Stage st: W [C][PK], k^ [C][PK], the X slice [C][PS], the Y slice [K][PS], G [C]; then dS
  // [K][PS] and dU [C][PS].
  const int stage = int(bwd_scan_stage_floats(K, VS, true));
  float* dS = smem + 2 * stage;
  float* dU = dS + K * PS;
  const int tid = threadIdx.x;
  const int64_t KV = int64_t(K) * V, head = int64_t(n) * p.HV + hv;
  for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
    const int r = idx / VS, cc = idx % VS;
    dS[r * PS + cc] = bp.dht ? bp.dht[head * KV + int64_t(r) * V + c0 + cc] : 0.f;
  }
  const int nch = int((sr.len + C - 1) / C);
  auto issue = [&](int st, int ch) {
    float* base = smem + st * stage;
    const float* rec = rec0 + ch * rstep;
    bwd_cp_rows(base, PK, rec + R.w, K, C, K);
    bwd_cp_rows(base + C * PK, PK, rec + R.kh, K, C, K);
    bwd_cp_rows(base + 2 * C * PK, PS, rec + R.du + c0, V, C, VS);
    bwd_cp_rows(base + 2 * C * PK + C * PS, PS, rec + R.ds + c0, V, K, VS);
    bwd_cp_rows(base + 2 * C * PK + (C + K) * PS, C, rec + R.sc + kScG * C, C, 1, C);
    cp_commit();
  };
  if (nch > 0) issue(0, nch - 1);
  for (int step = 0; step < nch; ++step) {
    const int ch = nch - 1 - step, st = step & 1;
    float* rec = rec0 + ch * rstep;
    float* Ws = smem + st * stage;
    float* Khs = Ws + C * PK;
    float* Xs = Khs + C * PK;
    float* Ys = Xs + C * PS;
    const float* Gs = Ys + K * PS;
    __syncthreads();  // the previous chunk is done with stage st ^ 1, dS and dU
    if (ch > 0) {
      issue(st ^ 1, ch - 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    bwd_store_rows(rec + R.ds + c0, V, dS, PS, K, VS);
    block_gemm<kFast, false, false, false>(C, VS, K, Khs, PK, dS, PS, dU, PS, 1.f);  // K^ dS
    __syncthreads();
    const float gC = expf(Gs[C - 1]);
    for (int idx = tid; idx < C * (VS / 4); idx += kBwdThreads) {  // dU = Gamma_C. K^ dS + X
      const int i = idx / (VS / 4), cc = (idx % (VS / 4)) * 4;
      const float gci = expf(Gs[C - 1] - Gs[i]);  // one factor for the row's four columns
      const float4 du = *reinterpret_cast<const float4*>(dU + i * PS + cc);
      const float4 xs = *reinterpret_cast<const float4*>(Xs + i * PS + cc);
      const float4 x = make_float4(fmaf(gci, du.x, xs.x), fmaf(gci, du.y, xs.y),
                                   fmaf(gci, du.z, xs.z), fmaf(gci, du.w, xs.w));
      *reinterpret_cast<float4*>(dU + i * PS + cc) = x;
      *reinterpret_cast<float4*>(rec + R.du + int64_t(i) * V + c0 + cc) = x;
    }
    const float gCd = KLA_MUTANT(bwd_carry_no_gamma) ? 1.f : gC;
    for (int idx = tid; idx < K * (VS / 4); idx += kBwdThreads) {  // gamma_C dS + Y
      const int at = (idx / (VS / 4)) * PS + (idx % (VS / 4)) * 4;
      float4 d = *reinterpret_cast<const float4*>(dS + at);
      const float4 y = *reinterpret_cast<const float4*>(Ys + at);
      d.x = fmaf(gCd, d.x, y.x), d.y = fmaf(gCd, d.y, y.y);
      d.z = fmaf(gCd, d.z, y.z), d.w = fmaf(gCd, d.w, y.w);
      *reinterpret_cast<float4*>(dS + at) = d;
    }
    __syncthreads();
    block_gemm<kFast, true, false, true>(K, VS, C, Ws, PK, dU, PS, dS, PS, -1.f);  // - W^T dU
  }
  __syncthreads();
  if (bp.dh0)
    for (int idx = tid; idx < K * VS; idx += kBwdThreads) {
      const int r = idx / VS, cc = idx % VS;
      bp.dh0[head * KV + int64_t(r) * V + c0 + cc] = dS[r * PS + cc];
    }
}

}  // namespace kla::kernels
