// TF32 path, pass 2 (scan): chunk_tf32_scan_kernel, one block per (sequence, value head, slice of
// VS value columns), walking the chunks in order with the fp32 state slice in shared memory and
// reading each chunk's record from the prep (prep/tf32_prep.cuh):
//    R   = diag(beta_i / r_i) (V - D_gamma K S)        right-hand side
//    U   = T R                                         (the chunk system, solved)
//    O   = D_gamma qs Q S + P U
//    S  <- gamma_C S + K^T diag(gamma_C / gamma_j / r_j) U
// (SPEC §1 chunk form in the normalised-key form, chunks of C = 64.) kStages copy stages (1 or 2)
// of the chunk's K, Q, V tiles and record.
//
// Precision: every product runs as mma.sync m16n8k8 TF32 with fp32 accumulation; no fp32
// intermediate is rounded to TF32 (hi + lo, about 21 significant bits); raw bf16 / fp16 inputs are
// exact in TF32. Deterministic: fixed reduction orders, no atomics.
#pragma once

#include <type_traits>

#include "arch/copy.cuh"
#include "arch/mma_tf32.cuh"
#include "common/kernel_common.cuh"
#include "layout/tf32_layout.hpp"

namespace kla::kernels {

template <class E, int VS, int kStages>
__global__ void __launch_bounds__(kTf32ScanThreads, 1)
    chunk_tf32_scan_kernel(const KernelParams p, const float* __restrict__ ws) {
  constexpr bool kSplitIn = std::is_same_v<E, float>;
  constexpr int C = kChunk, NJ = VS / 8, NT = 4 * NJ;
  constexpr int SP = VS + 4;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = p.K, V = p.V, KP = raw_pitch(int(sizeof(E)), K);
  const int64_t stage_floats = tf32_scan_stage_floats(K, VS, int(sizeof(E)));
  // Stage st (chunk ch uses stage ch % kStages), each 16-byte aligned:
  //   Kr, Qr [C][KP] E; Vr [C][VS] E; Ts, Ps [C][kMatrixPitch]; sc [5][C]
  // fp32 operands used as B are stored split once (hi, lo TF32 patterns), not per fragment.
  float* Ss = smem + kStages * stage_floats;                // [K][SP] state slice (fp32)
  uint32_t* Sh = reinterpret_cast<uint32_t*>(Ss + K * SP);  // [K][SP] its split
  uint32_t* Sl = Sh + K * SP;
  uint32_t* Rh = Sl + K * SP;  // [C][SP] right-hand side, split
  uint32_t* Rl = Rh + C * SP;
  uint32_t* Uh = Rl + C * SP;  // [C][SP] U, split
  uint32_t* Ul = Uh + C * SP;
  uint32_t* Wh = Ul + C * SP;  // [C][SP] diag(kscale gamma_L/gamma_j) U, split
  uint32_t* Wl = Wh + C * SP;
  float* Os = reinterpret_cast<float*>(Wl + C * SP);  // [C][SP] gamma_i qs_i Q S (output part)
  auto stage_k = [&](int st) { return reinterpret_cast<E*>(smem + st * stage_floats); };
  auto stage_q = [&](int st) { return stage_k(st) + C * KP; };
  auto stage_v = [&](int st) { return stage_k(st) + 2 * C * KP; };
  auto stage_t = [&](int st) {
    return smem + st * stage_floats + (2LL * C * KP + C * VS) * int64_t(sizeof(E)) / 4;
  };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const ScanTile blk = scan_tile(p, K, V, VS);
  if (blk.slot.skip) return;  // pool index -1: nothing read, nothing written
  const int hv = blk.hv, n = blk.n, h = blk.h, c0 = blk.c0;
  const float* s_in = blk.slot.in;
  float* s_out = blk.slot.out;
  const SeqRange sr = blk.sr;
  const E* qb = static_cast<const E*>(p.q);
  const E* kb = static_cast<const E*>(p.k);
  const E* vb = static_cast<const E*>(p.v);
  E* ob = static_cast<E*>(p.o);
  constexpr int VE = int(16 / sizeof(E));
  const int kvec = K / VE;
  constexpr int vvec = VS / VE;

  for (int idx = tid; idx < K * (VS / 4); idx += kTf32ScanThreads) {
    const int r = idx / (VS / 4), cc = (idx % (VS / 4)) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (s_in) x = *reinterpret_cast<const float4*>(s_in + int64_t(r) * V + c0 + cc);
    *reinterpret_cast<float4*>(Ss + r * SP + cc) = x;
    store_split(Sh, Sl, r * SP + cc, x.x);
    store_split(Sh, Sl, r * SP + cc + 1, x.y);
    store_split(Sh, Sl, r * SP + cc + 2, x.z);
    store_split(Sh, Sl, r * SP + cc + 3, x.w);
  }

  const int nch = int((sr.len + C - 1) / C);
  // A chunk's tiles are 16-byte pieces: (row i, vector r) of raw K and Q, then the rows of T,
  // P and the scalars of the workspace record (q < NPW), thread tid taking every 256th piece.
  // Piece indices advance by the same stride every time: (i, r) are stepped, not divided.
  const int NPW = 2 * C * (C / 4) + 5 * C / 4;
  const int q0 = tid, qstride = kTf32ScanThreads;
  const int di = qstride / kvec, dr = qstride % kvec;
  const int i0 = q0 / kvec, r0 = q0 % kvec;
  auto wdst = [&](int st, int q) {
    float* Tr = stage_t(st);
    return q < 2 * C * (C / 4) ? Tr + (q >> 4) * kMatrixPitch + (q & 15) * 4
                               : Tr + 2 * C * kMatrixPitch + (q - 2 * C * (C / 4)) * 4;
  };
  // Issues chunk ch's copies into stage st (one cp.async group): this block's shared pieces
  // and its own value slice.
  auto issue = [&](int st, int ch) {
    const int64_t cs0 = int64_t(ch) * C;
    const int L = int(sr.len - cs0 < C ? sr.len - cs0 : C);
    const int64_t tb = sr.t0 + cs0;
    E* Kr = stage_k(st);
    E* Qr = stage_q(st);
    const E* kbase = kb + sr.b * p.ks[0] + int64_t(h) * p.ks[2];
    const E* qbase = qb + sr.b * p.qs[0] + int64_t(h) * p.qs[2];
    for (int i = i0, r = r0; i < C;) {
      const bool ok = i < L;
      const int64_t t = tb + (ok ? i : 0);
      cp16(Kr + i * KP + r * VE, kbase + t * p.ks[1] + r * VE, ok);
      cp16(Qr + i * KP + r * VE, qbase + t * p.qs[1] + r * VE, ok);
      i += di;
      r += dr;
      if (r >= kvec) r -= kvec, ++i;
    }
    const float* w = ws + (chunk_slot(p, n, sr, ch) * p.HV + hv) * p.ws_record_floats;
    for (int q = q0; q < NPW; q += qstride) cp16(wdst(st, q), w + q * 4, true);
    E* Vr = stage_v(st);
    for (int idx = tid; idx < C * vvec; idx += kTf32ScanThreads) {
      const int i = idx / vvec, cc = (idx % vvec) * VE;
      const int64_t t = tb + (i < L ? i : 0);
      cp16(Vr + i * VS + cc, vb + sr.b * p.vs[0] + t * p.vs[1] + int64_t(hv) * p.vs[2] + c0 + cc,
           i < L);
    }
    cp_commit();
  };
  if (kStages == 2 && nch > 0) {
    issue(0, 0);
    cp_wait<0>();
  }
  __syncthreads();
  for (int ch = 0; ch < nch; ++ch) {
    const int64_t cs0 = int64_t(ch) * C;
    const int L = int(sr.len - cs0 < C ? sr.len - cs0 : C);
    const int64_t tb = sr.t0 + cs0;
    const int st = kStages == 2 ? (ch & 1) : 0;
    // A. Chunk ch's tiles are in stage st: with two stages they arrived during the previous
    //    chunk (and the next chunk's copies fly during this one).
    if (kStages == 2) {
      if (ch + 1 < nch) issue(st ^ 1, ch + 1);
    } else {
      issue(0, ch);
      cp_wait<0>();
      __syncthreads();
    }
    if constexpr (kSplitIn) {
      if (KLA_MUTANT(tf32_fast_grade)) {  // K and Q as bf16 hi + lo (16 bits), in place
        E* kq = stage_k(st);              // the K and Q tiles: [2][C][KP], contiguous
        for (int idx = tid; idx < 2 * C * KP; idx += kTf32ScanThreads) {
          const float x = kq[idx], hi = __bfloat162float(__float2bfloat16_rn(x));
          kq[idx] = hi + __bfloat162float(__float2bfloat16_rn(x - hi));
        }
        __syncthreads();
      }
    }
    const E* Ks = stage_k(st);
    const E* Qs = stage_q(st);
    const E* Vs = stage_v(st);
    const float* Ts = stage_t(st);
    const float* Ps = Ts + C * kMatrixPitch;
    const float* sc = Ps + C * kMatrixPitch;

    // B. K S and Q S (S split; raw inputs exact): R = a_i (V - gamma_i K S) and
    //    O0 = gq_i Q S, one (product, tile) unit per warp at a time.
    for (int u = warp; u < 2 * NT; u += kTf32ScanThreads / 32) {
      const bool isq = u >= NT;
      const int tile = isq ? u - NT : u, mi = tile & 3, nj = tile >> 2;
      const E* A = isq ? Qs : Ks;
      float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
      float d2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
      for (int kk = 0; kk < K; kk += 8) {
        const FragB b = load_b_pre_perm(Sh, Sl, SP, kk, nj * 8, g, t4);
        const FragA a = load_a_perm<kSplitIn>(A, KP, mi * 16, kk, g, t4);
        mma3<kSplitIn, true>(d0, d1, d2, a, b);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = mi * 16 + g + (e >> 1) * 8, cc = nj * 8 + 2 * t4 + (e & 1);
        const float x = (d0[e] + d1[e]) + d2[e];
        if (isq)
          Os[i * SP + cc] = sc[2 * C + i] * x;
        else
          store_split(Rh, Rl, i * SP + cc, sc[i] * fmaf(-sc[C + i], x, tof(Vs[i * VS + cc])));
      }
    }
    __syncthreads();
    // C. U = T R (both split; T lower triangular); W = diag(wk) U.
    for (int tile = warp; tile < NT; tile += kTf32ScanThreads / 32) {
      const int mi = tile & 3, nj = tile >> 2;
      float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
      float d2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
      for (int kk = 0; kk < (mi + 1) * 16; kk += 8) {
        const FragA a = load_a_perm<true>(Ts, kMatrixPitch, mi * 16, kk, g, t4);
        const FragB b = load_b_pre_perm(Rh, Rl, SP, kk, nj * 8, g, t4);
        mma3<true, true>(d0, d1, d2, a, b);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = mi * 16 + g + (e >> 1) * 8, cc = nj * 8 + 2 * t4 + (e & 1);
        const float uu = (d0[e] + d1[e]) + d2[e];
        store_split(Uh, Ul, i * SP + cc, uu);
        store_split(Wh, Wl, i * SP + cc, sc[3 * C + i] * uu);
      }
    }
    __syncthreads();
    // D. O = O0 + P U, written out (units < NT); S = gamma_L S + K^T W (the other units).
    {
      const float gend = sc[4 * C];
      const int mk = K / 16;
      for (int u = warp; u < NT + mk * NJ; u += kTf32ScanThreads / 32) {
        float d0[4], d1[4] = {0.f, 0.f, 0.f, 0.f}, d2[4] = {0.f, 0.f, 0.f, 0.f};
        if (u < NT) {
          // Reversed order: the warps with the longest step C (row block 3) get the shortest
          // read-out tiles here.
          const int tile = NT - 1 - u, mi = tile & 3, nj = tile >> 2;
#pragma unroll
          for (int e = 0; e < 4; ++e)
            d0[e] = Os[(mi * 16 + g + (e >> 1) * 8) * SP + nj * 8 + 2 * t4 + (e & 1)];
#pragma unroll 2
          for (int kk = 0; kk < (mi + 1) * 16; kk += 8) {
            const FragA a = load_a_perm<true>(Ps, kMatrixPitch, mi * 16, kk, g, t4);
            const FragB b = load_b_pre_perm(Uh, Ul, SP, kk, nj * 8, g, t4);
            mma3<true, true>(d0, d1, d2, a, b);
          }
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int i = mi * 16 + g + hr * 8, cc = nj * 8 + 2 * t4;
            if (i < L) {
              E* dst = ob + sr.b * p.os[0] + (tb + i) * p.os[1] + int64_t(hv) * p.os[2] + c0 + cc;
              dst[0] = Dtype<E>::from_float((d0[2 * hr] + d1[2 * hr]) + d2[2 * hr]);
              dst[1] = Dtype<E>::from_float((d0[2 * hr + 1] + d1[2 * hr + 1]) + d2[2 * hr + 1]);
            }
          }
        } else {
          const int tile = u - NT, mi = tile % mk, nj = tile / mk;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = mi * 16 + g + (e >> 1) * 8, cc = nj * 8 + 2 * t4 + (e & 1);
            d0[e] = gend * Ss[r * SP + cc];
          }
#pragma unroll
          for (int kk = 0; kk < C; kk += 8) {
            const FragA a = load_a_t_perm<kSplitIn>(Ks, KP, mi * 16, kk, g, t4);
            const FragB b = load_b_pre_perm(Wh, Wl, SP, kk, nj * 8, g, t4);
            mma3<kSplitIn, true>(d0, d1, d2, a, b);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = mi * 16 + g + (e >> 1) * 8, cc = nj * 8 + 2 * t4 + (e & 1);
            const float x = (d0[e] + d1[e]) + d2[e];
            Ss[r * SP + cc] = x;
            if (KLA_MUTANT(tf32_fast_grade)) {  // the operand as bf16 hi + lo (16 bits)
              const float h = __bfloat162float(__float2bfloat16_rn(x));
              store_split(Sh, Sl, r * SP + cc, h + __bfloat162float(__float2bfloat16_rn(x - h)));
            } else {
              store_split(Sh, Sl, r * SP + cc, x);
            }
          }
        }
      }
    }
    if (kStages == 2 && ch + 1 < nch) cp_wait<0>();
    __syncthreads();
  }

  if (s_out)
    for (int idx = tid; idx < K * (VS / 4); idx += kTf32ScanThreads) {
      const int r = idx / (VS / 4), cc = (idx % (VS / 4)) * 4;
      *reinterpret_cast<float4*>(s_out + int64_t(r) * V + c0 + cc) =
          *reinterpret_cast<const float4*>(Ss + r * SP + cc);
    }
}

}  // namespace kla::kernels
