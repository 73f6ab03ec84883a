// Tokenwise (decode) kernel: the recurrence of SPEC §1 token by token, for T >= 1 tokens per
// sequence, with the fp32 state kept in registers for all tokens of the call.
//
// Work split. Columns of S are independent given k (e = v - S~^T k is one dot over K per
// column and the update is per column), so one warp owns a slice of 16 columns of one
// (sequence, value head) and all K rows of it. Lane l holds columns 4*(l%4)..+3 of the slice
// and rows l/4 + 8j (j < K/8): a row segment of the slice is 4 lanes x 16 bytes, read and
// written as float4. Reductions over K are a per-lane partial sum over its rows followed by a
// fixed butterfly over the 8 lanes sharing a column group (deterministic). A block is 4
// independent warps; no block-level synchronisation.
//
// Numerics: the normalised-key form (SPEC §1): k^ = k/r, v^ = v/r, r = sqrt(|k|^2+eps) in fp32
// from the raw key, beta = eta; bounded intermediate values for tiny keys with eps = 0.
#pragma once

#include "common/kernel_common.cuh"
#include "layout/tokenwise_layout.hpp"

namespace kla::kernels {

// Residency: for K <= 128 ask for 4 blocks (16 warps) per SM, enough loads in flight to
// stream the state at close to the copy rate; K = 256 needs its 128 state registers per lane.
template <class E, int KMAX>
__global__ void __launch_bounds__(kTokWarps * 32, KMAX <= 128 ? 4 : 1)
    tokenwise_kernel(const KernelParams p) {
  constexpr int RPT = KMAX / 8;  // state rows per lane
  __shared__ float kh_s[kTokWarps][KMAX];
  __shared__ float q_s[kTokWarps][KMAX];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nslices = p.V / kTokSlice;
  const int64_t task = int64_t(blockIdx.x) * kTokWarps + warp;
  if (task >= int64_t(p.N) * p.HV * nslices) return;
  const int slice = int(task % nslices);
  const int hv = int((task / nslices) % p.HV);
  const int n = int(task / (int64_t(nslices) * p.HV));
  const int h = key_head(p, hv);
  const int K = p.K, V = p.V;
  const int64_t KV = int64_t(K) * V;

  const StateSlot slot = state_slot(p, n, hv, KV);
  if (slot.skip) return;  // pool index -1: nothing read, nothing written
  const float* s_in = slot.in;
  float* s_out = slot.out;
  const SeqRange sr = seq_range(p, n);

  const int cg = lane & 3, rg = lane >> 2;
  const int col = slice * kTokSlice + cg * 4;
  float S[RPT][4];
#pragma unroll
  for (int j = 0; j < RPT; ++j) {
    const int r = rg + 8 * j;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (s_in && r < K) x = *reinterpret_cast<const float4*>(s_in + int64_t(r) * V + col);
    S[j][0] = x.x;
    S[j][1] = x.y;
    S[j][2] = x.z;
    S[j][3] = x.w;
  }

  const E* qb = static_cast<const E*>(p.q);
  const E* kb = static_cast<const E*>(p.k);
  const E* vb = static_cast<const E*>(p.v);
  E* ob = static_cast<E*>(p.o);
  for (int64_t t = sr.t0; t < sr.t0 + sr.len; ++t) {
    const E* kr = kb + sr.b * p.ks[0] + t * p.ks[1] + int64_t(h) * p.ks[2];
    const E* qr = qb + sr.b * p.qs[0] + t * p.qs[1] + int64_t(h) * p.qs[2];
    float kv[KMAX / 32], n2 = 0.f, qn2 = 0.f;
#pragma unroll
    for (int j = 0; j < KMAX / 32; ++j) {
      const int i = lane + 32 * j;
      kv[j] = 0.f;
      if (i < K) {
        kv[j] = Dtype<E>::to_float(kr[i]);
        const float qv = Dtype<E>::to_float(qr[i]);
        q_s[warp][i] = qv;
        n2 = fmaf(kv[j], kv[j], n2);
        qn2 = fmaf(qv, qv, qn2);
      }
    }
    n2 = warp_sum(n2);
    qn2 = warp_sum(qn2);
    const float eta = token_eta(p, sr.b, t, hv);
    const TokenCoef tc = token_coef(n2, eta, p);
#pragma unroll
    for (int j = 0; j < KMAX / 32; ++j) {
      const int i = lane + 32 * j;
      if (i < K) kh_s[warp][i] = kv[j] * tc.kscale;
    }
    const float alpha = p.g ? expf(token_log_decay(p, sr.b, t, hv)) : 1.0f;
    const E* vr = vb + sr.b * p.vs[0] + t * p.vs[1] + int64_t(hv) * p.vs[2] + col;
    float vv[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) vv[c] = Dtype<E>::to_float(vr[c]);
    __syncwarp();

    // Residual of the decayed state: e^ = v^ - alpha S^T k^ (eq. kla), partial over own rows.
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
      const int r = rg + 8 * j;
      const float kh = r < K ? kh_s[warp][r] : 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] = fmaf(S[j][c], kh, acc[c]);
    }
    float w[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float a = acc[c];
      a += __shfl_xor_sync(0xffffffffu, a, 4);
      a += __shfl_xor_sync(0xffffffffu, a, 8);
      a += __shfl_xor_sync(0xffffffffu, a, 16);
      w[c] = tc.beta * fmaf(-alpha, a, vv[c] * tc.vscale);  // beta * e^
    }
    // S = alpha S + k^ (beta e^)^T, then o = S^T q * scale.
    float oacc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
      const int r = rg + 8 * j;
      const float kh = r < K ? kh_s[warp][r] : 0.f;
      const float qv = r < K ? q_s[warp][r] : 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[j][c] = fmaf(kh, w[c], alpha * S[j][c]);
        oacc[c] = fmaf(S[j][c], qv, oacc[c]);
      }
    }
    const float osc = readout_scale(qn2, p);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float a = oacc[c];
      a += __shfl_xor_sync(0xffffffffu, a, 4);
      a += __shfl_xor_sync(0xffffffffu, a, 8);
      a += __shfl_xor_sync(0xffffffffu, a, 16);
      oacc[c] = a * osc;
    }
    if (rg == 0) {
      E* orow = ob + sr.b * p.os[0] + t * p.os[1] + int64_t(hv) * p.os[2] + col;
#pragma unroll
      for (int c = 0; c < 4; ++c) orow[c] = Dtype<E>::from_float(oacc[c]);
    }
    __syncwarp();  // k^/q of this token are read by every lane before the next overwrites them
  }

  if (s_out) {
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
      const int r = rg + 8 * j;
      if (r < K)
        *reinterpret_cast<float4*>(s_out + int64_t(r) * V + col) =
            make_float4(S[j][0], S[j][1], S[j][2], S[j][3]);
    }
  }
}

}  // namespace kla::kernels
