// Backward, pass 3 as segments (sm_90a; bf16 storage, arithmetic FAST, K = V = 128, saved states;
// BwdParams::chain_seg > 0): the state-gradient chain of bwd/bwd_state_backward_bf16.cuh (its file
// comment has the recurrence and the parts of each product) cut into segments of chain_seg chunks
// that run side by side, each started a few chunks into the next segment from zero, where the
// decay certifies that what that drops is below fp32's rounding. Two kernels:
//
// bwd_chain_windows_kernel, a block per (value head, sequence): for each segment [b0, b1) the chunk
// e > b1 where its chain starts. The state gradient entering chunk b1 is
//   dS(b1) = Phi^T dS(e) + (the outputs' share of chunks b1 .. e - 1),
// Phi^T the chunks' maps, each diag(alpha)(I - beta k^ k^^T) a token; where every beta |k^|^2 lies
// in [0, 2] they are contractions, so |Phi^T dS(e)|_F <= c |dS(e)|_F with c = prod gamma_C over the
// window (reference/include/kla/ref/segment_backward.hpp state_gradient_contraction, proofs_check
// seg.grad_truncation). |dS(e)|_F has the bound B(e) = sum over chunks c >= e of (prod gamma
// between) L_c, plus that decay times |dS_T|_F, where L_c = sum_i |q^_i| |dy_i| bounds the chunk's
// own outputs' share (each rank-one gradient q^_i dy_i^T reaches the chunk's start through
// contractions): B(c) = L_c + gamma_c B(c + 1), B(N) = |dS_T|_F. The window is the shortest with
//   c B(e) <= 2^-24 B(b1),
// so the share dropped is below fp32's rounding of the sum B(b1) bounds (the chain's own products
// err about 2^-16 of it, bwd_state_backward_bf16.cuh), or e = N, the sequence's end, where the
// chain starts from dS_T exactly. A head where some segment has no such window within
// kBwdChainMaxWarmup segments' chunks (weak or no decay; a beta |k^|^2 outside [0, 2]) is left
// whole to bwd_state_backward_bf16_kernel, launched after this pass: its blocks of certified heads
// leave at once.
//
// bwd_state_grad_segments_kernel, a block of two warpgroups per (value head, segment, sequence),
// one block a multiprocessor: warpgroup w holds dS[:, 64 w ..] (128 keys x 64 value columns) in
// fp32 registers, from chunk e - 1 down to b0, per chunk
//   X = M^T dY, K dS (dS hi, lo), dU = diag(Gamma_C. ks) K dS + X     (wgmma, 24 a warpgroup)
//   dS <- gamma_C dS - W^T dU + Q^T D, D = diag(qs e^G) dY split      (wgmma, 40 a warpgroup)
// with the operand parts of the landed scan (every product the same sum, in fp32, the parts into
// one accumulator). It reads the prep's record tiles (bwd_layout.hpp) by 16-byte cp.async into
// 128-byte-swizzled panels (the wgmma layout, arch/wgmma.cuh): the keys' group (K, M, dY, the
// scalars) while the update runs, W's (W, Q) while the next X and K dS run. It writes dS and dU to
// the record for the chunks of its own segment (not the warm-up's), as the landed scan does, and
// d(initial state) from the first segment.
#pragma once

#include <cstdint>

#include "arch/wgmma.cuh"
#include "bwd/bwd_warp_tile_bf16.cuh"
#include "layout/chunk_geometry.hpp"

namespace kla::kernels {

/// The share of B(b1) a segment's warm-up may drop (bwd_chain_windows_kernel).
constexpr float kChainDropBound = 0x1p-24f;
/// The longest warm-up: this many segments' chunks.
constexpr int kBwdChainMaxWarmup = 2;
/// The window kernel's ring of B and gamma over the chunks above a boundary: a tile of
/// kBwdChainThreads chunks is written while its boundaries read up to a longest window above
/// them, so the ring holds both, and is a power of two.
constexpr int kChainRing = 512;
static_assert(kChainRing >= kBwdChainThreads + kBwdChainMaxWarmup * kBwdChainMaxSegment &&
                  (kChainRing & (kChainRing - 1)) == 0,
              "the ring holds a tile and the longest window above it, indexed by a mask");

/// The suffix maps of a tile of chunks, by the block (kBwdChainThreads threads, thread k holding
/// chunk top - 1 - k): B(c) = L_c + gamma_c B(c + 1) composed from the tile's top down, so that
/// B(top - 1 - k) = b + a B(top). Returns (a, b) of the thread's chunk: an inclusive scan of the
/// affine maps (gamma, L), (a1, b1) then (a2, b2) -> (a2 a1, b2 + a2 b1), over the lanes by
/// shuffles and over the warps through `wa`, `wb` ([kBwdChainThreads / 32] each). fp32; the order
/// differs from a serial walk's by rounding only (the window test's margin is far larger).
__device__ __forceinline__ float2 bwd_chain_suffix_maps(float gamma, float ell, float* wa,
                                                        float* wb) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  float a = gamma, b = ell;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float pa = __shfl_up_sync(0xffffffffu, a, off), pb = __shfl_up_sync(0xffffffffu, b, off);
    if (lane >= off) {
      b = fmaf(a, pb, b);
      a *= pa;
    }
  }
  if (lane == 31) wa[warp] = a, wb[warp] = b;
  __syncthreads();
  // the warps above this one (lower k), composed in order
  float ca = 1.f, cb = 0.f;
  for (int w = 0; w < warp; ++w) {
    cb = fmaf(wa[w], cb, wb[w]);
    ca *= wa[w];
  }
  __syncthreads();  // wa, wb read: the next tile may write them
  return make_float2(a * ca, fmaf(a, cb, b));
}

template <class E>
__global__ void __launch_bounds__(kBwdChainThreads) bwd_chain_windows_kernel(const BwdParams bp) {
  constexpr int C = kChunk, KV = kBwdCompiledHeadDim * kBwdCompiledHeadDim,
                kTile = kBwdChainThreads;
  const KernelParams& p = bp.f;
  const int hv = int(blockIdx.x), n = int(blockIdx.y), tid = int(threadIdx.x);
  const SeqRange sr = seq_range(p, n);
  const int nch = int((sr.len + C - 1) / C);
  if (nch == 0) return;
  const int seg = bp.chain_seg, wmax = kBwdChainMaxWarmup * seg;  // seg a power of two
  const BwdRecord R(kBwdCompiledHeadDim, kBwdCompiledHeadDim);
  float* const rec0 = bwd_record(bp, n, sr, 0, hv);
  const int64_t rstep = bwd_record_step(bp);
  auto chunk_row = [&](int c) { return rec0 + c * rstep + R.sc + kScChunk * C; };
  __shared__ float wa[kBwdChainThreads / 32], wb[kBwdChainThreads / 32];
  __shared__ float ring_b[kChainRing], ring_g[kChainRing];  // B(c), gamma_c of the chunks above
  __shared__ float b_top;                                   // B(top): the tile's above it
  __shared__ int bad_hi;  // the highest chunk whose bounds fail (B is infinite at and below it)
  // |dS_T|_F: each thread's squares in index order, the warps' sums, then theirs in order.
  float s2 = 0.f;
  if (bp.dht) {
    const float* d = bp.dht + (int64_t(n) * p.HV + hv) * KV;
    for (int i = tid; i < KV; i += kBwdChainThreads) s2 = fmaf(d[i], d[i], s2);
  }
  s2 = warp_sum(s2);
  if ((tid & 31) == 0) wa[tid >> 5] = s2;
  __syncthreads();
  if (tid == 0) {
    float b = 0.f;
    for (int w = 0; w < kBwdChainThreads / 32; ++w) b += wa[w];
    b_top = sqrtf(b);
    bad_hi = -1;
  }
  __syncthreads();        // b_top, bad_hi set; wa read
  bool certified = true;  // this thread's boundaries'
  for (int top = nch; top > 0; top -= kTile) {
    const int c = top - 1 - tid;
    float gamma = 1.f, ell = 0.f;  // past the sequence's start: the identity map
    if (c >= 0) {
      const float* cb = chunk_row(c);
      gamma = cb[0];
      ell = cb[kChunkBound] + cb[kChunkBound + 1];
      // a NaN fails every comparison: not ok
      const bool ok = cb[kChunkBound + 4] >= 0.f && cb[kChunkBound + 5] >= 0.f &&
                      cb[kChunkBound + 2] <= 2.f && cb[kChunkBound + 3] <= 2.f;
      if (!ok) atomicMax(&bad_hi, c);
    }
    const float2 m = bwd_chain_suffix_maps(gamma, ell, wa, wb);  // its barriers order bad_hi
    const float bt = b_top;
    const bool suffix_ok = c > bad_hi;
    const float b = suffix_ok ? fmaf(m.x, bt, m.y) : INFINITY;  // B(c)
    if (c >= 0) {
      ring_b[c & (kChainRing - 1)] = b;
      ring_g[c & (kChainRing - 1)] = gamma;
    }
    __syncthreads();                            // the tile's ring entries; b_top read
    if (tid == kTile - 1 && c >= 0) b_top = b;  // B(top - kTile): the next tile's B(top)
    if (c > 0 && (c & (seg - 1)) == 0) {
      // c = b1 of the segment before: the shortest window, or none
      int e = -1;
      float decay = 1.f;  // c over chunks b1 .. ee - 1
      for (int ee = c + 1; ee <= min(c + wmax, nch); ++ee) {
        decay *= ring_g[(ee - 1) & (kChainRing - 1)];
        if (ee == nch ||
            (suffix_ok && decay * ring_b[ee & (kChainRing - 1)] <= kChainDropBound * b)) {
          e = ee;
          break;
        }
      }
      chunk_row(c - seg)[kChunkWindow] = __int_as_float(e);
      certified = certified && e > 0;
    }
    __syncthreads();  // the windows' reads of the ring done; b_top written
  }
  certified = __syncthreads_and(certified) != 0;
  if (tid == 0) {
    chunk_row(((nch - 1) / seg) * seg)[kChunkWindow] = __int_as_float(nch);  // the last segment
    chunk_row(0)[kChunkCertified] = certified ? 1.f : 0.f;
  }
}

/// Whether the windows kernel certified every segment of the head whose chunk-0 record is rec0
/// (nch > 0).
__device__ __forceinline__ bool bwd_chain_certified(const float* rec0) {
  constexpr BwdRecord R(kBwdCompiledHeadDim, kBwdCompiledHeadDim);
  return rec0[R.sc + kScChunk * kChunk + kChunkCertified] != 0.f;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace bwd_chain {

using bwd_bf16::bf16;
constexpr int C = kChunk, K = kBwdCompiledHeadDim, V = K, PB = K + 8, PBC = C + 8;
constexpr int VS = kBwdBf16Slice, PS = kBwdBf16SlicePitch;
constexpr int KB = 1024;
// Shared memory (bytes; every tile a multiple of 1024 B from the base): [C][K] and [C][V] tiles
// are two 64-column panels of 8 KB ([64 rows][128 B], swizzled), dS [K][V] two of 16 KB.
constexpr int kK = 0, kQ = 16 * KB, kWh = 32 * KB, kWl = 48 * KB, kMh = 64 * KB, kMl = 72 * KB,
              kDY = 80 * KB, kDSh = 96 * KB, kDSl = 128 * KB, kUh = 160 * KB, kUl = 176 * KB,
              kDh = 192 * KB, kDl = 208 * KB, kScal = 224 * KB;
static_assert(kScal + 3 * C * 4 == bwd_chain_smem(), "bwd_layout.hpp's size");

/// KS k-steps of 16 rows (M-major A, MN-major B: k along the tiles' rows, 2048 B a step).
template <int KS>
__device__ __forceinline__ void mma_rows(float (&d)[32], const char* a, const char* b) {
  const uint64_t ad = wgmma_desc_sw128(a, 8192), bd = wgmma_desc_sw128(b, 8192);
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    wgmma_ss<1, __nv_bfloat16, 1>(d, wgmma_desc_advance(ad, ks * 2048),
                                  wgmma_desc_advance(bd, ks * 2048));
}

/// Byte offset of element (row, col) of a bf16 tile of `rows` rows in 64-column swizzled panels.
/// (An m64n64 accumulator's d[4 j + 2 h + e] is its row 16 w + g + 8 h, column 8 j + 2 t + e: w
/// the warp of the warpgroup, g = lane / 4, t = lane % 4.)
__device__ __forceinline__ int sw(int row, int col, int rows) {
  return kla::layout::kmajor_sw128_offset(row, col, rows);
}

}  // namespace bwd_chain
#endif

template <class E>
__global__ void __launch_bounds__(kBwdChainThreads, 1)
    bwd_state_grad_segments_kernel(const BwdParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace bwd_chain;
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  const KernelParams& p = bp.f;
  // value heads fastest: a key head's value heads run side by side and share its K and Q in L2
  const int seg = bp.chain_seg, hv = int(blockIdx.x), r = int(blockIdx.y), n = int(blockIdx.z);
  const SeqRange sr = seq_range(p, n);
  const int nch = int((sr.len + C - 1) / C), b0 = r * seg;
  if (b0 >= nch) return;
  const BwdRecord R(K, V);
  float* const rec0 = bwd_record(bp, n, sr, 0, hv);
  if (!bwd_chain_certified(rec0)) return;  // bwd_state_backward_bf16_kernel's head
  const int64_t rstep = bwd_record_step(bp);
  const int b1 = min(b0 + seg, nch);
  const int e = KLA_MUTANT(bwd_chain_no_warmup)
                    ? b1
                    : __float_as_int(rec0[b0 * rstep + R.sc + kScChunk * C + kChunkWindow]);
  const int h = key_head(p, hv);
  // the raw keys and queries are in the key head's first value head's records
  const float* const kr0 = bwd_record_of_head(bp, rec0, hv, h * bp.group);

  extern __shared__ __align__(1024) char smem[];
  float* const Gs = reinterpret_cast<float*>(smem + kScal);
  float* const kss = Gs + C;
  float* const qss = kss + C;
  const int tid = int(threadIdx.x);
  // the warpgroup through a lane-0 shuffle: uniform to the compiler, which otherwise serialises
  // the wgmma of a branch on it
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wt = tid & 127, w4 = wt >> 5,
            g = (tid & 31) >> 2, t = tid & 3;

  // The keys' group of chunk ch: K, M hi + lo, dY (by value slice in the record), G, ks, qs.
  auto issue_keys = [&](int ch) {
    const float* rec = rec0 + ch * rstep;
    const bf16* rb = reinterpret_cast<const bf16*>(rec);
    const bf16* kb = reinterpret_cast<const bf16*>(kr0 + ch * rstep);
    for (int idx = tid; idx < 3 * 1024 + 48; idx += kBwdChainThreads) {
      const void* src;
      char* dst;
      if (idx < 1024) {  // K [64][128]: row idx / 16, piece idx % 16
        const int i = idx >> 4, q = idx & 15;
        src = kb + R.b_kr + i * PB + 8 * q;
        dst = smem + kK + sw(i, 8 * q, 64);
      } else if (idx < 2048) {  // M hi, lo: rows 0-63, 64-127 of [2C][PBC]
        const int rr = (idx - 1024) >> 3, q = idx & 7;
        src = rb + R.b_mh + rr * PBC + 8 * q;
        dst = smem + (rr < C ? kMh : kMl) + sw(rr & (C - 1), 8 * q, 64);
      } else if (idx < 3072) {  // dY slice s [C][PS]: 4 pieces a row
        const int u = idx - 2048, s = u >> 8, i = (u >> 2) & 63, q = u & 3;
        src = rb + R.b_do + (s * C + i) * PS + 8 * q;
        dst = smem + kDY + sw(i, VS * s + 8 * q, 64);
      } else {  // G, kscale, qscale: 16 pieces each
        const int u = idx - 3072, which = u >> 4, q = u & 15;
        const int row = which == 0 ? kScG : which == 1 ? kScKscale : kScQscale;
        src = rec + R.sc + row * C + 4 * q;
        dst = smem + kScal + (which * C + 4 * q) * 4;
      }
      cp16(dst, src, true);
    }
    cp_commit();
  };
  // W's group of chunk ch: W hi, lo and the raw queries.
  auto issue_w = [&](int ch) {
    const bf16* rb = reinterpret_cast<const bf16*>(rec0 + ch * rstep);
    const bf16* kb = reinterpret_cast<const bf16*>(kr0 + ch * rstep);
    for (int idx = tid; idx < 3 * 1024; idx += kBwdChainThreads) {
      const int which = idx >> 10, i = (idx >> 4) & 63, q = idx & 15;
      const bf16* src = which == 2 ? kb + R.b_qr : rb + (which == 0 ? R.b_wh : R.b_wl);
      const int base = which == 0 ? kWh : which == 1 ? kWl : kQ;
      cp16(smem + base + sw(i, 8 * q, 64), src + i * PB + 8 * q, true);
    }
    cp_commit();
  };

  // dS: rows 64 mt + 16 w4 + g + 8 h (keys), columns 64 wg + 8 j + 2 t + e (values); s[mt][4 j +
  // x] is element state_at(mt, j, x) of the head's [K][V] fp32 state gradient (dS_T, dS_0).
  float s[2][32];
  const int64_t head = int64_t(n) * p.HV + hv, KV = int64_t(K) * V;
  auto state_at = [&](int mt, int j, int x) {  // the column summed in int: one 64-bit add
    const int row = 64 * mt + 16 * w4 + g + 8 * (x >> 1), col = 64 * wg + 8 * j + 2 * t + (x & 1);
    return head * KV + int64_t(row) * V + col;
  };
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x)
        s[mt][4 * j + x] = e == nch && bp.dht ? bp.dht[state_at(mt, j, x)] : 0.f;
  // dS split into its two bf16 parts, the B operand of K dS ([K][V] panels of 128 rows).
  auto store_ds = [&]() {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = 64 * mt + 16 * w4 + g + 8 * hh, col = 64 * wg + 8 * j + 2 * t;
          const int at = sw(row, col, K);
          bwd_bf16::split_bf16x2(s[mt][4 * j + 2 * hh], s[mt][4 * j + 2 * hh + 1],
                                 *reinterpret_cast<__nv_bfloat162*>(smem + kDSh + at),
                                 *reinterpret_cast<__nv_bfloat162*>(smem + kDSl + at));
        }
    fence_proxy_async_shared();
  };

  issue_keys(e - 1);
  issue_w(e - 1);
  store_ds();
  for (int ch = e - 1; ch >= b0; --ch) {
    const bool own = ch < b1;
    bf16* const rb = reinterpret_cast<bf16*>(rec0 + ch * rstep);
    cp_wait<1>();  // the keys' group of chunk ch (W's may still be in flight)
    fence_proxy_async_shared();
    __syncthreads();
    float xa[32], ua[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) xa[i] = ua[i] = 0.f;
    wgmma_reg_fence(xa);
    wgmma_reg_fence(ua);
    wgmma_fence();
    // X = M^T dY: M as the M-major A (k = M's rows), dY's panel wg as the MN-major B; hi, then lo
    mma_rows<4>(xa, smem + kMh, smem + kDY + wg * 8 * KB);
    mma_rows<4>(xa, smem + kMl, smem + kDY + wg * 8 * KB);
    {  // K dS: the raw keys K-major (k = keys, two 64-key panels), dS's panel MN-major; hi, lo
      const uint64_t ad = wgmma_desc_sw128(smem + kK);
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        const uint64_t bd = wgmma_desc_sw128(smem + (part ? kDSl : kDSh) + wg * 16 * KB, 8192);
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks)
          wgmma_ss<0, __nv_bfloat16, 1>(ua,
                                        wgmma_desc_advance(ad, (ks >> 2) * 8192 + (ks & 3) * 32),
                                        wgmma_desc_advance(bd, ks * 2048));
      }
    }
    wgmma_commit();
    // Meanwhile: D = diag(qs e^G) dY split (the warpgroup's panel), and dS (the gradient of chunk
    // ch's outgoing state, its hi part: bf16 rounded to nearest) to the record.
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = wt + 128 * k, row = idx >> 3, q = idx & 7;
      const int at = wg * 8 * KB + sw(row, 8 * q, 64);
      const float f = qss[row] * expf(Gs[row]);
      const uint4 raw = *reinterpret_cast<const uint4*>(smem + kDY + at);
      const uint32_t* el = reinterpret_cast<const uint32_t*>(&raw);
      uint4 hi4, lo4;
      uint32_t* hi = reinterpret_cast<uint32_t*>(&hi4);
      uint32_t* lo = reinterpret_cast<uint32_t*>(&lo4);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float2 y = Dtype<bf16>::unpack2(el[x]);
        __nv_bfloat162 bh, bl;
        bwd_bf16::split_bf16x2(f * y.x, f * y.y, bh, bl);
        hi[x] = *reinterpret_cast<uint32_t*>(&bh);
        lo[x] = *reinterpret_cast<uint32_t*>(&bl);
      }
      *reinterpret_cast<uint4*>(smem + kDh + at) = hi4;
      *reinterpret_cast<uint4*>(smem + kDl + at) = lo4;
    }
    if (own)
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int idx = wt + 128 * k, key = idx >> 3, q = idx & 7, col = 64 * wg + 8 * q;
        *reinterpret_cast<uint4*>(rb + R.b_ds + int64_t(key) * V + col) =
            *reinterpret_cast<const uint4*>(smem + kDSh + sw(key, col, K));
      }
    wgmma_wait<0>();
    wgmma_reg_fence(xa);
    wgmma_reg_fence(ua);
    // dU = Gamma_Ci ks_i (K dS)_i + X_i: to the record in bf16 (own chunks), -dU split for the
    // update (the warpgroup's panel of [C][V]).
    const float gC = expf(Gs[C - 1]);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = 16 * w4 + g + 8 * hh;
      const float f = expf(Gs[C - 1] - Gs[i]) * kss[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = 64 * wg + 8 * j + 2 * t;
        const float x = fmaf(f, ua[4 * j + 2 * hh], xa[4 * j + 2 * hh]),
                    y = fmaf(f, ua[4 * j + 2 * hh + 1], xa[4 * j + 2 * hh + 1]);
        if (own)
          *reinterpret_cast<uint32_t*>(rb + R.b_du + int64_t(i) * V + col) = round_bf16x2(x, y);
        const int at = sw(i, col, 64);
        bwd_bf16::split_bf16x2(-x, -y, *reinterpret_cast<__nv_bfloat162*>(smem + kUh + at),
                               *reinterpret_cast<__nv_bfloat162*>(smem + kUl + at));
      }
    }
    fence_proxy_async_shared();
    cp_wait<0>();  // W's group of chunk ch
    fence_proxy_async_shared();
    __syncthreads();  // -dU, D and W's group visible; the keys' group read by every warpgroup
    if (ch > b0) issue_keys(ch - 1);
    // dS <- gamma_C dS - W^T dU + Q^T D: W's and Q's panel mt as the M-major A (rows = keys
    // 64 mt ..), -dU and D's panel wg as the MN-major B; W hi dU hi, hi lo, lo hi, then Q D hi, lo
    const float gCd = KLA_MUTANT(bwd_carry_no_gamma) ? 1.f : gC;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int i = 0; i < 32; ++i) s[mt][i] *= gCd;
      wgmma_reg_fence(s[mt]);
    }
    wgmma_fence();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int pa = mt * 8 * KB, pb = wg * 8 * KB;
      mma_rows<4>(s[mt], smem + kWh + pa, smem + kUh + pb);
      mma_rows<4>(s[mt], smem + kWh + pa, smem + kUl + pb);
      mma_rows<4>(s[mt], smem + kWl + pa, smem + kUh + pb);
      mma_rows<4>(s[mt], smem + kQ + pa, smem + kDh + pb);
      mma_rows<4>(s[mt], smem + kQ + pa, smem + kDl + pb);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) wgmma_reg_fence(s[mt]);
    store_ds();
    __syncthreads();  // W's group, -dU and D read by every warpgroup
    if (ch > b0) issue_w(ch - 1);
  }
  if (b0 == 0 && bp.dh0)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) bp.dh0[state_at(mt, j, x)] = s[mt][4 * j + x];
#else
  __trap();  // launched only where the device runs the sm_90a image (bwd_launch.cuh)
#endif
}

}  // namespace kla::kernels
