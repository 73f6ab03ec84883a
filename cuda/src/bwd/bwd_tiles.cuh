// The backward kernels' tile moves: where a chunk's record is, its rows between global and
// shared memory (raw [B,T,heads,W] inputs converted to fp32 with four 16-byte loads in flight a
// thread; record rows by cp.async or float4 stores), and per-row scalings. Shared by every file
// of bwd/.
#pragma once

#include "arch/copy.cuh"
#include "arch/mma_tf32.cuh"
#include "bwd/bwd_layout.hpp"
#include "bwd/bwd_params.hpp"
#include "common/kernel_common.cuh"
#include "common/kernel_mutants.hpp"
#include "prep/token_scalars.cuh"

namespace kla::kernels {

/// Whether dtype E, arithmetic kFast and head dims kHD run the bf16 prep, state scan and input
/// gradients, which keep S, dS, U, dU, A^-1 and W's two parts in the record as bf16
/// (bwd_runs_bf16_input_grads; bwd/bwd_layout.hpp).
template <class E, bool kFast, int kHD>
constexpr bool kBwdBf16Record = bwd_runs_bf16_input_grads(kFast, std::is_same_v<E, __nv_bfloat16>,
                                                          kHD, kHD);

/// The thread index, read where it is used (asm volatile): not hoisted out of a kernel's loop over
/// value heads, where every index derived from it would stay live across the pass (and spill).
__device__ __forceinline__ int thread_index_here() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

/// The record of chunk c of sequence n (token range sr) for value head hv.
__device__ __forceinline__ float* bwd_record(const BwdParams& bp, int n, const SeqRange& sr, int c,
                                             int hv) {
  return bp.ws + (chunk_slot(bp.f, n, sr, c) * bp.f.HV + hv) * bp.rec_floats;
}

/// The tile of value head hv, chunk c, this block's sequence (grid z), in the kernels whose grid
/// has key heads in y (the bf16 prep and input gradients, where prep_tile would read y as a value
/// head).
__device__ __forceinline__ PrepTile bwd_head_tile(const KernelParams& p, int c, int hv) {
  return prep_tile_at(p, c, hv, int(blockIdx.z));
}
/// The same of this block's chunk (grid x).
__device__ __forceinline__ PrepTile bwd_head_tile(const KernelParams& p, int hv) {
  return bwd_head_tile(p, int(blockIdx.x), hv);
}

/// Whether a block that takes `chunks` chunks in turn (the bf16 prep and input gradients,
/// bwd_block_chunks) has one after pt's, its cc-th: next_chunk_tile(pt).L > 0, written out (that
/// form schedules the prep differently).
__device__ __forceinline__ bool bwd_block_has_next_chunk(const PrepTile& pt, int cc, int chunks) {
  return cc + 1 < chunks && int64_t(pt.c + 1) * kChunk < pt.sr.len;
}

/// The record of value head `to` in the chunk whose record for value head `from` is rec: a chunk's
/// value heads' records are consecutive (bwd_record).
__device__ __forceinline__ float* bwd_record_of_head(const BwdParams& bp, float* rec, int from,
                                                     int to) {
  return rec - int64_t(from - to) * bp.rec_floats;
}

/// Floats from the record of chunk c to that of chunk c + 1 (one sequence, one value head): a
/// sequence's chunk slots are consecutive (chunk_slot).
__device__ __forceinline__ int64_t bwd_record_step(const BwdParams& bp) {
  return int64_t(bp.f.HV) * bp.rec_floats;
}

/// The (row, column) of idx = start, start + step, ... over a grid `w` columns wide, advanced by
/// an add and a compare instead of a division an element (w and step are runtime in most calls).
struct GridWalk {
  int i, c, di, dc, w;
  __device__ __forceinline__ GridWalk(int w_, int start, int step)
      : i(start / w_), c(start % w_), di(step / w_), dc(step % w_), w(w_) {}
  __device__ __forceinline__ void next() {
    i += di, c += dc;
    if (c >= w) c -= w, ++i;
  }
};

/// Loads rows [0, L) of a [C][W] tile of a [B,T,heads,W] tensor (zero rows past L) as fp32 into
/// shared memory of pitch `pitch`: 16-byte vectors, four in flight per thread before any is
/// stored (the loads' latency overlaps). W a multiple of 16 / sizeof(E); base, strides 16-byte
/// aligned (validated); dst and pitch 16-byte aligned.
template <class E>
__device__ __forceinline__ void bwd_load_rows(float* dst, int pitch, const E* base,
                                              const int64_t* st, int64_t b, int64_t tb, int head,
                                              int L, int W) {
  constexpr int VE = 16 / int(sizeof(E));
  GridWalk at(W / VE, threadIdx.x, blockDim.x);
  while (at.i < kChunk) {
    uint4 raw[4];
    int ri[4], rc[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      ri[u] = at.i, rc[u] = at.c * VE;
      at.next();
      raw[u] = ri[u] < kChunk && ri[u] < L
                   ? *reinterpret_cast<const uint4*>(base + b * st[0] + (tb + ri[u]) * st[1] +
                                                     int64_t(head) * st[2] + rc[u])
                   : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (ri[u] < kChunk) {  // 16-byte stores (a lane's VE values are adjacent)
        const E* e = reinterpret_cast<const E*>(&raw[u]);
        float4* d4 = reinterpret_cast<float4*>(dst + ri[u] * pitch + rc[u]);
#pragma unroll
        for (int j = 0; j < VE; j += 4)
          d4[j / 4] = make_float4(tof(e[j]), tof(e[j + 1]), tof(e[j + 2]), tof(e[j + 3]));
      }
    }
  }
}

/// Asynchronous copies (cp.async, 16 bytes each) of a [rows][W] fp32 block from global memory
/// (row pitch sp) to shared memory (pitch dp); W and both pitches multiples of 4. The caller
/// commits and waits (cp_commit, cp_wait) before a barrier.
__device__ __forceinline__ void bwd_cp_rows(float* dst, int dp, const float* src, int64_t sp,
                                            int rows, int W) {
  for (GridWalk at(W / 4, threadIdx.x, blockDim.x); at.i < rows; at.next())
    cp16(dst + at.i * dp + 4 * at.c, src + at.i * sp + 4 * at.c, true);
}

/// Copies a [rows][W] fp32 matrix from shared memory (pitch sp) to global memory (pitch dp),
/// 16 bytes at a time; W and both pitches multiples of 4.
__device__ __forceinline__ void bwd_store_rows(float* dst, int64_t dp, const float* src, int sp,
                                               int rows, int W) {
  for (GridWalk at(W / 4, threadIdx.x, blockDim.x); at.i < rows; at.next())
    *reinterpret_cast<float4*>(dst + at.i * dp + 4 * at.c) =
        *reinterpret_cast<const float4*>(src + at.i * sp + 4 * at.c);
}

/// A pair of fp32 values rounded to bf16 (nearest; x in the low half): how the bf16 kernels round
/// the record's tiles and their one-part operands. The kernel mutant bwd_bf16_truncated truncates
/// them instead (twice the error, and biased).
__device__ __forceinline__ uint32_t round_bf16x2(float x, float y) {
  if (KLA_MUTANT(bwd_bf16_truncated))
    return (__float_as_uint(x) >> 16) | (__float_as_uint(y) & 0xffff0000u);
  return Dtype<__nv_bfloat16>::pack2(x, y);
}

/// Four fp32 values rounded to bf16 (round_bf16x2) at dst (8-byte aligned): one 8-byte store.
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float4 x) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(round_bf16x2(x.x, x.y), round_bf16x2(x.z, x.w));
}

/// x[i][.] *= f[i] for rows [0, rows) of a [rows][W] shared matrix of pitch `pitch` (W and pitch
/// multiples of 4): one warp per row, a float4 per lane.
__device__ __forceinline__ void bwd_scale_rows(float* x, int pitch, int rows, int W,
                                               const float* f) {
  const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int i = threadIdx.x >> 5; i < rows; i += nw)
    for (int c = 4 * lane; c < W; c += 128) {
      float4 v = *reinterpret_cast<float4*>(x + i * pitch + c);
      v.x *= f[i], v.y *= f[i], v.z *= f[i], v.w *= f[i];
      *reinterpret_cast<float4*>(x + i * pitch + c) = v;
    }
}

}  // namespace kla::kernels
