// Fast chunkwise (prefill) path: two kernels and a caller-provided workspace (workspace.hpp).
//
// Same mathematics as chunk.cuh (SPEC §1 chunk form, normalised-key form k^ = k r^-1,
// v^ = v r^-1, beta = eta), chunks of C = 64 tokens, split in two passes:
//
//  1. chunk_prep_kernel, fully parallel over (sequence, chunk, value head): per-token norms,
//     beta, cumulative log decays G; K K^T and Q K^T on the tensor cores; the unit
//     lower-triangular inverse T = (I + B(A^- o K^K^T))^-1 in fp32 by 16 x 16 blocks; the read-out
//     matrix P_ij = qs_i exp(G_i - G_j) (q_i . k^_j) (j <= i) and per-token scalars. All fp32,
//     written to the workspace.
//  2. chunk_scan_kernel, one block per (sequence, value head, slice of VS value columns),
//     walking the chunks in order with the fp32 state slice in shared memory:
//        R   = diag(beta_i / r_i) (V - D_gamma K S)        right-hand side
//        U   = T R                                         (the chunk system, solved)
//        O   = D_gamma qs Q S + P U
//        S  <- gamma_C S + K^T diag(gamma_C / gamma_j / r_j) U
//
// Precision. Every product runs on the tensor cores as mma.sync m16n8k8 TF32 with fp32
// accumulation, but no fp32 intermediate is rounded to TF32: an fp32 operand is split into
// hi = tf32(x) and lo = tf32(x - hi) (about 21 significant bits together) and multiplied as
// hi*B + lo*B (+ A*lo); raw bf16 / fp16 inputs are exact in TF32 and enter unsplit (fp32 inputs
// are split like intermediates). Decay ratios are exp(G_i - G_j); entries of the within-chunk
// matrix are bounded by eta (normalised keys); key norms are fp32. Deterministic: fixed
// reduction orders, no atomics.
#pragma once

#include <type_traits>

#include "kernel_common.cuh"
#include "workspace.hpp"

namespace kla::kernels {

constexpr int kFC = 64;  // chunk length of the fast path
constexpr int kWsT = 0, kWsP = kFC * kFC, kWsSc = 2 * kFC * kFC;
constexpr int kWsFloats = int(kla::detail::kWsFloatsPerChunk);
static_assert(kWsFloats == 2 * kFC * kFC + 5 * kFC, "workspace layout");
constexpr int kPrepThreads = 256, kScanThreads = 256;
constexpr int kMP = kFC + 4;  // pitch of 64 x 64 matrices used as A operands (== 4 mod 32)
constexpr int kInvScratch = 6 * 16 * 12;  // floats of scratch that invert_unit_lower needs

// ---- TF32 tensor-core helpers ------------------------------------------------------------

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;  // round to nearest (ties away)
}

struct FragA {
  uint32_t h[4], l[4];
};
struct FragB {
  uint32_t h[2], l[2];
};

__device__ __forceinline__ float tof(float x) {
  return x;
}
__device__ __forceinline__ float tof(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float tof(__half x) {
  return __half2float(x);
}

template <bool kSplit, class T>
__device__ __forceinline__ void set_frag(uint32_t& h, uint32_t& l, T v) {
  const float x = tof(v);
  if constexpr (kSplit) {
    h = tf32_bits(x);
    l = tf32_bits(x - __uint_as_float(h));
  } else {
    h = __float_as_uint(x);  // already exact in TF32 (a bf16 / fp16 value)
    l = 0u;
  }
}

__device__ __forceinline__ void store_split(uint32_t* hi, uint32_t* lo, int idx, float x) {
  const uint32_t h = tf32_bits(x);
  hi[idx] = h;
  lo[idx] = tf32_bits(x - __uint_as_float(h));
}

// Permuted k order. Within one 8-wide k step the products only need A and B to agree on
// which column is which, so fragment slots k = t and k = t + 4 take the adjacent columns 2t
// and 2t + 1: two elements per 32-bit (2-byte types) or 64-bit (fp32) shared load.
__device__ __forceinline__ void pair_to_f32(const float* s, float& x, float& y) {
  const float2 v = *reinterpret_cast<const float2*>(s);
  x = v.x, y = v.y;
}
__device__ __forceinline__ void pair_to_f32(const __nv_bfloat16* s, float& x, float& y) {
  const uint32_t u = *reinterpret_cast<const uint32_t*>(s);
  x = __uint_as_float(u << 16), y = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void pair_to_f32(const __half* s, float& x, float& y) {
  const float2 v = __half22float2(*reinterpret_cast<const __half2*>(s));
  x = v.x, y = v.y;
}
/// A (16 x 8), permuted k, from a row-major matrix with pitch P (even).
template <bool kSplit, class T>
__device__ __forceinline__ FragA load_a_perm(const T* s, int P, int r0, int k0, int g, int t) {
  float x0, x1, x2, x3;
  pair_to_f32(s + (r0 + g) * P + k0 + 2 * t, x0, x2);
  pair_to_f32(s + (r0 + g + 8) * P + k0 + 2 * t, x1, x3);
  FragA f;
  set_frag<kSplit>(f.h[0], f.l[0], x0);
  set_frag<kSplit>(f.h[1], f.l[1], x1);
  set_frag<kSplit>(f.h[2], f.l[2], x2);
  set_frag<kSplit>(f.h[3], f.l[3], x3);
  return f;
}
/// A (16 x 8), permuted k, A(r, k) = s[k * P + r] (transposed storage).
template <bool kSplit, class T>
__device__ __forceinline__ FragA load_a_t_perm(const T* s, int P, int r0, int k0, int g, int t) {
  FragA f;
  set_frag<kSplit>(f.h[0], f.l[0], s[(k0 + 2 * t) * P + r0 + g]);
  set_frag<kSplit>(f.h[1], f.l[1], s[(k0 + 2 * t) * P + r0 + g + 8]);
  set_frag<kSplit>(f.h[2], f.l[2], s[(k0 + 2 * t + 1) * P + r0 + g]);
  set_frag<kSplit>(f.h[3], f.l[3], s[(k0 + 2 * t + 1) * P + r0 + g + 8]);
  return f;
}
/// B (8 x 8), permuted k, B(k, n) = s[n * P + k] (row-major [n][k], pitch even).
template <bool kSplit, class T>
__device__ __forceinline__ FragB load_b_nk_perm(const T* s, int P, int k0, int n0, int g, int t) {
  float x0, x1;
  pair_to_f32(s + (n0 + g) * P + k0 + 2 * t, x0, x1);
  FragB f;
  set_frag<kSplit>(f.h[0], f.l[0], x0);
  set_frag<kSplit>(f.h[1], f.l[1], x1);
  return f;
}
/// B (8 x 8), permuted k, B(k, n) = hi/lo[k * P + n], already split.
__device__ __forceinline__ FragB load_b_pre_perm(const uint32_t* hi, const uint32_t* lo, int P,
                                                 int k0, int n0, int g, int t) {
  FragB f;
  f.h[0] = hi[(k0 + 2 * t) * P + n0 + g];
  f.h[1] = hi[(k0 + 2 * t + 1) * P + n0 + g];
  f.l[0] = lo[(k0 + 2 * t) * P + n0 + g];
  f.l[1] = lo[(k0 + 2 * t + 1) * P + n0 + g];
  return f;
}

// 16-byte asynchronous copies global -> shared (zero fill when !valid; src must still be a
// valid address).
__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Row pitch (elements) of raw K / Q tiles in shared memory: rows 16-byte aligned and A-operand
/// fragment loads free of bank conflicts (pitch == 4 mod 32 words).
template <class E>
__host__ __device__ constexpr int raw_pitch(int K) {
  return K + int(16 / sizeof(E));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// d0 += Ah Bh; d1 += Ah Bl (B split); d2 += Al Bh (A split): three independent accumulation
/// chains that the caller sums (the TF32 scan as (d0 + d1) + d2, the inverse by parts_sum).
template <bool kSplitA, bool kSplitB>
__device__ __forceinline__ void mma3(float (&d0)[4], float (&d1)[4], float (&d2)[4], const FragA& a,
                                     const FragB& b) {
  mma_tf32(d0, a.h, b.h);
  if constexpr (kSplitB) mma_tf32(d1, a.h, b.l);
  if constexpr (kSplitA) mma_tf32(d2, a.l, b.h);
}

__device__ __forceinline__ int64_t chunk_slot(const KernelParams& p, int n, const SeqRange& sr,
                                              int c) {
  if (p.cu_seqlens) return sr.t0 / kFC + n + c;
  return int64_t(n) * ((p.T + kFC - 1) / kFC) + c;
}

// ---- pass 1: per-chunk preparation -----------------------------------------------------

/// What a preparation block (grid: chunk, value head, sequence) works on: chunk c of sequence n
/// for value head hv (query / key head h), its L tokens from row tb of batch row sr.b; L = 0
/// when the chunk lies past the sequence's end.
struct PrepTile {
  int c, hv, n, h, L;
  SeqRange sr;
  int64_t tb;
};
__device__ __forceinline__ PrepTile prep_tile(const KernelParams& p) {
  PrepTile t;
  t.c = int(blockIdx.x), t.hv = int(blockIdx.y), t.n = int(blockIdx.z);
  t.h = key_head(p, t.hv);
  t.sr = seq_range(p, t.n);
  const int64_t cs = int64_t(t.c) * kFC;
  t.L = cs >= t.sr.len ? 0 : int(t.sr.len - cs < kFC ? t.sr.len - cs : kFC);
  t.tb = t.sr.t0 + cs;
  return t;
}

/// Region of the raw K / Q tiles (E) and, aliased after the products, of T's columns (fp32).
__host__ __device__ inline int64_t prep_kq_floats(int K, int esize) {
  const int64_t kq = 2LL * kFC * (K + 16 / esize) * esize / 4;
  const int64_t tm = int64_t(kFC) * kMP + kInvScratch;  // T + the inverse's scratch
  return kq > tm ? kq : tm;
}
__host__ __device__ inline int64_t prep_smem_bytes(int K, int esize) {
  return (prep_kq_floats(K, esize) + int64_t(kFC) * kMP + 4LL * kFC) * 4;
}

/// Threads [0, kFC) load their token's eta and log decay (0 past L) into bet / Gv, which
/// chunk_token_scalars reads after a barrier: issued at the prep's start, their latency overlaps
/// the tile loads.
__device__ __forceinline__ void token_scalars_preload(const KernelParams& p, const SeqRange& sr,
                                                      int64_t tb, int L, int hv, float* bet,
                                                      float* Gv) {
  const int i = threadIdx.x;
  if (i < kFC) {
    bet[i] = i < L ? token_eta(p, sr.b, tb + i, hv) : 0.f;
    Gv[i] = i < L ? token_log_decay(p, sr.b, tb + i, hv) : 0.f;
  }
}

/// Per-token scalars of one chunk (rows [0, kFC), rows >= L padding): kscale, beta, the
/// read-out scale and the inclusive cumulative log decay G, into shared arrays. ks / qs are the
/// raw key / query tiles (pitch KP; with q_sw128 the query tile in the 128-byte swizzle,
/// kmajor_sw128_offset); kn2, when given, holds the squared key norms already (the diagonal of
/// K K^T), and query norms are summed only for the l2-norm read-out. bet / Gv hold
/// the tokens' eta / log decay on entry (token_scalars_preload, visible to every thread). Ends
/// with a barrier. All kPrepThreads threads call it.
template <class E>
__device__ __forceinline__ void chunk_token_scalars(const KernelParams& p, int L, const E* ks,
                                                    const E* qs, int KP, int K, float* ksc,
                                                    float* bet, float* qsc, float* Gv,
                                                    const float* kn2 = nullptr,
                                                    bool q_sw128 = false) {
  constexpr int C = kFC;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool sum_k = kn2 == nullptr, sum_q = p.l2norm != 0;
  // One warp per token when a norm is summed here, else one thread per token.
  const bool per_warp = sum_k || sum_q;
  const int i0 = per_warp ? warp : tid, di = per_warp ? kPrepThreads / 32 : kPrepThreads;
  for (int i = i0; i < C; i += di) {
    float n2 = 0.f, qn2 = 0.f;
    if (per_warp) {
      for (int r = lane; r < K; r += 32) {
        if (sum_k) {
          const float kv = tof(ks[i * KP + r]);
          n2 = fmaf(kv, kv, n2);
        }
        if (sum_q) {
          const int qi = q_sw128 ? kmajor_sw128_offset(i, r, kFC) / 2 : i * KP + r;
          const float qv = tof(qs[qi]);
          qn2 = fmaf(qv, qv, qn2);
        }
      }
      n2 = warp_sum(n2);
      qn2 = warp_sum(qn2);
    }
    if (!sum_k) n2 = kn2[i];
    float eta = 0.f, gl = 0.f;
    if (!per_warp || lane == 0) eta = bet[i], gl = Gv[i];  // the thread that overwrites them
    const TokenCoef tc = i < L ? token_coef(n2, eta, p.eps, p.kaczmarz) : TokenCoef{0.f, 0.f};
    if (!per_warp || lane == 0) {
      ksc[i] = tc.kscale;
      bet[i] = tc.beta;
      qsc[i] = readout_scale(qn2, p);
      Gv[i] = gl;
    }
  }
  __syncthreads();
  if (warp == 0) {  // inclusive scan of the log decays (fixed shuffle order)
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
}

/// B (8 x 8), permuted k, B(k, n) = s[k * P + n] (row-major [k][n], fp32), split.
__device__ __forceinline__ FragB load_b_kn_perm(const float* s, int P, int k0, int n0, int g,
                                                int t) {
  FragB f;
  set_frag<true>(f.h[0], f.l[0], s[(k0 + 2 * t) * P + n0 + g]);
  set_frag<true>(f.h[1], f.l[1], s[(k0 + 2 * t + 1) * P + n0 + g]);
  return f;
}

/// T = (I + lm)^-1 for a strictly lower 64 x 64 lm (pitch kMP) into tm (pitch kMP; valid on and
/// below the diagonal blocks, exact zeros above the diagonal inside them). Contract: fp32-grade
/// (the 16 x 16 diagonal blocks by forward substitution in fp32 FMA; the blocks below by the
/// blocked recurrence T_ab = -T_aa sum_{b <= k < a} L_ak T_kb on the tensor cores with both
/// operands split TF32 hi + lo, ~2^-21 relative per product). scratch: kInvScratch floats.
/// Called by all 256 threads; ends with a barrier.
__device__ __forceinline__ void invert_unit_lower(const float* lm, float* tm, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Diagonal block o = 16 warp, one warp each, right-looking: lane (column c, row half hh) holds
  // rows 8 hh .. 8 hh + 7 of column c; once row j is final it is broadcast and subtracted below.
  if (warp < 4) {
    const int o = warp * 16, c = lane & 15, hh = lane >> 4;
    float t[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) t[k] = 8 * hh + k == c ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < 15; ++j) {
      const float tj = __shfl_sync(0xffffffffu, t[j & 7], c + 16 * (j >> 3));
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (8 * hh + k > j) t[k] = fmaf(-lm[(o + 8 * hh + k) * kMP + o + j], tj, t[k]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) tm[(o + 8 * hh + k) * kMP + o + c] = t[k];
  }
  __syncthreads();
  // Blocks below the diagonal by distance d = a - b (3, 2, 1 blocks), each in two 8-column
  // halves, a warp a half: Y = sum_k L_ak T_kb, then T_ab = -T_aa Y (Y through this warp's
  // scratch, pitch 12: conflict-free B loads).
  const int g = lane >> 2, t4 = lane & 3;
  for (int d = 1; d < 4; ++d) {
    if (warp < 2 * (4 - d)) {
      const int b = warp >> 1, a = b + d, n0 = b * 16 + (warp & 1) * 8;
      float* ys = scratch + warp * 16 * 12;
      float y[3][4] = {};  // [part][c]: parts hi hi, hi lo, lo hi
      for (int kk = b * 16; kk < a * 16; kk += 8) {
        const FragA fa = load_a_perm<true>(lm, kMP, a * 16, kk, g, t4);
        const FragB fb = load_b_kn_perm(tm, kMP, kk, n0, g, t4);
        mma3<true, true>(y[0], y[1], y[2], fa, fb);
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *reinterpret_cast<float2*>(ys + (g + 8 * hr) * 12 + 2 * t4) =
            make_float2(parts_sum(y, 2 * hr), parts_sum(y, 2 * hr + 1));
      __syncwarp();
      float z[3][4] = {};
#pragma unroll
      for (int kk = 0; kk < 16; kk += 8) {
        const FragA fa = load_a_perm<true>(tm, kMP, a * 16, a * 16 + kk, g, t4);
        const FragB fb = load_b_kn_perm(ys, 12, kk, 0, g, t4);
        mma3<true, true>(z[0], z[1], z[2], fa, fb);
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *reinterpret_cast<float2*>(tm + (a * 16 + g + 8 * hr) * kMP + n0 + 2 * t4) =
            make_float2(-parts_sum(z, 2 * hr), -parts_sum(z, 2 * hr + 1));
    }
    __syncthreads();
  }
}

template <class E>
__global__ void __launch_bounds__(kPrepThreads)
    chunk_prep_kernel(const KernelParams p, float* __restrict__ ws) {
  constexpr bool kSplitIn = std::is_same_v<E, float>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = p.K, KP = raw_pitch<E>(K);
  constexpr int C = kFC;
  const PrepTile pt = prep_tile(p);
  if (pt.L == 0) return;
  const int c = pt.c, hv = pt.hv, n = pt.n, h = pt.h, L = pt.L;
  const SeqRange sr = pt.sr;
  const int64_t tb = pt.tb;

  E* ks = reinterpret_cast<E*>(smem);  // [C][KP] raw keys
  E* qs = ks + C * KP;                 // [C][KP] raw queries
  float* tm = smem;                    // [C][kMP] T (+ scratch); aliases ks / qs after the products
  float* lm = smem + prep_kq_floats(K, int(sizeof(E)));  // [C][kMP] B(A^- o K^K^T)
  float* ksc = lm + C * kMP;                             // kscale
  float* bet = ksc + C;                                  // beta
  float* qsc = bet + C;                                  // read-out scale
  float* Gv = qsc + C;                                   // log decay, then cumulative

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const E* kb = static_cast<const E*>(p.k);
  const E* qb = static_cast<const E*>(p.q);
  constexpr int VE = int(16 / sizeof(E));
  const int kvec = K / VE;
  for (int idx = tid; idx < C * kvec; idx += kPrepThreads) {
    const int i = idx / kvec, r = (idx % kvec) * VE;
    const int64_t t = tb + (i < L ? i : 0);
    cp16(ks + i * KP + r, kb + sr.b * p.ks[0] + t * p.ks[1] + int64_t(h) * p.ks[2] + r, i < L);
    cp16(qs + i * KP + r, qb + sr.b * p.qs[0] + t * p.qs[1] + int64_t(h) * p.qs[2] + r, i < L);
  }
  cp_commit();
  token_scalars_preload(p, sr, tb, L, hv, bet, Gv);
  cp_wait<0>();
  __syncthreads();
  chunk_token_scalars(p, L, ks, qs, KP, K, ksc, bet, qsc, Gv);

  float* w = ws + (chunk_slot(p, n, sr, c) * p.HV + hv) * p.ws_record_floats;
  // K K^T and Q K^T on the 20 lower 16 x 8 tiles (40 units over the warps), scaled on the
  // way out: lm = B(A^- o K^K^T) (strict), P = qs_i (A o Q K^^T) into the workspace.
  for (int u = warp; u < 40; u += kPrepThreads / 32) {
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
        w[kWsP + i * C + j] = j <= i ? qsc[i] * gam * ksc[j] * x : 0.f;
      else
        lm[i * kMP + j] = j < i ? bet[i] * gam * (ksc[i] * ksc[j]) * x : 0.f;
    }
  }
  for (int idx = tid; idx < C * C; idx += kPrepThreads) {  // P above the lower tiles
    const int i = idx / C, j = idx % C;
    if ((j >> 3) > 2 * (i >> 4) + 1) w[kWsP + idx] = 0.f;
  }
  __syncthreads();  // lm complete; ks / qs free (tm aliases them)
  invert_unit_lower(lm, tm, tm + C * kMP);
  for (int idx = tid; idx < C * C; idx += kPrepThreads) {
    const int i = idx / C, j = idx % C;
    w[kWsT + idx] = (j >> 4) > (i >> 4) ? 0.f : tm[i * kMP + j];
  }
  // Per-token scalars: 0 rhs scale beta*kscale, 1 gamma_i, 2 gamma_i*qscale_i,
  // 3 kscale_i*gamma_L/gamma_i (0 past the chunk end), 4 [gamma_L, 0, ...].
  if (tid < C) {
    const int i = tid;
    const float Gend = Gv[L - 1], gi = expf(Gv[i]);
    w[kWsSc + 0 * C + i] = bet[i] * ksc[i];
    w[kWsSc + 1 * C + i] = gi;
    w[kWsSc + 2 * C + i] = gi * qsc[i];
    w[kWsSc + 3 * C + i] = i < L ? ksc[i] * expf(Gend - Gv[i]) : 0.f;
    w[kWsSc + 4 * C + i] = i == 0 ? expf(Gend) : 0.f;
  }
}

// ---- pass 2: the sequential scan over chunks ---------------------------------------------

__host__ __device__ inline int scan_pitch(int VS) {
  return VS + 4;  // == 4 mod 16: permuted B-operand loads (rows 2t, 2t + 1) conflict-free
}
/// Floats of one pipeline stage: raw K, Q, V tiles (E), T, P and the scalars (fp32).
__host__ __device__ inline int64_t scan_stage_floats(int K, int VS, int esize) {
  return (2LL * kFC * (K + 16 / esize) + int64_t(kFC) * VS) * esize / 4 + 2LL * kFC * kMP +
         5LL * kFC;
}
__host__ __device__ inline int64_t scan_smem_bytes(int K, int VS, int esize, int stages) {
  const int SP = scan_pitch(VS);
  return (stages * scan_stage_floats(K, VS, esize) + 3LL * K * SP + 7LL * kFC * SP) * 4;
}

template <class E, int VS, int kStages>
__global__ void __launch_bounds__(kScanThreads, 1)
    chunk_scan_kernel(const KernelParams p, const float* __restrict__ ws) {
  constexpr bool kSplitIn = std::is_same_v<E, float>;
  constexpr int C = kFC, NJ = VS / 8, NT = 4 * NJ;
  constexpr int SP = VS + 4;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int K = p.K, V = p.V, KP = raw_pitch<E>(K);
  const int64_t stage_floats = scan_stage_floats(K, VS, int(sizeof(E)));
  // Stage st (chunk ch uses stage ch % kStages), each 16-byte aligned:
  //   Kr [C][KP] E, Qr [C][KP] E, Vr [C][VS] E, Ts [C][kMP], Ps [C][kMP], sc [5][C]
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

  for (int idx = tid; idx < K * (VS / 4); idx += kScanThreads) {
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
  const int q0 = tid, qstride = kScanThreads;
  const int di = qstride / kvec, dr = qstride % kvec;
  const int i0 = q0 / kvec, r0 = q0 % kvec;
  auto wdst = [&](int st, int q) {
    float* Tr = stage_t(st);
    return q < 2 * C * (C / 4) ? Tr + (q >> 4) * kMP + (q & 15) * 4
                               : Tr + 2 * C * kMP + (q - 2 * C * (C / 4)) * 4;
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
    for (int idx = tid; idx < C * vvec; idx += kScanThreads) {
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
    const E* Ks = stage_k(st);
    const E* Qs = stage_q(st);
    const E* Vs = stage_v(st);
    const float* Ts = stage_t(st);
    const float* Ps = Ts + C * kMP;
    const float* sc = Ps + C * kMP;

    // B. K S and Q S (S split; raw inputs exact): R = a_i (V - gamma_i K S) and
    //    O0 = gq_i Q S, one (product, tile) unit per warp at a time.
    for (int u = warp; u < 2 * NT; u += kScanThreads / 32) {
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
    for (int tile = warp; tile < NT; tile += kScanThreads / 32) {
      const int mi = tile & 3, nj = tile >> 2;
      float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
      float d2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
      for (int kk = 0; kk < (mi + 1) * 16; kk += 8) {
        const FragA a = load_a_perm<true>(Ts, kMP, mi * 16, kk, g, t4);
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
      for (int u = warp; u < NT + mk * NJ; u += kScanThreads / 32) {
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
            const FragA a = load_a_perm<true>(Ps, kMP, mi * 16, kk, g, t4);
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
            store_split(Sh, Sl, r * SP + cc, x);
          }
        }
      }
    }
    if (kStages == 2 && ch + 1 < nch) cp_wait<0>();
    __syncthreads();
  }

  if (s_out)
    for (int idx = tid; idx < K * (VS / 4); idx += kScanThreads) {
      const int r = idx / (VS / 4), cc = (idx % (VS / 4)) * 4;
      *reinterpret_cast<float4*>(s_out + int64_t(r) * V + c0 + cc) =
          *reinterpret_cast<const float4*>(Ss + r * SP + cc);
    }
}

template <class E, int VS, int kStages>
cudaError_t launch_scan_stages(const KernelParams& p, cudaStream_t stream, int64_t bytes) {
  cudaError_t e = cudaFuncSetAttribute(chunk_scan_kernel<E, VS, kStages>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / VS);
  chunk_scan_kernel<E, VS, kStages>
      <<<dim3(unsigned(blocks)), kScanThreads, size_t(bytes), stream>>>(p, p.ws);
  return cudaGetLastError();
}
template <class E, int VS>
cudaError_t launch_scan(const KernelParams& p, cudaStream_t stream, int stages) {
  const int64_t bytes = scan_smem_bytes(p.K, VS, int(sizeof(E)), stages);
  if (stages == 2) return launch_scan_stages<E, VS, 2>(p, stream, bytes);
  return launch_scan_stages<E, VS, 1>(p, stream, bytes);
}

/// Runs the fast path when it applies (workspace given, shared memory fits); `ran` says
/// whether it did. Value-slice width: the widest of 32 / 16 / 8 that still gives about one
/// block per multiprocessor.
template <class E>
cudaError_t launch_chunk_fast(const KernelParams& p, cudaStream_t stream, int sms, int64_t max_smem,
                              bool& ran) {
  ran = false;
  if (!p.ws || p.max_chunks <= 0 || p.N > 65535 || p.HV > 65535) return cudaSuccess;
  const int64_t prep_bytes = prep_smem_bytes(p.K, int(sizeof(E)));
  if (prep_bytes > max_smem) return cudaSuccess;
  // Slice width VS and pipeline depth: estimated time ~ waves * (1 + VS/16) (per-chunk work
  // grows with VS, partly fixed), waves from the blocks that fit per multiprocessor; ties go
  // to the narrower slice, then to the deeper pipeline.
  int VS = 0, stages = 0;
  double best = 0.0;
  const int64_t heads = int64_t(p.N) * p.HV;
  for (int cand : {8, 16, 32}) {
    if (p.V % cand != 0) continue;
    const int64_t blocks = heads * (p.V / cand);
    for (int st : {2, 1}) {
      const int64_t b = scan_smem_bytes(p.K, cand, int(sizeof(E)), st);
      if (b > max_smem) continue;
      const int64_t cap = (max_smem + 1024) / (b + 1024) * sms;
      const double cost = double((blocks + cap - 1) / cap) * (1.0 + cand / 16.0);
      if (VS == 0 || cost < best) VS = cand, stages = st, best = cost;
    }
  }
  if (VS == 0) return cudaSuccess;
  ran = true;
  cudaError_t e = cudaFuncSetAttribute(
      chunk_prep_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prep_bytes));
  if (e != cudaSuccess) return e;
  chunk_prep_kernel<E><<<dim3(unsigned(p.max_chunks), unsigned(p.HV), unsigned(p.N)), kPrepThreads,
                         size_t(prep_bytes), stream>>>(p, p.ws);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  switch (VS) {
    case 32: return launch_scan<E, 32>(p, stream, stages);
    case 16: return launch_scan<E, 16>(p, stream, stages);
    default: return launch_scan<E, 8>(p, stream, stages);
  }
}

}  // namespace kla::kernels
