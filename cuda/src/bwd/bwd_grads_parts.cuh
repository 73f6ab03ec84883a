// The pieces both input-gradient kernels share (bwd/bwd_chunk_grads.cuh on TF32 products,
// bwd/bwd_input_grads_bf16.cuh on bf16 ones): the masks of the [C][C] matrices, the [C][C] parts
// of dG and dbeta, the carried state's term and the reverse cumulative sum of dG, and the
// prologue backwards with the per-token writes. Each works on fp32 values in shared memory and
// sums in a fixed order (whatever the block's size), so a kernel's gradients are deterministic.
// Notation as in bwd/bwd_chunk_grads.cuh's file comment.
#pragma once

#include "bwd/bwd_tiles.cuh"
#include "prep/token_scalars.cuh"

namespace kla::kernels {

/// Pm = (dY U^T) o Gamma (j <= i, in place of dY U^T in Pa) and dL o Gamma = -(dR U^T) o Gamma
/// (j < i, in place of dR U^T in Da), Gamma_ij = e^{G_i - G_j}; [C][pitch] fp32.
__device__ __forceinline__ void bwd_gamma_masks(float* Pa, float* Da, int pitch, const float* G) {
  constexpr int C = kChunk;
  for (int idx = threadIdx.x; idx < C * C; idx += blockDim.x) {
    const int i = idx / C, j = idx % C;
    const float gam = j <= i ? expf(G[i] - G[j]) : 0.f;
    Pa[i * pitch + j] *= gam;  // 0 above the diagonal
    Da[i * pitch + j] = j < i ? -Da[i * pitch + j] * gam : 0.f;
  }
}

/// Row tid (< C) of sum_j (Pm o Q^K^^T)_ij - sum_j (Pm o Q^K^^T)_ji, dG's share of the read-out
/// (Pm in Pa, Q^K^^T in QK, both [C][pitch]); 0 for the other threads.
__device__ __forceinline__ float bwd_readout_gate_sum(const float* Pa, const float* QK, int pitch) {
  constexpr int C = kChunk;
  float rq = 0.f;
  if (threadIdx.x < C) {
    const int i = threadIdx.x;
    float rx = 0.f, cx = 0.f;
    for (int j = 0; j < C; ++j) {
      rx = fmaf(Pa[i * pitch + j], QK[i * pitch + j], rx);
      cx = fmaf(Pa[j * pitch + i], QK[j * pitch + i], cx);
    }
    rq = rx - cx;
  }
  return rq;
}

/// Threads tid < C: the chunk system's share of dG_i and dbeta_i (dL o Gamma in Da, K^K^^T in KK,
/// both [C][pitch]), with rq from bwd_readout_gate_sum.
__device__ __forceinline__ void bwd_system_gate_sums(const float* Da, const float* KK, int pitch,
                                                     const float* beta, float rq, float* dGs,
                                                     float* dbs) {
  constexpr int C = kChunk;
  if (threadIdx.x < C) {
    const int i = threadIdx.x;
    float rt = 0.f, cbt = 0.f;
    for (int j = 0; j < C; ++j) {
      rt = fmaf(Da[i * pitch + j], KK[i * pitch + j], rt);
      cbt = fmaf(beta[j] * Da[j * pitch + i], KK[j * pitch + i], cbt);
    }
    dGs[i] += rq + (beta[i] * rt - cbt);
    dbs[i] += rt;
  }
}

/// Thread 0: the carried state's term, dG_{C-1} += gamma_C sum(dS o S) + sum_i z_i (the sum of
/// dS o S given as `parts` partial sums in red, added in index order), then dg = the reverse
/// cumulative sum of dG over the chunk (in place in dGs).
__device__ __forceinline__ void bwd_carry_and_cumsum(const float* red, int parts, const float* zs,
                                                     float gamma_c, float* dGs) {
  constexpr int C = kChunk;
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int t = 0; t < parts; ++t) s += red[t];
    float zsum = 0.f;
    for (int i = 0; i < C; ++i) zsum += zs[i];
    dGs[C - 1] += gamma_c * s + zsum;
    float acc = 0.f;
    for (int i = C - 1; i >= 0; --i) {
      acc += dGs[i];
      dGs[i] = acc;
    }
  }
}

/// The sum of x over the four lanes of a lane quad (the mma.sync accumulator layout's lanes of one
/// row), in a fixed butterfly order (lane xor 1, then xor 2): every lane of the quad gets it.
__device__ __forceinline__ float quad_sum(float x) {
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// Row i's four parts in `parts` ([C][4]: in the bf16 input gradients, a row term or v^ . dR by
/// column quarter, or a gate sum's column i by row quarter; one part a warp's), summed in a fixed
/// order.
__device__ __forceinline__ float quarter_sum(const float* parts, int i) {
  const float* r = parts + i * 4;
  return ((r[0] + r[1]) + r[2]) + r[3];
}

/// The prologue backwards and the writes, one warp per token: from dq^ (dqh) and dk^ (dkh), [C]
/// rows of pitch ph in shared memory, the keys k^ (kh, pitch pk: shared memory or the record),
/// dR and the scalars in the record, the raw values (v^ = vscale v, as the prep scales them), beta,
/// dg (dGs) and dG's share of dbeta (dbs):
///   dq = qs (dq^ - q^ (q^ . dq^)) under an l2-norm read-out, else qs dq^;
///   dv = vscale beta dR, dbeta = dbs + v^ . dR;
///   dk1 = s (dk^ - k^ t1) (Kaczmarz) or dk^, t1 = k^ . dk^ + beta v^ . dR, then the qk l2-norm's
///   chain.
/// Lane l holds elements l + 32 m (m < kRowSlots), every global read of a token issued before any
/// is used. dq, dk go out directly where a key head has one value head; else, for grouped value
/// heads, into the head's own record (R.dq, R.dk), which bwd_group_sum_kernel sums afterwards.
/// (The bf16 input gradients run the same math on their warps' tiles: bwd_token_grads_tile.)
template <class E>
__device__ __forceinline__ void bwd_token_grads(const BwdParams& bp, const PrepTile& pt, float* rec,
                                                int K, int V, const float* dqh, const float* dkh,
                                                int ph, const float* kh, int pk, const float* beta,
                                                const float* dGs, const float* dbs) {
  const KernelParams& p = bp.f;
  constexpr int C = kChunk;
  constexpr int kRowSlots = kBwdMaxHeadDim / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const BwdRecord R(K, V);
  const int L = pt.L, hv = pt.hv, h = pt.h;
  const E* qb = static_cast<const E*>(p.q);
  const E* kb = static_cast<const E*>(p.k);
  const E* vb = static_cast<const E*>(p.v);
  E* dvb = static_cast<E*>(bp.dv);
  const float* rs = rec + R.sc;
  const bool direct = bp.group == 1;
  auto put = [&](E* out, int64_t at, float x) {
    if (direct)
      *out = Dtype<E>::from_float(x);
    else
      rec[at] = x;
  };
  for (int i = warp; i < L; i += nwarps) {
    const int64_t t = pt.tb + i, b = pt.sr.b;
    const E* qrow = qb + b * p.qs[0] + t * p.qs[1] + int64_t(h) * p.qs[2];
    const E* krow = kb + b * p.ks[0] + t * p.ks[1] + int64_t(h) * p.ks[2];
    const E* vrow = vb + b * p.vs[0] + t * p.vs[1] + int64_t(hv) * p.vs[2];
    const float ks = rs[kScVscale * C + i];
    float q0[kRowSlots], k0[kRowSlots], vh[kRowSlots], dr[kRowSlots];
#pragma unroll
    for (int m = 0; m < kRowSlots; ++m) {
      const int r = lane + 32 * m;
      q0[m] = p.l2norm != 0 && r < K ? tof(qrow[r]) : 0.f;
      k0[m] = p.l2norm == 2 && r < K ? tof(krow[r]) : 0.f;
      vh[m] = r < V ? tof(vrow[r]) * ks : 0.f;  // v^ = vscale v, as the prep computes it
      dr[m] = r < V ? rec[R.du + int64_t(i) * V + r] : 0.f;
    }
    const float qn = rs[kScQnorm * C + i], qs = rs[kScQscale * C + i];
    const float kn = rs[kScKnorm * C + i], bi = beta[i];
    auto khat = [&](int r) { return kh[i * pk + r]; };
    // dq = qs (dq^ - q^ (q^ . dq^)) under an l2-norm read-out (q^ = qn q), else qs dq^.
    float dot = 0.f;
#pragma unroll
    for (int m = 0; m < kRowSlots; ++m)
      if (lane + 32 * m < K) dot = fmaf(q0[m] * qn, dqh[i * ph + lane + 32 * m], dot);
    dot = warp_sum(dot);
#pragma unroll
    for (int m = 0; m < kRowSlots; ++m) {
      const int r = lane + 32 * m;
      if (r >= K) continue;
      const float x = qs * (dqh[i * ph + r] - q0[m] * qn * dot);
      put(static_cast<E*>(bp.dq) + b * bp.dqs[0] + t * bp.dqs[1] + int64_t(h) * bp.dqs[2] + r,
          R.dq + int64_t(i) * K + r, x);
    }
    // dv = vscale dv^, dv^ = beta dR; dbeta += v^ . dR; the Kaczmarz share of dk:
    // t1 = k^.dk^ + v^.dv^.
    float vdr = 0.f, t1 = 0.f;
#pragma unroll
    for (int m = 0; m < kRowSlots; ++m) {
      const int r = lane + 32 * m;
      if (r < V) {
        vdr = fmaf(vh[m], dr[m], vdr);
        dvb[b * bp.dvs[0] + t * bp.dvs[1] + int64_t(hv) * bp.dvs[2] + r] =
            Dtype<E>::from_float(ks * (bi * dr[m]));
      }
      if (r < K) t1 = fmaf(khat(r), dkh[i * ph + r], t1);
    }
    vdr = warp_sum(vdr);
    t1 = fmaf(bi, vdr, warp_sum(t1));
    // dk1 = s (dk^ - k^ t1) (Kaczmarz) or dk^; then the qk l2-norm's chain through k1 = kn k.
    float dk1[kRowSlots], t2 = 0.f;
#pragma unroll
    for (int m = 0; m < kRowSlots; ++m) {
      const int r = lane + 32 * m;
      dk1[m] = 0.f;
      if (r >= K) continue;
      dk1[m] = p.kaczmarz ? ks * (dkh[i * ph + r] - khat(r) * t1) : dkh[i * ph + r];
      t2 = fmaf(k0[m] * kn, dk1[m], t2);
    }
    t2 = warp_sum(t2);
#pragma unroll
    for (int m = 0; m < kRowSlots; ++m) {
      const int r = lane + 32 * m;
      if (r >= K) continue;
      const float x = p.l2norm == 2 ? kn * (dk1[m] - k0[m] * kn * t2) : dk1[m];
      put(static_cast<E*>(bp.dk) + b * bp.dks[0] + t * bp.dks[1] + int64_t(h) * bp.dks[2] + r,
          R.dk + int64_t(i) * K + r, x);
    }
    if (lane == 0) {
      if (bp.dg) bp.dg[b * bp.dgs[0] + t * bp.dgs[1] + hv] = dGs[i];
      if (bp.deta) bp.deta[b * bp.des[0] + t * bp.des[1] + hv] = dbs[i] + vdr;
    }
  }
}

}  // namespace kla::kernels
