// The generic chunkwise (prefill) kernel, chunk_generic_kernel: workspace-free, any head dims: SPEC
// §1 chunk form, paper Propositions 3-4, in the normalised-key form (k^ = k/r, v^ = v/r, beta =
// eta; SPEC §1 'normalised-key equivalence'), so every entry of the within-chunk matrix B(A^- o
// K^K^T) is bounded by eta in magnitude.
//
// Work split. Columns of V, S and O are independent given K, Q, beta and gamma:
//   (I + B(A^- o K^K^T)) U = B(V^ - D_gamma K^ S0)           (eq. chunk_system)
//   O     = D_gamma Q S0 + (A o Q K^T) U                       (eq. chunk_out)
//   S_out = gamma_C S0 + K^T diag(gamma_C / gamma_j) U         (eq. chunk_state)
// so a block owns one (sequence, value head, slice of VS value columns), walks the sequence's
// chunks in order and keeps its fp32 state slice in shared memory across chunks. Each block
// recomputes the C x C matrices of its chunk (cheap next to the state products). Everything is
// fp32 FFMA; the triangular system is solved in fp32 by forward substitution. Decay ratios
// gamma_i/gamma_j are exp(G_i - G_j) of cumulative log decays, never ratios of products.
// No atomics: every output element is produced by one thread in a fixed order (deterministic).
//
// Shared memory (floats; row pitches padded by one word against bank conflicts):
//   kh[C][K+1] normalised keys   qs[C][K+1] queries      st[K][VS+1] state slice
//   us[C][VS+1] rhs, then U       os[C][VS+1] D_gamma Q S0 part of the output
//   lm[C][C+1] B(A^- o K^K^T)     pm[C][C+1] A o Q K^T   G, beta, qscale, decay-to-end [C] each
// (layout/generic_layout.hpp).
#pragma once

#include "common/kernel_common.cuh"
#include "layout/generic_layout.hpp"

namespace kla::kernels {

template <class E>
__global__ void __launch_bounds__(kGenericThreads)
    chunk_generic_kernel(const KernelParams p, const GenericTiling cfg) {
  extern __shared__ float smem[];
  const int C = cfg.C, VS = cfg.VS, K = p.K, V = p.V;
  const int KP = K + 1, VP = VS + 1, CP = C + 1;
  float* kh = smem;
  float* qs = kh + C * KP;
  float* st = qs + C * KP;
  float* us = st + K * VP;
  float* os = us + C * VP;
  float* lm = os + C * VP;
  float* pm = lm + C * CP;
  float* Gv = pm + C * CP;
  float* bv = Gv + C;
  float* qsc = bv + C;
  float* wend = qsc + C;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  constexpr int nwarps = kGenericThreads / 32;
  const ScanTile blk = scan_tile(p, K, V, VS);
  if (blk.slot.skip) return;  // pool index -1: nothing read, nothing written
  const int hv = blk.hv, h = blk.h, c0 = blk.c0;
  const float* s_in = blk.slot.in;
  float* s_out = blk.slot.out;
  const SeqRange sr = blk.sr;
  const E* qb = static_cast<const E*>(p.q);
  const E* kb = static_cast<const E*>(p.k);
  const E* vb = static_cast<const E*>(p.v);
  E* ob = static_cast<E*>(p.o);

  for (int idx = tid; idx < K * VS; idx += kGenericThreads) {
    const int r = idx / VS, c = idx % VS;
    st[r * VP + c] = s_in ? s_in[int64_t(r) * V + c0 + c] : 0.f;
  }

  for (int64_t cs = 0; cs < sr.len; cs += C) {
    const int L = int(sr.len - cs < C ? sr.len - cs : C);
    const int64_t tb = sr.t0 + cs;
    // 1. Load the chunk's keys, queries (fp32) and value slice; rows >= L are zero.
    for (int idx = tid; idx < C * K; idx += kGenericThreads) {
      const int i = idx / K, r = idx % K;
      float kv = 0.f, qv = 0.f;
      if (i < L) {
        const int64_t t = tb + i;
        kv = Dtype<E>::to_float(kb[sr.b * p.ks[0] + t * p.ks[1] + int64_t(h) * p.ks[2] + r]);
        qv = Dtype<E>::to_float(qb[sr.b * p.qs[0] + t * p.qs[1] + int64_t(h) * p.qs[2] + r]);
      }
      kh[i * KP + r] = kv;
      qs[i * KP + r] = qv;
    }
    for (int idx = tid; idx < C * VS; idx += kGenericThreads) {
      const int i = idx / VS, c = idx % VS;
      float vv = 0.f;
      if (i < L)
        vv = Dtype<E>::to_float(
            vb[sr.b * p.vs[0] + (tb + i) * p.vs[1] + int64_t(hv) * p.vs[2] + c0 + c]);
      us[i * VP + c] = vv;
    }
    __syncthreads();
    // 2. Per token (a warp per row): norms in fp32 from the raw key, k^ = k/r, v^ = v/r.
    for (int i = warp; i < C; i += nwarps) {
      float n2 = 0.f, qn2 = 0.f;
      for (int r = lane; r < K; r += 32) {
        const float kv = kh[i * KP + r], qv = qs[i * KP + r];
        n2 = fmaf(kv, kv, n2);
        qn2 = fmaf(qv, qv, qn2);
      }
      n2 = warp_sum(n2);
      qn2 = warp_sum(qn2);
      float eta = 0.f, g = 0.f;
      if (i < L) {
        const int64_t t = tb + i;
        eta = token_eta(p, sr.b, t, hv);
        g = token_log_decay(p, sr.b, t, hv);
      }
      const TokenCoef tc = i < L ? token_coef(n2, eta, p) : TokenCoef{0.f, 0.f, 0.f};
      for (int r = lane; r < K; r += 32) kh[i * KP + r] *= tc.kscale;
      for (int c = lane; c < VS; c += 32) us[i * VP + c] *= tc.vscale;
      if (lane == 0) {
        Gv[i] = g;
        bv[i] = tc.beta;
        qsc[i] = readout_scale(qn2, p);
      }
    }
    __syncthreads();
    // Cumulative log decay G_i = g_1 + ... + g_i (sequential: fixed order, C adds).
    if (tid == 0) {
      float acc = 0.f;
      for (int i = 0; i < C; ++i) {
        if (i < L) acc += Gv[i];
        Gv[i] = acc;
      }
      for (int i = 0; i < C; ++i) wend[i] = i < L ? expf(acc - Gv[i]) : 0.f;
    }
    __syncthreads();
    // 3. The C x C matrices and the state products of eqs. chunk_system / chunk_out.
    for (int idx = tid; idx < C * C; idx += kGenericThreads) {
      const int i = idx / C, j = idx % C;
      float lv = 0.f, pv = 0.f;
      if (i < L && j <= i) {
        // Four independent partial sums (K is a multiple of 16) for instruction-level
        // parallelism; fixed combination order keeps the result deterministic.
        float dk[4] = {0.f, 0.f, 0.f, 0.f}, dq[4] = {0.f, 0.f, 0.f, 0.f};
        const float* ki = kh + i * KP;
        const float* kj = kh + j * KP;
        const float* qi = qs + i * KP;
        for (int r = 0; r < K; r += 4) {
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            dk[u] = fmaf(ki[r + u], kj[r + u], dk[u]);
            dq[u] = fmaf(qi[r + u], kj[r + u], dq[u]);
          }
        }
        const float dks = (dk[0] + dk[1]) + (dk[2] + dk[3]);
        const float dqs = (dq[0] + dq[1]) + (dq[2] + dq[3]);
        const float gam = expf(Gv[i] - Gv[j]);
        if (j < i) lv = bv[i] * gam * dks;
        pv = gam * dqs;
      }
      lm[i * CP + j] = lv;
      pm[i * CP + j] = pv;
    }
    for (int idx = tid; idx < C * VS; idx += kGenericThreads) {
      const int i = idx / VS, c = idx % VS;
      if (i >= L) {
        os[i * VP + c] = 0.f;
        continue;
      }
      float akp[4] = {0.f, 0.f, 0.f, 0.f}, aqp[4] = {0.f, 0.f, 0.f, 0.f};
      const float* ki = kh + i * KP;
      const float* qi = qs + i * KP;
      for (int r = 0; r < K; r += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float s = st[(r + u) * VP + c];
          akp[u] = fmaf(ki[r + u], s, akp[u]);
          aqp[u] = fmaf(qi[r + u], s, aqp[u]);
        }
      }
      const float ak = (akp[0] + akp[1]) + (akp[2] + akp[3]);
      const float aq = (aqp[0] + aqp[1]) + (aqp[2] + aqp[3]);
      const float gi = expf(Gv[i]);
      us[i * VP + c] = bv[i] * fmaf(-gi, ak, us[i * VP + c]);  // beta_i (v^_i - gamma_i S0^T k^_i)
      os[i * VP + c] = gi * aq;                                // gamma_i S0^T q_i
    }
    __syncthreads();
    // 4. Forward substitution (I + lm) U = rhs, in place in us. A column is owned by TPC
    //    consecutive lanes of one warp; row i needs rows j < i of the same column only.
    {
      const int TPC = kGenericThreads / VS;  // 8 (VS = 32) or 16 (VS = 16)
      const int c = tid / TPC, part = tid % TPC;
      for (int i = 1; i < L; ++i) {
        float acc = 0.f;
        for (int j = part; j < i; j += TPC) acc = fmaf(lm[i * CP + j], us[j * VP + c], acc);
        for (int off = TPC / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (part == 0) us[i * VP + c] -= acc;
        __syncwarp();
      }
    }
    __syncthreads();
    // 5. Outputs O = D_gamma Q S0 + (A o Q K^T) U, times each row's read-out scale.
    for (int idx = tid; idx < L * VS; idx += kGenericThreads) {
      const int i = idx / VS, c = idx % VS;
      float a4[4] = {os[i * VP + c], 0.f, 0.f, 0.f};
      int j = 0;
      for (; j + 4 <= i + 1; j += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) a4[u] = fmaf(pm[i * CP + j + u], us[(j + u) * VP + c], a4[u]);
      }
      for (; j <= i; ++j) a4[0] = fmaf(pm[i * CP + j], us[j * VP + c], a4[0]);
      const float acc = (a4[0] + a4[1]) + (a4[2] + a4[3]);
      ob[sr.b * p.os[0] + (tb + i) * p.os[1] + int64_t(hv) * p.os[2] + c0 + c] =
          Dtype<E>::from_float(acc * qsc[i]);
    }
    // 6. State S = gamma_C S0 + K^T diag(gamma_C/gamma_j) U (reads us, writes st only).
    {
      const float gend = expf(Gv[C - 1]);
      for (int idx = tid; idx < K * VS; idx += kGenericThreads) {
        const int r = idx / VS, c = idx % VS;
        float acc[4] = {gend * st[r * VP + c], 0.f, 0.f, 0.f};
        int j = 0;
        for (; j + 4 <= L; j += 4) {
#pragma unroll
          for (int u = 0; u < 4; ++u)
            acc[u] = fmaf(kh[(j + u) * KP + r] * wend[j + u], us[(j + u) * VP + c], acc[u]);
        }
        for (; j < L; ++j) acc[0] = fmaf(kh[j * KP + r] * wend[j], us[j * VP + c], acc[0]);
        st[r * VP + c] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      }
    }
    __syncthreads();
  }

  if (s_out)
    for (int idx = tid; idx < K * VS; idx += kGenericThreads) {
      const int r = idx / VS, c = idx % VS;
      s_out[int64_t(r) * V + c0 + c] = st[r * VP + c];
    }
}

}  // namespace kla::kernels
