// The tensor-core floor of a fused chunkwise backward (issue 25's goals; docs/prefill_notes.md,
// round 2 session 43): what one kernel of four warpgroups per (segment, value head), walking its
// chunks from last to first with the state gradient held on chip, would take per (chunk, value
// head) item at bf16, K = V = 128, C = 64, counting its products, the epilogues on the chain's
// path, its hand-offs and its global traffic. A timing diagnostic built as kla_fused_bwd_floor
// where the build has an sm_90a image; it needs a compute capability 9.0 GPU (elsewhere it says so
// and exits 0). The operand values are not meaningful (tiles alias one another inside 208 KB of
// shared memory and every B operand is described K-major): only the instruction stream, its
// dependences and the bytes moved are those of the design.
//
// Per chunk (docs/prefill_notes.md has the math and the count):
//   warpgroups 0, 1 (the state-gradient chain; each the 128 keys x its 64 value columns of dS
//   in fp32 registers): X = M^T dY; dS written split; dU = X + K_G dS; dU written split;
//   dS = gamma dS + Q^T D dY - W^T dU. Parts (kParts = 2, the FAST contract of the landed
//   kernels): M, dS, D dY two bf16 parts, the update hi hi + hi lo + lo hi; kParts = 1: one part
//   each (the peers' arithmetic).
//   warpgroups 2, 3 (the input gradients, one chunk behind the chain; each its 64 key columns):
//   dR = A^-T dU; dY U^T, Q K^T (warpgroup 2) or dR U^T, K K^T (3) with the gate epilogue (Pm, Z);
//   dq = e^G (dY S^T) + Pm K; dk = [Gamma U | -e^G beta dR] [dS ; S]^T + Pm^T Q + Z K + Z^T K;
//   dv; and two chunks ahead the chain's operands W = A^-1 diag(.) K (A^-1 saved by the forward,
//   kParts parts), M (warpgroup 2) and D dY, Gamma U (warpgroup 3), after the chunk's inputs
//   (K, Q, dO, U, A^-1 hi + lo, S: 112 KB) arrive by cp.async.
// Hand-offs by named barriers (bar.arrive / bar.sync, double-buffered): FULL (dS, dU of a chunk
// ready), EMPTY (the gradients done with them), WMREADY / WMEMPTY (the chain's W, M, D dY).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "arch/copy.cuh"
#include "arch/split.cuh"
#include "arch/wgmma.cuh"
#include "layout/chunk_geometry.hpp"
#include "sm90_device.hpp"

using namespace kla::kernels;
using kla::layout::kmajor_sw128_offset;  // the wgmma operands' 128-byte swizzle

namespace {

constexpr int kThreads = 512, KB = 1024, kSmem = 208 * KB, kInBytes = 128 * KB, kOutBytes = 48 * KB;
// Shared memory (bytes): the chunk's inputs (V lands over the chain's dS: an alias); the chain's
// tiles; W, M, D dY over the inputs; the gradients' dR, Pm, Z over the chain's (aliases: the values
// are not meaningful).
constexpr int kK = 0, kQ = 16 * KB, kDO = 32 * KB, kU = 48 * KB, kAih = 64 * KB, kAil = 72 * KB,
              kS = 80 * KB, kV = 112 * KB;
constexpr int kDSh = 112 * KB, kDSl = 144 * KB, kDUh = 176 * KB, kDUl = 192 * KB;
constexpr int kWh = 0, kWl = 16 * KB, kMh = 32 * KB, kMl = 40 * KB, kDYh = 48 * KB, kDYl = 64 * KB,
              kGU = 80 * KB;
constexpr int kDR = 112 * KB, kPc = 128 * KB, kPr = 136 * KB, kZc = 144 * KB, kZr = 152 * KB;
// Named barriers: 1, 2 the chain warpgroups' own; 3 the gradient pair's; then the hand-offs.
constexpr int kBarPair = 3, kFull = 4, kEmpty = 6, kWmReady = 8, kWmEmpty = 10;

/// wgmma units (m64n64k16, 65,536 multiply-adds) a chunk and value head issues.
constexpr int chain_units(int parts) {
  return 2 * (4 * parts + 8 * parts + 8 * parts + 8 * (parts == 2 ? 3 : 1));
}
constexpr int grads_units(int parts) {
  return 2 * (4 + 16 + 8 + 16 + 16 + 4 * parts) + 8;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/// KS k-steps of m64n64k16 into d: A at a (K-major 64 rows, or M-major when TA), B at b.
template <int KS, int TA>
__device__ __forceinline__ void mma64(float (&d)[32], const char* sm, int a, int b) {
  const uint64_t ad = wgmma_desc_sw128(sm + a, TA ? 8192 : 16), bd = wgmma_desc_sw128(sm + b);
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    wgmma_ss<TA, __nv_bfloat16>(
        d, wgmma_desc_advance(ad, TA ? ks * 2048 : (ks >> 2) * 8192 + (ks & 3) * 32),
        wgmma_desc_advance(bd, (ks >> 2) * 8192 + (ks & 3) * 32));
}

/// p, opaque to the compiler: addresses formed from it each chunk are not hoisted out of the
/// chunk loop into registers held across it (which would spill the accumulators).
__device__ __forceinline__ char* opaque(char* p) {
  asm volatile("" : "+l"(p));
  return p;
}

__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

__device__ __forceinline__ void zero(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
}
__device__ __forceinline__ void finish(float (&d)[32]) {
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_reg_fence(d);
}

/// An m64n64 accumulator (this warpgroup's rows 16 w + g (+8), columns 8 j + 2 t) scaled by a row
/// factor and written to a [64][64] tile at `hi` (and its lo part at `lo` when kSplit).
template <bool kSplit>
__device__ __forceinline__ void put_tile(char* sm, int hi, int lo, const float (&d)[32],
                                         const float* rowf) {
  const int wt = opaque(int(threadIdx.x & 127)), w = wt >> 5, g = (wt & 31) >> 2, t = wt & 3;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * w + g + 8 * h, at = kmajor_sw128_offset(row, 8 * j + 2 * t, 64);
      const float f = rowf[row];
      uint32_t a, b;
      split_bf16x2(f * d[4 * j + 2 * h], f * d[4 * j + 2 * h + 1], a, b);
      *reinterpret_cast<uint32_t*>(sm + hi + at) = a;
      if constexpr (kSplit) *reinterpret_cast<uint32_t*>(sm + lo + at) = b;
    }
}

/// An accumulator to global memory as bf16 pairs (coalesced a register at a time).
__device__ __forceinline__ void put_global(uint32_t* out, const float (&d)[32], int gtid) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
    out[j * 256 + gtid] = Dtype<__nv_bfloat16>::pack2(d[2 * j], d[2 * j + 1]);
}

template <int kParts, bool kChain, bool kGrads, bool kGlobal, bool kAhead>
__device__ void fused_floor(const char* in, uint32_t* out, int chunks, int warm,
                            long long* cycles) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ float scal[8][64];  // G, beta, e^G, Gamma_C, k and q scales, row parts
  // the warpgroup index through a lane-0 shuffle: warp-uniform to the compiler, which otherwise
  // serialises the wgmma of a branch on it
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x >> 7), 0);
  const int wt = threadIdx.x & 127, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3, w = wt >> 5;
  scal[threadIdx.x >> 6][threadIdx.x & 63] = 0.5f;  // kThreads = 8 x 64 entries
  __syncthreads();
  const long long t0 = clock64();
  const int64_t blk = blockIdx.x;
  // `warm` chain steps before the segment's own chunks (the warm-up of a truncated fold: the
  // next segment's first chunks, chain and operands only), then `chunks` whole steps
  const int steps = chunks + warm;
  if (wg < 2) {  // ---- the state-gradient chain: dS[:, 64 wg ..] in registers
    float ds[2][32], du[32];
    zero(ds[0]);
    zero(ds[1]);
    for (int i = 0; i < steps; ++i) {
      char* const sm = opaque(smem);
      const int b = i & 1;
      if (i >= 2) named_bar_sync(kEmpty + b, kThreads);
      named_bar_sync(kWmReady + b, kThreads);
      zero(du);
      if constexpr (kChain) {
        wgmma_fence();
        mma64<4, 1>(du, sm, kMh, kDO + wg * 8192);  // X = M^T dY
        if constexpr (kParts == 2) mma64<4, 1>(du, sm, kMl, kDO + wg * 8192);
        wgmma_commit();
        // dS split to shared memory (keys x this warpgroup's 64 columns)
        const int wt = opaque(int(threadIdx.x & 127)), w = wt >> 5, g = (wt & 31) >> 2, t = wt & 3;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int row = 64 * h + 16 * w + g + 8 * e,
                        at = kmajor_sw128_offset(row, 8 * j + 2 * t, 128);
              uint32_t a, c;
              split_bf16x2(ds[h][4 * j + 2 * e], ds[h][4 * j + 2 * e + 1], a, c);
              *reinterpret_cast<uint32_t*>(sm + kDSh + wg * 16 * KB + at) = a;
              if constexpr (kParts == 2)
                *reinterpret_cast<uint32_t*>(sm + kDSl + wg * 16 * KB + at) = c;
            }
        fence_proxy_async_shared();
        named_bar_sync(1 + wg, 128);
        wgmma_fence();
        mma64<8, 0>(du, sm, kK, kDSh + wg * 16 * KB);  // + K_G dS
        if constexpr (kParts == 2) mma64<8, 0>(du, sm, kK, kDSl + wg * 16 * KB);
        finish(du);
        put_tile<kParts == 2>(sm, kDUh + wg * 8192, kDUl + wg * 8192, du, scal[3]);
        fence_proxy_async_shared();
        named_bar_sync(1 + wg, 128);
      }
      named_bar_arrive(kFull + b, kThreads);
      if constexpr (kChain) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int r = 0; r < 32; ++r) ds[h][r] *= scal[3][0];  // gamma_C
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mma64<4, 1>(ds[h], sm, kQ + h * 8192, kDYh + wg * 8192);  // + Q^T D dY
          if constexpr (kParts == 2) mma64<4, 1>(ds[h], sm, kQ + h * 8192, kDYl + wg * 8192);
          mma64<4, 1>(ds[h], sm, kWh + h * 8192, kDUh + wg * 8192);  // - W^T dU
          if constexpr (kParts == 2) {
            mma64<4, 1>(ds[h], sm, kWh + h * 8192, kDUl + wg * 8192);
            mma64<4, 1>(ds[h], sm, kWl + h * 8192, kDUh + wg * 8192);
          }
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_reg_fence(ds[0]);
        wgmma_reg_fence(ds[1]);
      }
      named_bar_arrive(kWmEmpty + b, kThreads);
    }
    // drain: the gradients' last two hand-offs
    for (int i = steps > 2 ? steps - 2 : 0; i < steps; ++i)
      named_bar_sync(kEmpty + (i & 1), kThreads);
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < 32; ++r) s += ds[0][r] + ds[1][r];
    if (s == 12345.f) out[0] = 1u;  // keeps the chain
  } else {  // ---- the input gradients, one chunk behind; the chain's operands two ahead
    const int gw = wg - 2, gtid = threadIdx.x - 256;
    // A chunk's inputs: issued and waited for in its prep, or (kAhead) issued once the chunk
    // before is prepared, so that they land during that chunk's gradients (over the inputs still
    // being read: an upper bound on what a producer with a second buffer would give).
    auto issue = [&](int i) {
      if constexpr (kGlobal) {
        const char* src = in + (blk * chunks + i % chunks) * int64_t(kInBytes);
        for (int k = gtid; k < kInBytes / 16; k += 256) cp16(smem + 16 * k, src + 16 * k, true);
        cp_commit();
      }
    };
    auto prep = [&](int i) {  // W, M, D dY, Gamma U of chunk i, for the chain
      char* const sm = opaque(smem);
      if (!kAhead || i == 0) issue(i);
      cp_wait<0>();
      if constexpr (kGrads) {
        float acc[32];
        zero(acc);
        wgmma_fence();
        mma64<4, 0>(acc, sm, kAih, kK + gw * 8192);  // W = A^-1 diag(.) K, this half's keys
        if constexpr (kParts == 2) mma64<4, 0>(acc, sm, kAil, kK + gw * 8192);
        finish(acc);
        put_tile<kParts == 2>(sm, kWh + gw * 8192, kWl + gw * 8192, acc, scal[1]);
        if (gw == 0) {  // M = (Q K^T) o Gamma, split
          zero(acc);
          wgmma_fence();
          mma64<8, 0>(acc, sm, kQ, kK);
          finish(acc);
#pragma unroll
          for (int r = 0; r < 32; ++r) acc[r] *= __expf(scal[0][r & 63] - scal[0][(r * 7) & 63]);
          put_tile<kParts == 2>(sm, kMh, kMl, acc, scal[4]);
        } else {  // D dY (split) and Gamma U, 64 elements of each a thread
          for (int k = wt; k < 64 * 64; k += 128) {
            const int row = k >> 6, col = 2 * (k & 63), at = kmajor_sw128_offset(row, col, 64);
            const float2 y =
                Dtype<__nv_bfloat16>::unpack2(*reinterpret_cast<const uint32_t*>(sm + kDO + at));
            const float2 u =
                Dtype<__nv_bfloat16>::unpack2(*reinterpret_cast<const uint32_t*>(sm + kU + at));
            const float f = scal[2][row], c = scal[3][row];
            uint32_t a, l;
            split_bf16x2(f * y.x, f * y.y, a, l);
            *reinterpret_cast<uint32_t*>(sm + kDYh + at) = a;
            if constexpr (kParts == 2) *reinterpret_cast<uint32_t*>(sm + kDYl + at) = l;
            *reinterpret_cast<uint32_t*>(sm + kGU + at) =
                Dtype<__nv_bfloat16>::pack2(c * u.x, c * u.y);
          }
        }
      }
      fence_proxy_async_shared();
      named_bar_arrive(kWmReady + (i & 1), kThreads);
      if (kAhead && i + 1 < steps) issue(i + 1);
    };
    for (int i = 0; i < (steps < 2 ? steps : 2); ++i) prep(i);
    for (int i = 0; i < steps; ++i) {
      char* const sm = opaque(smem);
      const int b = i & 1;
      named_bar_sync(kFull + b, kThreads);
      uint32_t* const o =
          out + (blk * chunks + (i >= warm ? i - warm : 0)) * int64_t(kOutBytes / 4);
      if (kGrads && i >= warm) {
        float p[32], x[32];
        zero(p);
        wgmma_fence();
        mma64<4, 1>(p, sm, kAih, kDUh + gw * 8192);  // dR = A^-T dU, this half's values
        wgmma_commit();
        {  // meanwhile sum(dS o S) (dg's carried share) over the bf16 tiles, a part a warp
          float c = 0.f;
          for (int k = gtid; k < 8192; k += 256) {
            const float2 a =
                Dtype<__nv_bfloat16>::unpack2(reinterpret_cast<const uint32_t*>(sm + kS)[k]);
            const float2 d =
                Dtype<__nv_bfloat16>::unpack2(reinterpret_cast<const uint32_t*>(sm + kDSh)[k]);
            c = fmaf(a.y, d.y, fmaf(a.x, d.x, c));
          }
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
          if (lane == 0) scal[6][32 + (gtid >> 5)] = c;
        }
        wgmma_wait<0>();
        wgmma_reg_fence(p);
        {  // dv's row dots v^ . dR from the raw v rows
          float pv[2] = {0.f, 0.f};
#pragma unroll
          for (int r = 0; r < 32; ++r) {
            const int row = 16 * w + g + 8 * ((r >> 1) & 1), col = 64 * gw + 8 * (r >> 2) + 2 * t;
            const float2 v = Dtype<__nv_bfloat16>::unpack2(
                *reinterpret_cast<const uint32_t*>(sm + kV + kmajor_sw128_offset(row, col, 64)));
            pv[(r >> 1) & 1] = fmaf(r & 1 ? v.y : v.x, p[r], pv[(r >> 1) & 1]);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            pv[h] += __shfl_xor_sync(0xffffffffu, pv[h], 1);
            pv[h] += __shfl_xor_sync(0xffffffffu, pv[h], 2);
            if (t == 0) scal[6][16 * w + g + 8 * h] += pv[h];
          }
        }
        if constexpr (kGlobal) put_global(o, p, gtid);  // dv
        put_tile<false>(sm, kDR + gw * 8192, 0, p, scal[2]);
        fence_proxy_async_shared();
        named_bar_sync(kBarPair, 256);
        zero(p);
        zero(x);
        wgmma_fence();
        mma64<8, 0>(p, sm, gw == 0 ? kDO : kDR, kU);  // dY U^T or dR U^T
        mma64<8, 0>(x, sm, gw == 0 ? kQ : kK, kK);    // Q K^T or K K^T
        finish(p);
        wgmma_reg_fence(x);
        // the gate epilogue: Pm = p o Gamma (masked) or Z = beta (-p o Gamma); row sums
        float rs = 0.f;
#pragma unroll
        for (int r = 0; r < 32; ++r) {
          const int row = 16 * w + g + 8 * ((r >> 1) & 1), col = 8 * (r >> 2) + 2 * t + (r & 1);
          const float v = col <= row ? p[r] * __expf(scal[0][row] - scal[0][col]) : 0.f;
          rs = fmaf(v, x[r] * scal[4][row] * scal[5][col], rs);
          p[r] = v;
        }
        rs += __shfl_xor_sync(0xffffffffu, rs, 1);
        rs += __shfl_xor_sync(0xffffffffu, rs, 2);
        if (t == 0) scal[6][16 * w + g] = rs;
        put_tile<false>(sm, gw == 0 ? kPc : kZc, 0, p, scal[5]);
        put_tile<false>(sm, gw == 0 ? kPr : kZr, 0, p, scal[4]);
        fence_proxy_async_shared();
        float dq[32], dk[32];
        zero(dq);
        zero(dk);
        wgmma_fence();
        mma64<8, 0>(dq, sm, kDO, kS + gw * 16 * KB);    // dY S^T
        mma64<8, 0>(dk, sm, kGU, kDSh + gw * 16 * KB);  // Gamma U dS^T
        mma64<8, 0>(dk, sm, kDR, kS + gw * 16 * KB);    // - e^G beta dR S^T
        wgmma_commit();
        named_bar_sync(kBarPair, 256);  // Pm, Z complete
        wgmma_fence();
        mma64<4, 0>(dq, sm, kPc, kK + gw * 8192);  // + Pm K
        mma64<4, 1>(dk, sm, kPr, kQ + gw * 8192);  // + Pm^T Q
        mma64<4, 0>(dk, sm, kZc, kK + gw * 8192);  // + Z K
        mma64<4, 1>(dk, sm, kZr, kK + gw * 8192);  // + Z^T K
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_reg_fence(dq);
        wgmma_reg_fence(dk);
        // the prologue's row dots (q^ . dq, k^ . dk), then the gradients out
        float pq = 0.f, pk = 0.f;
#pragma unroll
        for (int r = 0; r < 32; ++r) {
          pq = fmaf(dq[r], scal[4][r & 63], pq);
          pk = fmaf(dk[r], scal[5][r & 63], pk);
        }
        pq += __shfl_xor_sync(0xffffffffu, pq, 1);
        pk += __shfl_xor_sync(0xffffffffu, pk, 2);
        if (t == 0) scal[7][16 * w + g] = pq + pk;
        named_bar_sync(kBarPair, 256);
        if (gtid == 0) {  // dg: the carried term and the reverse cumulative sum, one thread
          float acc = 0.f;
          for (int k = 0; k < 8; ++k) acc += scal[6][32 + k];
          for (int r = 63; r >= 0; --r) scal[7][r] = acc += scal[6][r] * scal[2][r];
        }
        float f = scal[7][16 * w + g];
        pk = 0.f;
#pragma unroll
        for (int r = 0; r < 32; ++r) {
          dq[r] -= f * scal[4][r & 63];
          dk[r] = scal[1][r & 63] * (dk[r] - f * scal[5][r & 63]);  // dk1 (Kaczmarz)
          pk = fmaf(dk[r], scal[5][r & 63], pk);                    // k1 . dk1
        }
        pk += __shfl_xor_sync(0xffffffffu, pk, 1);
        pk += __shfl_xor_sync(0xffffffffu, pk, 2);
        if (t == 0) scal[5][16 * w + g + 8 * (gw)] = pk;
        named_bar_sync(kBarPair, 256);
        f = scal[5][16 * w + g];
#pragma unroll
        for (int r = 0; r < 32; ++r) dk[r] = scal[4][r & 63] * (dk[r] - f * scal[5][r & 63]);
        if constexpr (kGlobal) {
          put_global(o + 4096, dq, gtid);
          put_global(o + 8192, dk, gtid);
        } else if (f == 12345.f) {
          out[0] = 1u;
        }
      }
      named_bar_arrive(kEmpty + b, kThreads);
      if (i + 2 < steps) {
        named_bar_sync(kWmEmpty + b, kThreads);
        prep(i + 2);
      }
    }
    for (int i = steps > 2 ? steps - 2 : 0; i < steps; ++i)
      named_bar_sync(kWmEmpty + (i & 1), kThreads);
  }
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 0) *cycles = (clock64() - t0) / chunks;
}
#endif

template <int kParts, bool kChain, bool kGrads, bool kGlobal, bool kAhead = false>
__global__ void __launch_bounds__(kThreads, 1)
    fused_floor_kernel(const char* in, uint32_t* out, int chunks, int warm, long long* cycles) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fused_floor<kParts, kChain, kGrads, kGlobal, kAhead>(in, out, chunks, warm, cycles);
#else
  if (threadIdx.x == 0) *cycles = -1;
#endif
}

/// The key heads' sums of dq, dk where the fused kernel leaves them per value head (group 2): fp32
/// partials of both value heads read, their sum written as bf16, in value-head order.
__global__ void __launch_bounds__(256)
    gqa_sum_kernel(const float4* partial, uint2* sum, int64_t pairs_elems4) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < pairs_elems4;
       k += int64_t(gridDim.x) * blockDim.x) {
    const float4 a = partial[2 * k], b = partial[2 * k + 1];
    sum[k] = make_uint2(Dtype<__nv_bfloat16>::pack2(a.x + b.x, a.y + b.y),
                        Dtype<__nv_bfloat16>::pack2(a.z + b.z, a.w + b.w));
  }
}

struct Variant {
  const char* name;
  void (*kernel)(const char*, uint32_t*, int, int, long long*);
  int units;  // wgmma units a chunk and value head (warm-up steps not counted)
  bool warm;  // with the run's warm-up steps
};

}  // namespace

int main(int argc, char** argv) {
  const int dev = sm90_device_or_explain("kla_fused_bwd_floor");
  if (dev < 0) return 0;
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  // Default: 1x32768 at HV = 32 cut into 16 segments of 32 chunks (FlashQLA's cut): 512 blocks.
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 512,
            chunks = argc > 2 ? std::atoi(argv[2]) : 32;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5, warm = argc > 4 ? std::atoi(argv[4]) : 6;
  if (blocks <= 0 || chunks <= 0 || reps <= 0 || warm < 0) {
    std::printf(
        "usage: kla_fused_bwd_floor [blocks > 0] [chunks a block > 0] [repetitions > 0] "
        "[warm-up steps >= 0]\n");
    return 2;
  }
  const int64_t items = int64_t(blocks) * chunks;
  char* in = nullptr;
  uint32_t* out = nullptr;
  long long* cycles = nullptr;
  if (cudaMalloc(&in, items * kInBytes) != cudaSuccess ||
      cudaMalloc(&out, items * kOutBytes) != cudaSuccess ||
      cudaMalloc(&cycles, sizeof(long long)) != cudaSuccess) {
    std::printf("kla_fused_bwd_floor: cannot allocate %.2f GB\n",
                double(items) * (kInBytes + kOutBytes) / 1e9);
    return 1;
  }
  cudaMemset(in, 0, items * kInBytes);
  const Variant variants[] = {
      {"fused, FAST contract (chain split)", fused_floor_kernel<2, true, true, true>,
       chain_units(2) + grads_units(2), false},
      {"fused, FAST contract, + warm-up steps", fused_floor_kernel<2, true, true, true>,
       chain_units(2) + grads_units(2), true},
      {"fused, FAST, + warm-up, loads a chunk ahead", fused_floor_kernel<2, true, true, true, true>,
       chain_units(2) + grads_units(2), true},
      {"fused, one part everywhere", fused_floor_kernel<1, true, true, true>,
       chain_units(1) + grads_units(1), false},
      {"fused, FAST contract, no global traffic", fused_floor_kernel<2, true, true, false>,
       chain_units(2) + grads_units(2), false},
      {"chain alone, FAST contract (no loads)", fused_floor_kernel<2, true, false, false>,
       chain_units(2), false},
      {"gradients alone, FAST contract", fused_floor_kernel<2, false, true, true>, grads_units(2),
       false},
      {"hand-offs and loads alone", fused_floor_kernel<2, false, false, true>, 0, false}};
  // Peak: 2,048 bf16 multiply-adds a clock and multiprocessor (dense), at the reported clock.
  const double peak_macs = double(sms) * 2048.0 * clock_khz * 1e3;
  std::printf(
      "kla_fused_bwd_floor: %s, %d SMs, %.0f MHz; %d blocks x %d chunks = %lld items, "
      "median of %d; warm-up steps %d\n",
      prop.name, sms, clock_khz / 1e3, blocks, chunks, (long long)items, reps, warm);
  std::printf("%-42s %9s %12s %12s %14s %9s\n", "variant", "ms", "us/item/SM", "cyc/chunk b0",
              "MMA units/item", "% peak");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (const Variant& v : variants) {
    if (cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) !=
        cudaSuccess) {
      std::printf("%s: cannot set %d bytes of shared memory\n", v.name, kSmem);
      return 1;
    }
    std::vector<float> ms;
    long long cyc = 0;
    for (int r = 0; r <= reps; ++r) {  // the first run warms up
      cudaEventRecord(e0);
      v.kernel<<<blocks, kThreads, kSmem>>>(in, out, chunks, v.warm ? warm : 0, cycles);
      cudaEventRecord(e1);
      cudaError_t e = cudaEventSynchronize(e1);
      if (e == cudaSuccess) e = cudaGetLastError();
      if (e != cudaSuccess) {
        std::printf("%s: %s\n", v.name, cudaGetErrorString(e));
        return 1;
      }
      float t = 0.f;
      cudaEventElapsedTime(&t, e0, e1);
      if (r > 0) ms.push_back(t);
    }
    cudaMemcpy(&cyc, cycles, sizeof cyc, cudaMemcpyDeviceToHost);
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double us_item = med * 1e3 * sms / double(items);
    const double pct = 100.0 * double(v.units) * 65536.0 * double(items) / (med * 1e-3 * peak_macs);
    std::printf("%-42s %9.3f %12.2f %12lld %14d %8.1f%%\n", v.name, med, us_item, cyc, v.units,
                pct);
  }
  {  // the key heads' sums after a fused kernel that writes dq, dk per value head in fp32
    const int64_t elems4 = items / 2 * 2 * 64 * 128 / 4;  // key-head items x (dq, dk) / 4
    float4* partial = nullptr;
    uint2* sum = nullptr;
    if (cudaMalloc(&partial, elems4 * 2 * sizeof(float4)) != cudaSuccess ||
        cudaMalloc(&sum, elems4 * sizeof(uint2)) != cudaSuccess) {
      std::printf("gqa sum: cannot allocate\n");
      return 1;
    }
    cudaMemset(partial, 0, elems4 * 2 * sizeof(float4));
    std::vector<float> ms;
    for (int r = 0; r <= reps; ++r) {
      cudaEventRecord(e0);
      gqa_sum_kernel<<<4 * sms, 256>>>(partial, sum, elems4);
      cudaEventRecord(e1);
      if (cudaEventSynchronize(e1) != cudaSuccess || cudaGetLastError() != cudaSuccess) {
        std::printf("gqa sum: failed\n");
        return 1;
      }
      float t = 0.f;
      cudaEventElapsedTime(&t, e0, e1);
      if (r > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double bytes = double(elems4) * (2 * sizeof(float4) + sizeof(uint2));
    std::printf("%-42s %9.3f   (%.2f GB moved, %.2f TB/s)\n", "key-head sums of dq, dk (group 2)",
                ms[ms.size() / 2], bytes / 1e9, bytes / (ms[ms.size() / 2] * 1e-3) / 1e12);
  }
  return 0;
}
