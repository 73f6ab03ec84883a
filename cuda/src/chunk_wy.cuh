// WY chunkwise path (prefill) for bf16 / fp16 storage on sm_90: bf16 tensor cores with every
// fp32 intermediate split into hi + lo, the scan reduced to the state-dependent products.
//
// Same mathematics as chunk_fast.cuh (SPEC §1 chunk form in the normalised-key form, chunks of
// C = 64), with the chunk system solved ahead of the scan (paper App. B, WY form):
//   U = T diag(beta kscale) (V - D_gamma K S) = U0 - W S,
//   U0 = T diag(beta kscale) V,   W = T diag(beta kscale gamma) K          (per chunk, no S)
//   O  = diag(gamma qscale) Q S + P U
//   S <- gamma_C S + K^T diag(kscale gamma_C / gamma_j) U
//
//  1. chunk_wy_prep_kernel, fully parallel over (sequence, chunk, value head): the per-token
//     scalars and T = (I + B(A^- o K^K^T))^-1 exactly as the TF32 path (fp32, blocked inverse),
//     then W, U0 and P on the tensor cores into the workspace record (workspace.hpp).
//  2. chunk_wy_scan_kernel, one block per (sequence, value head, VS = 16 or 32 value columns),
//     chunks in order. Warps 0-3 own U = U0 - W S (row block w) and the state update of key-row
//     blocks w, w+4 (the fp32 state slice lives in their accumulator registers); warps 4-7 own
//     the read-out of row block w-4. Two barriers per chunk; the next chunk's record (W, P,
//     scalars) and U0 slice arrive by bulk copies and its K and Q tiles by one TMA box each, into
//     a two-stage ring, while the current chunk computes.
//
// Precision. The products run as mma.sync m16n8k16 bf16 with fp32 accumulation. Raw bf16
// inputs are exact operands; fp16 inputs enter as bf16 hi + lo (exact); fp32 intermediates
// (S, U, W, T, P) as hi = bf16(x), lo = bf16(x - hi), 16 significant bits together, and a
// product of two split operands keeps hi*hi + hi*lo + lo*hi (relative error ~2^-16, far below
// the bf16 / fp16 storage roundoff that bounds the outputs). The inverse stays fp32 (see
// prefill_notes.md: a low-precision inverse is a known weak point). Deterministic: fixed
// orders, no atomics.
#pragma once

#include <type_traits>

#include <cudaTypedefs.h>

#include "bf16_mma.cuh"
#include "chunk_fast.cuh"
#include "workspace.hpp"

namespace kla::kernels {

constexpr int kWyThreads = 256;
constexpr int kWyPP = kFC + 8;               // pitch (elements) of 64-wide bf16 tiles
constexpr int kWyScOff = 64, kWyGend = 128;  // scalars: [0,64) gamma*qscale, [64,128) update

/// Byte offsets inside one WY record for key dim KD (must agree with workspace.hpp).
template <int KD>
struct WyRecord {
  static constexpr int KP = KD + 8;  // pitch (elements) of K-wide bf16 tiles
  static constexpr int64_t w_bytes = int64_t(kFC) * KP * 2;
  static constexpr int64_t p_bytes = int64_t(kFC) * kWyPP * 2;
  static constexpr int64_t wh = 0, wl = w_bytes, ph = 2 * w_bytes, pl = ph + p_bytes,
                           sc = pl + p_bytes, shared = sc + 1024;
  static_assert(shared == kla::detail::wy_shared_bytes(KD), "workspace.hpp layout");
};

template <int KD>
__host__ __device__ constexpr bool wy_head_dim_ok() {
  return KD == 64 || KD == 96 || KD == 128;
}

/// Issues cp.async copies of rows [0, kFC) of a [.., T, head, ncols] tensor (row stride rs, first
/// row at src) into dst (pitch DP elements); rows >= L are zero-filled. Not committed. Thread
/// tid takes the 16-byte pieces tid, tid + blockDim.x, ...; (row, piece) are stepped, not divided.
template <class E>
__device__ __forceinline__ void load_rows_async(E* dst, int DP, const E* src, int64_t rs, int L,
                                                int ncols) {
  constexpr int VE = int(16 / sizeof(E));
  const int nv = ncols / VE, step = int(blockDim.x);
  const int di = step / nv, dr = (step - di * nv) * VE;
  int i = int(threadIdx.x) / nv, r = (int(threadIdx.x) - i * nv) * VE;
  while (i < kFC) {
    cp16(dst + i * DP + r, src + int64_t(i < L ? i : 0) * rs + r, i < L);
    i += di, r += dr;
    if (r >= ncols) r -= ncols, ++i;
  }
}

/// A raw E operand fragment as bf16 parts: bf16 is itself (one part), fp16 is hi + lo.
template <class E>
struct RawFrag {
  static constexpr bool kTwo = std::is_same_v<E, __half>;
  uint32_t hi[4], lo[4];
  __device__ __forceinline__ explicit RawFrag(const uint32_t (&r)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (kTwo)
        split_f16x2(r[e], hi[e], lo[e]);
      else
        hi[e] = r[e], lo[e] = 0u;
    }
  }
};
/// Raw B pair (two n-tiles, regs r0..r3) as bf16 parts.
template <class E>
__device__ __forceinline__ void raw_b_parts(const uint32_t (&r)[4], uint32_t (&hi)[4],
                                            uint32_t (&lo)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (std::is_same_v<E, __half>)
      split_f16x2(r[e], hi[e], lo[e]);
    else
      hi[e] = r[e], lo[e] = 0u;
  }
}

// ---- pass 1: per-chunk preparation ----------------------------------------------------------

template <int KD>
__host__ __device__ constexpr int64_t wy_prep_region_bytes() {
  constexpr int64_t q = int64_t(kFC) * (KD + 8) * 2, l = int64_t(kFC) * kMP * 4,
                    t = 2LL * kFC * kWyPP * 2;
  return q > l ? (q > t ? q : t) : (l > t ? l : t);
}
template <int KD>
__host__ __device__ inline int64_t wy_prep_smem_bytes(int V) {
  return int64_t(kFC) * (KD + 8) * 2 + int64_t(kFC) * (V + 8) * 2 + wy_prep_region_bytes<KD>() +
         (int64_t(kFC) * (kFC + 1) + 3 * 256) * 4 + 7LL * kFC * 4;
}

/// D (two n-tiles of row block mi) = A_split (hi, lo: bf16 [64][kWyPP], lower triangular, so
/// k < 16 (mi + 1)) times a raw E matrix B [64][BP] at columns n0..n0+15, into dst as fp32 via
/// store(i, c, x0, x1) for the pairs (i, c), (i, c + 1).
template <class E, class Store>
__device__ __forceinline__ void tri_times_raw(const __nv_bfloat16* Ah, const __nv_bfloat16* Al,
                                              const E* B, int BP, int mi, int n0, Store store) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  float d[2][3][4] = {};
  for (int ks = 0; ks <= mi; ++ks) {
    uint32_t ah[4], al[4], br[4], bh[4], bl[4];
    ldsm4(ah, Ah + frag_a(kWyPP, mi * 16, ks * 16, lane));
    ldsm4(al, Al + frag_a(kWyPP, mi * 16, ks * 16, lane));
    ldsm4_t(br, B + frag_b_kn(BP, ks * 16, n0, lane));
    raw_b_parts<E>(br, bh, bl);
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {
      mma_bf16(d[nj][0], ah, bh[2 * nj], bh[2 * nj + 1]);
      mma_bf16(d[nj][1], al, bh[2 * nj], bh[2 * nj + 1]);
      if constexpr (std::is_same_v<E, __half>) mma_bf16(d[nj][2], ah, bl[2 * nj], bl[2 * nj + 1]);
    }
  }
#pragma unroll
  for (int nj = 0; nj < 2; ++nj)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
      store(mi * 16 + g + hr * 8, n0 + nj * 8 + 2 * t4,
            (d[nj][0][2 * hr] + d[nj][2][2 * hr]) + d[nj][1][2 * hr],
            (d[nj][0][2 * hr + 1] + d[nj][2][2 * hr + 1]) + d[nj][1][2 * hr + 1]);
}

template <class E, int KD>
__global__ void __launch_bounds__(kWyThreads)
    chunk_wy_prep_kernel(const KernelParams p, char* __restrict__ ws) {
  using R = WyRecord<KD>;
  constexpr int C = kFC, KP = KD + 8, TP = kFC + 1;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const int V = p.V, VP = V + 8;
  const int c = int(blockIdx.x), hv = int(blockIdx.y), n = int(blockIdx.z);
  const SeqRange sr = seq_range(p, n);
  const int64_t cs = int64_t(c) * C;
  if (cs >= sr.len) return;
  const int L = int(sr.len - cs < C ? sr.len - cs : C);
  const int64_t tb = sr.t0 + cs;
  const int h = hv / (p.HV / p.H);

  E* Kr = reinterpret_cast<E*>(smem);                   // [C][KP] raw keys
  E* Vr = Kr + C * KP;                                  // [C][VP] raw values
  char* region = reinterpret_cast<char*>(Vr + C * VP);  // Q, then lm, then T split
  E* Qr = reinterpret_cast<E*>(region);                 // [C][KP] raw queries
  float* lm = reinterpret_cast<float*>(region);         // [C][kMP] B(A^- o K^K^T)
  auto* Th = reinterpret_cast<__nv_bfloat16*>(region);  // [C][kWyPP] T diag(..) split
  __nv_bfloat16* Tl = Th + C * kWyPP;
  float* tm = reinterpret_cast<float*>(region + wy_prep_region_bytes<KD>());  // [C][TP] T
  float* X = tm + C * TP;  // [3][256] inverse scratch
  float* ksc = X + 3 * 256;
  float* bet = ksc + C;
  float* qsc = bet + C;
  float* Gv = qsc + C;
  float* kn2 = Gv + C;       // squared key norms
  float* col_w = kn2 + C;    // beta kscale gamma: T's column scale for W
  float* col_u = col_w + C;  // beta kscale: for U0

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const E* kb = static_cast<const E*>(p.k) + sr.b * p.ks[0] + tb * p.ks[1] + int64_t(h) * p.ks[2];
  const E* qb = static_cast<const E*>(p.q) + sr.b * p.qs[0] + tb * p.qs[1] + int64_t(h) * p.qs[2];
  const E* vb = static_cast<const E*>(p.v) + sr.b * p.vs[0] + tb * p.vs[1] + int64_t(hv) * p.vs[2];
  load_rows_async(Kr, KP, kb, p.ks[1], L, KD);
  load_rows_async(Qr, KP, qb, p.qs[1], L, KD);
  load_rows_async(Vr, VP, vb, p.vs[1], L, V);
  cp_commit();
  cp_wait<0>();
  __syncthreads();

  char* rec = ws + (chunk_slot(p, n, sr, c) * p.HV + hv) * (p.ws_record_floats * 4);
  auto* Pg_h = reinterpret_cast<uint32_t*>(rec + R::ph);  // as bf16 pairs, pitch kWyPP / 2
  auto* Pg_l = reinterpret_cast<uint32_t*>(rec + R::pl);
  // K K^T and Q K^T on the 10 lower 16 x 16 tiles each (raw inputs exact in the instruction).
  // Unit u < 10: K K^T tile, else Q K^T tile; tile tl -> (row block mi, column block nb <= mi).
  auto unit_tile = [](int u, bool& isq, int& mi, int& nb) {
    isq = u >= 10;
    const int tl = isq ? u - 10 : u;
    mi = tl < 1 ? 0 : tl < 3 ? 1 : tl < 6 ? 2 : 3;
    nb = tl - mi * (mi + 1) / 2;
  };
  float acc[3][2][4];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int u = warp + 8 * k;
    if (u >= 20) break;
    bool isq;
    int mi, nb;
    unit_tile(u, isq, mi, nb);
    const E* A = isq ? Qr : Kr;
#pragma unroll
    for (int nj = 0; nj < 2; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[k][nj][e] = 0.f;
#pragma unroll 4
    for (int ks = 0; ks < KD / 16; ++ks) {
      uint32_t a[4], b[4];
      ldsm4(a, A + frag_a(KP, mi * 16, ks * 16, lane));
      ldsm4(b, Kr + frag_b_nk(KP, ks * 16, nb * 16, lane));
      mma_raw<E>(acc[k][0], a, b[0], b[1]);
      mma_raw<E>(acc[k][1], a, b[2], b[3]);
    }
  }
  // Squared key norms from the diagonal of K K^T (fp32 sums of exact products).
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int u = warp + 8 * k;
    if (u >= 10) break;
    bool isq;
    int mi, nb;
    unit_tile(u, isq, mi, nb);
    if (nb != mi) continue;
#pragma unroll
    for (int nj = 0; nj < 2; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = g + (e >> 1) * 8, j = nj * 8 + 2 * t4 + (e & 1);
        if (i == j) kn2[mi * 16 + i] = acc[k][nj][e];
      }
  }
  __syncthreads();
  chunk_token_scalars(p, sr, tb, L, hv, Kr, Qr, KP, KD, ksc, bet, qsc, Gv, kn2);  // + barrier
  if (tid < C) {  // column scales of T for W and U0
    const float s = bet[tid] * ksc[tid];
    col_u[tid] = s;
    col_w[tid] = s * __expf(Gv[tid]);
  }
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int u = warp + 8 * k;
    if (u >= 20) break;
    bool isq;
    int mi, nb;
    unit_tile(u, isq, mi, nb);
#pragma unroll
    for (int nj = 0; nj < 2; ++nj)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = mi * 16 + g + hr * 8, j = nb * 16 + nj * 8 + 2 * t4;
        float x[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = j + e;
          const float gam = jj <= i ? __expf(Gv[i] - Gv[jj]) : 0.f;
          const float dot = acc[k][nj][2 * hr + e];
          x[e] = isq ? (jj <= i ? qsc[i] * gam * ksc[jj] * dot : 0.f)
                     : (jj < i ? bet[i] * gam * (ksc[i] * ksc[jj]) * dot : 0.f);
        }
        if (isq) {
          uint32_t hi, lo;
          split_bf16x2(x[0], x[1], hi, lo);
          Pg_h[(i * kWyPP + j) / 2] = hi;
          Pg_l[(i * kWyPP + j) / 2] = lo;
        } else {
          lm[i * kMP + j] = x[0];
          lm[i * kMP + j + 1] = x[1];
        }
      }
  }
  // P above the lower 16 x 16 tiles and the pitch padding: zeros (never used, but the scan's
  // bulk copy reads whole records).
  for (int idx = tid; idx < C * (kWyPP / 8); idx += kWyThreads) {
    const int i = idx / (kWyPP / 8), u8 = idx % (kWyPP / 8);
    if (u8 * 8 >= 16 * (i / 16 + 1)) {
      reinterpret_cast<uint4*>(rec + R::ph)[idx] = make_uint4(0, 0, 0, 0);
      reinterpret_cast<uint4*>(rec + R::pl)[idx] = make_uint4(0, 0, 0, 0);
    }
  }
  for (int i = tid; i < C; i += kWyThreads) {  // W's pitch padding
    reinterpret_cast<uint4*>(rec + R::wh + (i * KP + KD) * 2)[0] = make_uint4(0, 0, 0, 0);
    reinterpret_cast<uint4*>(rec + R::wl + (i * KP + KD) * 2)[0] = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  invert_unit_lower(lm, tm, X);

  // T diag(col) split into Th / Tl: col_w for W, col_u for U0.
  auto split_t = [&](const float* col) {
    for (int idx = tid; idx < C * C / 2; idx += kWyThreads) {
      const int i = idx >> 5, j = (idx & 31) * 2;
      if ((j >> 4) > (i >> 4)) continue;
      uint32_t hi, lo;
      split_bf16x2(tm[i * TP + j] * col[j], tm[i * TP + j + 1] * col[j + 1], hi, lo);
      reinterpret_cast<uint32_t*>(Th)[(i * kWyPP + j) / 2] = hi;
      reinterpret_cast<uint32_t*>(Tl)[(i * kWyPP + j) / 2] = lo;
    }
    __syncthreads();
  };
  split_t(col_w);
  {  // W = T diag(beta kscale gamma) K, split, into the record.
    auto* Wg_h = reinterpret_cast<uint32_t*>(rec + R::wh);
    auto* Wg_l = reinterpret_cast<uint32_t*>(rec + R::wl);
    for (int u = warp; u < 4 * (KD / 16); u += kWyThreads / 32)
      tri_times_raw<E>(Th, Tl, Kr, KP, u & 3, (u >> 2) * 16,
                       [&](int i, int cc, float x0, float x1) {
                         uint32_t hi, lo;
                         split_bf16x2(x0, x1, hi, lo);
                         Wg_h[(i * KP + cc) / 2] = hi;
                         Wg_l[(i * KP + cc) / 2] = lo;
                       });
  }
  __syncthreads();
  split_t(col_u);
  {  // U0 = T diag(beta kscale) V, fp32, in 16-column blocks [V/16][64][16].
    float* U0 = reinterpret_cast<float*>(rec + R::shared);
    for (int u = warp; u < 4 * (V / 16); u += kWyThreads / 32)
      tri_times_raw<E>(
          Th, Tl, Vr, VP, u & 3, (u >> 2) * 16, [&](int i, int cc, float x0, float x1) {
            *reinterpret_cast<float2*>(U0 + (cc >> 4) * (C * 16) + i * 16 + (cc & 15)) =
                make_float2(x0, x1);
          });
  }
  // Per-token scalars: [0,64) gamma_i qscale_i; [64,128) kscale_i gamma_L / gamma_i (0 past the
  // chunk end); [128] gamma_L; the rest 0.
  float* sc = reinterpret_cast<float*>(rec + R::sc);
  const float Gend = Gv[L - 1];
  for (int i = tid; i < 256; i += kWyThreads) {
    float x = 0.f;
    if (i < C)
      x = expf(Gv[i]) * qsc[i];
    else if (i < 2 * C)
      x = i - C < L ? ksc[i - C] * expf(Gend - Gv[i - C]) : 0.f;
    else if (i == kWyGend)
      x = expf(Gend);
    sc[i] = x;
  }
}

// ---- pass 2: the sequential scan ------------------------------------------------------------

/// Pitch (elements) of the scan's VS-wide bf16 tiles: rows 16 B apart modulo 128 (ldmatrix
/// conflict-free).
template <int VS>
constexpr int wy_scan_pitch() {
  return VS + 8;
}
template <int KD, int VS>
__host__ __device__ constexpr int64_t wy_stage_bytes() {
  return WyRecord<KD>::shared + int64_t(kFC) * VS * 4 + 2LL * kFC * KD * 2;
}
template <int KD, int VS>
__host__ __device__ constexpr int64_t wy_scan_smem_bytes() {
  return 2 * wy_stage_bytes<KD, VS>() + 2LL * KD * wy_scan_pitch<VS>() * 2 +
         4LL * kFC * wy_scan_pitch<VS>() * 2;
}

template <class E, int KD, int VS>
__global__ void __launch_bounds__(kWyThreads, 1)
    chunk_wy_scan_kernel(const KernelParams p, const char* __restrict__ ws,
                         const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap qmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using R = WyRecord<KD>;
  using E2 = std::conditional_t<std::is_same_v<E, __half>, __half2, __nv_bfloat162>;
  constexpr int C = kFC, KP = KD + 8, SP = wy_scan_pitch<VS>(), MT = KD / 16;
  constexpr int NJ = VS / 8, NP = VS / 16;  // 8-column tiles; pairs of them (one ldmatrix)
  constexpr int64_t kStage = wy_stage_bytes<KD, VS>();
  static_assert(R::shared % 128 == 0 && kStage % 128 == 0, "TMA needs 128 B alignment");
  constexpr bool kFp16 = std::is_same_v<E, __half>;
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t full[2];  // full[st]: stage st's bytes have landed
  // Stage st: record (W_hi, W_lo, P_hi, P_lo, scalars) | U0 slice [VS/16][64][16] fp32 | K, Q
  // raw, each [KD/8][64][8] (16-byte column pieces of the 64 rows: conflict-free ldmatrix, one
  // TMA box).
  auto st_rec = [&](int st) { return smem + st * kStage; };
  auto st_u0 = [&](int st) { return reinterpret_cast<float*>(smem + st * kStage + R::shared); };
  auto st_k = [&](int st) {
    return reinterpret_cast<E*>(smem + st * kStage + R::shared + C * VS * 4);
  };
  auto* Sh = reinterpret_cast<__nv_bfloat16*>(smem + 2 * kStage);  // [KD][SP] state split
  __nv_bfloat16* Sl = Sh + KD * SP;
  __nv_bfloat16* Uh = Sl + KD * SP;  // [C][SP] U split (read-out)
  __nv_bfloat16* Ul = Uh + C * SP;
  __nv_bfloat16* Xh = Ul + C * SP;  // [C][SP] diag(update scale) U split (state update)
  __nv_bfloat16* Xl = Xh + C * SP;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int nslices = p.V / VS;
  const int slice = int(blockIdx.x % nslices);
  const int hv = int((blockIdx.x / nslices) % p.HV);
  const int n = int(blockIdx.x / (unsigned(nslices) * p.HV));
  const int h = hv / (p.HV / p.H);
  const int V = p.V, c0 = slice * VS;
  const int64_t KV = int64_t(KD) * V;
  const StateSlot slot = state_slot(p, n, hv, KV);
  if (slot.skip) return;  // pool index -1: nothing read, nothing written
  const SeqRange sr = seq_range(p, n);
  const int nch = int((sr.len + C - 1) / C);
  E* obase = static_cast<E*>(p.o) + sr.b * p.os[0] + int64_t(hv) * p.os[2] + c0;
  const int64_t rec_bytes = p.ws_record_floats * 4;

  if (tid == 0) {
    mbar_init(&full[0], 1);
    mbar_init(&full[1], 1);
  }
  // Warps 0-3 hold the state in registers: key-row blocks mt = warp + 4 j (j = 0, 1;
  // mt < KD/16), every 8-column tile; element (j, nj, e) is row mt*16 + g + 8 (e / 2), column
  // nj*8 + 2 t4 + e % 2.
  const bool state_warp = warp < 4;
  float sacc[2][NJ][4] = {};
  auto store_state_split = [&](int j) {
    const int mt = warp + 4 * j;
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = mt * 16 + g + hr * 8, cc = nj * 8 + 2 * t4;
        uint32_t hi, lo;
        split_bf16x2(sacc[j][nj][2 * hr], sacc[j][nj][2 * hr + 1], hi, lo);
        *reinterpret_cast<uint32_t*>(Sh + r * SP + cc) = hi;
        *reinterpret_cast<uint32_t*>(Sl + r * SP + cc) = lo;
      }
  };
  if (state_warp)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (warp + 4 * j >= MT) continue;
      if (slot.in)
#pragma unroll
        for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int r = (warp + 4 * j) * 16 + g + hr * 8, cc = nj * 8 + 2 * t4;
            const float2 x = *reinterpret_cast<const float2*>(slot.in + int64_t(r) * V + c0 + cc);
            sacc[j][nj][2 * hr] = x.x, sacc[j][nj][2 * hr + 1] = x.y;
          }
      store_state_split(j);
    }
  __syncthreads();  // barriers initialised, state split visible

  // Chunk ch's tiles into stage st, completing on full[st], issued by thread 0 right after the
  // barrier that ends every read of that stage: the record's shared part (W, P, scalars) and
  // this slice's U0 by bulk copies, the K and Q tiles by one tensor copy each (rows past the
  // tensor's end arrive as zeros). Warp 0's lanes also ask L2 for chunk ch + kAhead's record and
  // K / Q rows (each slice of the head a share of the 128-byte lines), so that the copies find
  // them in L2 rather than DRAM.
  constexpr int kAhead = 3;
  auto issue = [&](int st, int ch) {
    const char* rec = ws + (chunk_slot(p, n, sr, ch) * p.HV + hv) * rec_bytes;
    mbar_expect_tx(&full[st], unsigned(R::shared + C * VS * 4 + 2 * C * KD * 2));
    bulk_load(st_rec(st), rec, unsigned(R::shared), &full[st]);
    bulk_load(st_u0(st), rec + R::shared + int64_t(c0) * C * 4, unsigned(C * VS * 4), &full[st]);
    const int t0 = int(sr.t0 + int64_t(ch) * C);
    tile_load(st_k(st), &kmap, t0, h, int(sr.b), &full[st]);
    tile_load(st_k(st) + C * KD, &qmap, t0, h, int(sr.b), &full[st]);
  };
  auto prefetch_l2 = [&](int cf) {
    const char* rf = ws + (chunk_slot(p, n, sr, cf) * p.HV + hv) * rec_bytes;
    constexpr int lines = int((R::shared + 127) / 128);
    for (int l = slice + nslices * lane; l < lines; l += nslices * 32)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(rf + l * 128));
    const int64_t tf = sr.t0 + int64_t(cf) * C;
    const int rows = int(sr.len - int64_t(cf) * C < C ? sr.len - int64_t(cf) * C : C);
    constexpr int lpr = (KD * 2 + 127) / 128;  // lines per row
    for (int l = slice + nslices * lane; l < 2 * rows * lpr; l += nslices * 32) {
      const int q = l / (rows * lpr), rem = l % (rows * lpr);
      const E* base = q ? static_cast<const E*>(p.q) + sr.b * p.qs[0] + (tf + rem / lpr) * p.qs[1] +
                              int64_t(h) * p.qs[2]
                        : static_cast<const E*>(p.k) + sr.b * p.ks[0] + (tf + rem / lpr) * p.ks[1] +
                              int64_t(h) * p.ks[2];
      asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(base) +
                                                    (rem % lpr) * 128));
    }
  };
  if (warp == 0)
    for (int cf = 1; cf < kAhead && cf < nch; ++cf) prefetch_l2(cf);
  if (nch > 0 && tid == 0) issue(0, 0);

  for (int ch = 0; ch < nch; ++ch) {
    const int st = ch & 1;
    const int64_t cs0 = int64_t(ch) * C;
    const int L = int(sr.len - cs0 < C ? sr.len - cs0 : C);
    const int64_t tb = sr.t0 + cs0;
    mbar_wait(&full[st], unsigned(ch >> 1) & 1u);
    if (L < C)  // a last chunk: rows past the sequence end may hold the next sequence's tokens
      for (int idx = tid; idx < 2 * (C - L) * (KD / 8); idx += kWyThreads) {
        const int q = idx / ((C - L) * (KD / 8)), rem = idx % ((C - L) * (KD / 8));
        const int i = L + rem / (KD / 8), piece = rem % (KD / 8);
        reinterpret_cast<uint4*>(st_k(st) + q * C * KD + piece * C * 8 + i * 8)[0] =
            make_uint4(0, 0, 0, 0);
      }
    __syncthreads();  // chunk ch's tiles visible to all; every thread is done with stage st ^ 1
    if (warp == 0 && ch + kAhead < nch) prefetch_l2(ch + kAhead);
    if (tid == 0 && ch + 1 < nch) issue(st ^ 1, ch + 1);
    const char* rec = st_rec(st);
    const auto* Wh = reinterpret_cast<const __nv_bfloat16*>(rec + R::wh);
    const auto* Wl = reinterpret_cast<const __nv_bfloat16*>(rec + R::wl);
    const auto* Ph = reinterpret_cast<const __nv_bfloat16*>(rec + R::ph);
    const auto* Pl = reinterpret_cast<const __nv_bfloat16*>(rec + R::pl);
    const float* sc = reinterpret_cast<const float*>(rec + R::sc);
    const float* U0 = st_u0(st);
    const E* Ks = st_k(st);
    const E* Qs = Ks + C * KD;
    const int mi = warp & 3;  // row block of U (warps 0-3) or of the read-out (warps 4-7)

    // Step 1. Warps 0-3: U = U0 - W S. Warps 4-7: O0 = diag(gamma qscale) Q S (kept in regs).
    float o0[NJ][4];
    if (warp < 4) {
      float d[NJ][3][4] = {};
#pragma unroll
      for (int ks = 0; ks < KD / 16; ++ks) {
        uint32_t ah[4], al[4];
        ldsm4(ah, Wh + frag_a(KP, mi * 16, ks * 16, lane));
        ldsm4(al, Wl + frag_a(KP, mi * 16, ks * 16, lane));
#pragma unroll
        for (int np = 0; np < NP; ++np) {
          uint32_t bh[4], bl[4];
          ldsm4_t(bh, Sh + frag_b_kn(SP, ks * 16, np * 16, lane));
          ldsm4_t(bl, Sl + frag_b_kn(SP, ks * 16, np * 16, lane));
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int nj = 2 * np + q;
            mma_bf16(d[nj][0], ah, bh[2 * q], bh[2 * q + 1]);
            mma_bf16(d[nj][1], ah, bl[2 * q], bl[2 * q + 1]);
            mma_bf16(d[nj][2], al, bh[2 * q], bh[2 * q + 1]);
          }
        }
      }
      const float w0 = sc[kWyScOff + mi * 16 + g], w1 = sc[kWyScOff + mi * 16 + g + 8];
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = mi * 16 + g + hr * 8, cc = nj * 8 + 2 * t4;
          const float2 u0 =
              *reinterpret_cast<const float2*>(U0 + (cc >> 4) * (C * 16) + i * 16 + (cc & 15));
          const float u_0 = u0.x - ((d[nj][0][2 * hr] + d[nj][1][2 * hr]) + d[nj][2][2 * hr]);
          const float u_1 =
              u0.y - ((d[nj][0][2 * hr + 1] + d[nj][1][2 * hr + 1]) + d[nj][2][2 * hr + 1]);
          const float w = hr ? w1 : w0;
          uint32_t hi, lo;
          split_bf16x2(u_0, u_1, hi, lo);
          *reinterpret_cast<uint32_t*>(Uh + i * SP + cc) = hi;
          *reinterpret_cast<uint32_t*>(Ul + i * SP + cc) = lo;
          split_bf16x2(w * u_0, w * u_1, hi, lo);
          *reinterpret_cast<uint32_t*>(Xh + i * SP + cc) = hi;
          *reinterpret_cast<uint32_t*>(Xl + i * SP + cc) = lo;
        }
    } else {
      float d[NJ][3][4] = {};
#pragma unroll
      for (int ks = 0; ks < KD / 16; ++ks) {
        uint32_t aq[4];
        ldsm4(aq, Qs + frag_a_pieces(mi * 16, ks * 16, lane));
        const RawFrag<E> a(aq);
#pragma unroll
        for (int np = 0; np < NP; ++np) {
          uint32_t bh[4], bl[4];
          ldsm4_t(bh, Sh + frag_b_kn(SP, ks * 16, np * 16, lane));
          ldsm4_t(bl, Sl + frag_b_kn(SP, ks * 16, np * 16, lane));
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int nj = 2 * np + q;
            mma_bf16(d[nj][0], a.hi, bh[2 * q], bh[2 * q + 1]);
            mma_bf16(d[nj][1], a.hi, bl[2 * q], bl[2 * q + 1]);
            if constexpr (kFp16) mma_bf16(d[nj][2], a.lo, bh[2 * q], bh[2 * q + 1]);
          }
        }
      }
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o0[nj][e] = sc[mi * 16 + g + (e >> 1) * 8] * ((d[nj][0][e] + d[nj][2][e]) + d[nj][1][e]);
    }
    __syncthreads();  // U / X split visible

    // Step 2. Warps 0-3: S <- gamma_C S + K^T X for their key-row blocks. Warps 4-7:
    // O = O0 + P U, written out.
    if (state_warp) {
      const float gend = sc[kWyGend];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int mt = warp + 4 * j;
        if (mt >= MT) continue;
#pragma unroll
        for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
          for (int e = 0; e < 4; ++e) sacc[j][nj][e] *= gend;
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks) {
          uint32_t ak[4];
          ldsm4_t(ak, Ks + frag_a_t_pieces(mt * 16, ks * 16, lane));
          const RawFrag<E> a(ak);
#pragma unroll
          for (int np = 0; np < NP; ++np) {
            uint32_t bh[4], bl[4];
            ldsm4_t(bh, Xh + frag_b_kn(SP, ks * 16, np * 16, lane));
            ldsm4_t(bl, Xl + frag_b_kn(SP, ks * 16, np * 16, lane));
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const int nj = 2 * np + q;
              mma_bf16(sacc[j][nj], a.hi, bh[2 * q], bh[2 * q + 1]);
              mma_bf16(sacc[j][nj], a.hi, bl[2 * q], bl[2 * q + 1]);
              if constexpr (kFp16) mma_bf16(sacc[j][nj], a.lo, bh[2 * q], bh[2 * q + 1]);
            }
          }
        }
        store_state_split(j);
      }
    } else {
      float d[NJ][3][4] = {};
      for (int ks = 0; ks <= mi; ++ks) {
        uint32_t ah[4], al[4];
        ldsm4(ah, Ph + frag_a(kWyPP, mi * 16, ks * 16, lane));
        ldsm4(al, Pl + frag_a(kWyPP, mi * 16, ks * 16, lane));
#pragma unroll
        for (int np = 0; np < NP; ++np) {
          uint32_t bh[4], bl[4];
          ldsm4_t(bh, Uh + frag_b_kn(SP, ks * 16, np * 16, lane));
          ldsm4_t(bl, Ul + frag_b_kn(SP, ks * 16, np * 16, lane));
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int nj = 2 * np + q;
            mma_bf16(d[nj][0], ah, bh[2 * q], bh[2 * q + 1]);
            mma_bf16(d[nj][1], ah, bl[2 * q], bl[2 * q + 1]);
            mma_bf16(d[nj][2], al, bh[2 * q], bh[2 * q + 1]);
          }
        }
      }
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = mi * 16 + g + hr * 8, cc = nj * 8 + 2 * t4;
          if (i >= L) continue;
          float x[2];
#pragma unroll
          for (int e = 0; e < 2; ++e)
            x[e] = o0[nj][2 * hr + e] +
                   ((d[nj][0][2 * hr + e] + d[nj][1][2 * hr + e]) + d[nj][2][2 * hr + e]);
          E2 pair;
          pair.x = Dtype<E>::from_float(x[0]);
          pair.y = Dtype<E>::from_float(x[1]);
          *reinterpret_cast<E2*>(obase + (tb + i) * p.os[1] + cc) = pair;
        }
    }
  }

  if (state_warp && slot.out)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (warp + 4 * j >= MT) continue;
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = (warp + 4 * j) * 16 + g + hr * 8, cc = nj * 8 + 2 * t4;
          *reinterpret_cast<float2*>(slot.out + int64_t(r) * V + c0 + cc) =
              make_float2(sacc[j][nj][2 * hr], sacc[j][nj][2 * hr + 1]);
        }
    }
#endif
}

/// The driver's tensor-map encoder (through the runtime: no libcuda link), or null.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

/// Tensor map of a raw key / query tensor [B, T, H, KD] (element strides st) whose box is one
/// 64-token tile of one head in the layout [KD/8][64][8]: dims (8 elements, token, 16-byte piece,
/// head, batch), box (8, 64, KD/8, 1, 1). False when the driver refuses it.
template <class E>
bool make_tile_map(CUtensorMap& m, const void* base, const int64_t (&st)[3], const KernelParams& p,
                   int KD) {
  const auto encode = tensor_map_encoder();
  if (!encode) return false;
  const int64_t B = p.cu_seqlens ? 1 : p.N;
  const cuuint64_t dims[5] = {8, cuuint64_t(p.T), cuuint64_t(KD / 8), cuuint64_t(p.H),
                              cuuint64_t(B)};
  const cuuint64_t strides[4] = {cuuint64_t(st[1]) * 2, 16, cuuint64_t(st[2]) * 2,
                                 cuuint64_t(st[0]) * 2};
  const cuuint32_t box[5] = {8, cuuint32_t(kFC), cuuint32_t(KD / 8), 1, 1};
  const cuuint32_t elem[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType dt = std::is_same_v<E, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(&m, dt, 5, const_cast<void*>(base), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class E, int KD, int VS>
cudaError_t launch_scan_wy(const KernelParams& p, cudaStream_t stream, const char* ws,
                           const CUtensorMap& kmap, const CUtensorMap& qmap) {
  constexpr int64_t bytes = wy_scan_smem_bytes<KD, VS>();
  const cudaError_t e = cudaFuncSetAttribute(
      chunk_wy_scan_kernel<E, KD, VS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / VS);
  chunk_wy_scan_kernel<E, KD, VS>
      <<<dim3(unsigned(blocks)), kWyThreads, size_t(bytes), stream>>>(p, ws, kmap, qmap);
  return cudaGetLastError();
}

template <class E, int KD>
cudaError_t launch_chunk_wy_kd(const KernelParams& p, cudaStream_t stream, int sms,
                               int64_t max_smem, int force_vs, bool& ran) {
  const int64_t prep_bytes = wy_prep_smem_bytes<KD>(p.V);
  if (prep_bytes > max_smem || wy_scan_smem_bytes<KD, 16>() > max_smem) return cudaSuccess;
  CUtensorMap kmap, qmap;
  if (!make_tile_map<E>(kmap, p.k, p.ks, p, KD) || !make_tile_map<E>(qmap, p.q, p.qs, p, KD))
    return cudaSuccess;  // the driver refuses the layout: the TF32 path runs instead
  // Value slice: 32 columns halve the per-column traffic of the scan (every slice reads the
  // chunk's record and K / Q tiles) but also the number of blocks; take it while it still leaves
  // about one block per multiprocessor.
  bool wide = p.V % 32 == 0 && wy_scan_smem_bytes<KD, 32>() <= max_smem &&
              int64_t(p.N) * p.HV * (p.V / 32) >= sms / 2;
  ran = true;
  cudaError_t e = cudaFuncSetAttribute(
      chunk_wy_prep_kernel<E, KD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prep_bytes));
  if (e != cudaSuccess) return e;
  char* ws = reinterpret_cast<char*>(p.ws);
  chunk_wy_prep_kernel<E, KD><<<dim3(unsigned(p.max_chunks), unsigned(p.HV), unsigned(p.N)),
                                kWyThreads, size_t(prep_bytes), stream>>>(p, ws);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  if (force_vs == 32 && p.V % 32 == 0 && wy_scan_smem_bytes<KD, 32>() <= max_smem) wide = true;
  if (force_vs == 16) wide = false;
  return wide ? launch_scan_wy<E, KD, 32>(p, stream, ws, kmap, qmap)
              : launch_scan_wy<E, KD, 16>(p, stream, ws, kmap, qmap);
}

/// Runs the WY path when it applies: bf16 / fp16, sm_90, workspace given, K in {64, 96, 128},
/// V a multiple of 16, shared memory fits, the driver encodes the K / Q tensor maps. `ran` says
/// whether it did. force_vs (16 or 32; 0 = choose) pins the scan's value slice, for tests.
template <class E>
cudaError_t launch_chunk_wy(const KernelParams& p, cudaStream_t stream, int cc_major, int sms,
                            int64_t max_smem, int force_vs, bool& ran) {
  ran = false;
  if constexpr (std::is_same_v<E, float>) {
    return cudaSuccess;
  } else {
    if (cc_major < 9 || !p.ws || p.max_chunks <= 0 || p.N > 65535 || p.HV > 65535 || p.V % 16 != 0)
      return cudaSuccess;
    switch (p.K) {
      case 64: return launch_chunk_wy_kd<E, 64>(p, stream, sms, max_smem, force_vs, ran);
      case 96: return launch_chunk_wy_kd<E, 96>(p, stream, sms, max_smem, force_vs, ran);
      case 128: return launch_chunk_wy_kd<E, 128>(p, stream, sms, max_smem, force_vs, ran);
      default: return cudaSuccess;
    }
  }
}

}  // namespace kla::kernels
