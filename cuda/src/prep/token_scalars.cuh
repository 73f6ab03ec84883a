// The preps' per-chunk addressing and per-token scalars (shared by the TF32 and the WY prep):
// which chunk a block prepares, its tokens' eta and log decay, the normalised-key coefficients
// (kscale, beta), the read-out scale and the inclusive cumulative log decay G of the chunk.
#pragma once

#include "common/kernel_common.cuh"

namespace kla::kernels {

/// What a preparation block (grid: chunk, value head, sequence) works on: chunk c of sequence n
/// for value head hv (query / key head h), its L tokens from row tb of batch row sr.b; L = 0
/// when the chunk lies past the sequence's end.
struct PrepTile {
  int c, hv, n, h, L;
  SeqRange sr;
  int64_t tb;
};
/// t's L and tb from its chunk t.c and sequence range t.sr.
__device__ __forceinline__ void prep_tile_rows(PrepTile& t) {
  const int64_t cs = int64_t(t.c) * kChunk;
  t.L = cs >= t.sr.len ? 0 : int(t.sr.len - cs < kChunk ? t.sr.len - cs : kChunk);
  t.tb = t.sr.t0 + cs;
}
/// Chunk c of sequence n for value head hv.
__device__ __forceinline__ PrepTile prep_tile_at(const KernelParams& p, int c, int hv, int n) {
  PrepTile t;
  t.c = c, t.hv = hv, t.n = n;
  t.h = key_head(p, t.hv);
  t.sr = seq_range(p, t.n);
  prep_tile_rows(t);
  return t;
}
/// The tile of the chunk after t's, same sequence and heads (L = 0 past the sequence's end).
__device__ __forceinline__ PrepTile next_chunk_tile(PrepTile t) {
  ++t.c;
  prep_tile_rows(t);
  return t;
}
/// The block's tile: chunk blockIdx.x, value head blockIdx.y, sequence blockIdx.z.
__device__ __forceinline__ PrepTile prep_tile(const KernelParams& p) {
  return prep_tile_at(p, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z));
}

/// Threads [0, kChunk) load their token's eta and log decay (0 past L) into bet / Gv, which
/// chunk_token_scalars reads after a barrier: issued at the prep's start, their latency overlaps
/// the tile loads.
__device__ __forceinline__ void token_scalars_preload(const KernelParams& p, const SeqRange& sr,
                                                      int64_t tb, int L, int hv, float* bet,
                                                      float* Gv) {
  const int i = threadIdx.x;
  if (i < kChunk) {
    bet[i] = i < L ? token_eta(p, sr.b, tb + i, hv) : 0.f;
    Gv[i] = i < L ? token_log_decay(p, sr.b, tb + i, hv) : 0.f;
  }
}

/// Warp 0's inclusive scan of a chunk's log decays Gv[0 .. 64) in place (the cumulative log decay
/// G), in a fixed order: two tokens a lane, then the warp's shuffle tree. lane = threadIdx.x % 32.
__device__ __forceinline__ void chunk_log_decay_scan(float* Gv, int lane) {
  static_assert(kChunk == 64, "two tokens a lane");
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

/// Per-token scalars of one chunk (rows [0, kChunk), rows >= L padding): kscale, vscale, beta,
/// the read-out scale and the inclusive cumulative log decay G, into shared arrays (token_coef). ks
/// / qs are the raw key / query tiles (pitch KP; with q_sw128 the query tile in the 128-byte
/// swizzle, kmajor_sw128_offset); kn2, when given, holds the squared key norms already (the
/// diagonal of K K^T), and query norms are summed only for the l2-norm read-out. bet / Gv hold the
/// tokens' eta / log decay on entry (token_scalars_preload, visible to every thread). Ends with a
/// barrier. All kPrepThreads threads call it.
template <class E>
__device__ __forceinline__ void chunk_token_scalars(const KernelParams& p, int L, const E* ks,
                                                    const E* qs, int KP, int K, float* ksc,
                                                    float* vsc, float* bet, float* qsc, float* Gv,
                                                    const float* kn2 = nullptr,
                                                    bool q_sw128 = false) {
  constexpr int C = kChunk;
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
          const int qi = q_sw128 ? kmajor_sw128_offset(i, r, kChunk) / 2 : i * KP + r;
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
    const TokenCoef tc = i < L ? token_coef(n2, eta, p) : TokenCoef{0.f, 0.f, 0.f};
    if (!per_warp || lane == 0) {
      ksc[i] = tc.kscale;
      vsc[i] = tc.vscale;
      bet[i] = tc.beta;
      qsc[i] = readout_scale(qn2, p);
      Gv[i] = gl;
    }
  }
  __syncthreads();
  if (warp == 0) chunk_log_decay_scan(Gv, lane);
  __syncthreads();
}

}  // namespace kla::kernels
