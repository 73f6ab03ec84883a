// WY path, pass 2 (scan): chunk_wy_scan_kernel, one block per (sequence, value head, VS = 8, 16 or
// 32 value columns), chunks in order, reading each chunk's record from the prep
// (prep/wy_prep.cuh). With R the chunk's innovation, the scan reduces to the state-dependent
// products (paper App. B, WY form, normalised keys):
//   R = diag(beta kscale) (V - D_gamma K S)       U = T R
//   O = diag(gamma qscale) Q S + (P T) R
//   S <- gamma_C S + K^T diag(kscale gamma_C / gamma_j) U
// Warps in three roles:
//   8 recurrence warps (the chain from chunk to chunk; warpgroups 0 and 1): A. R (warpgroup j:
//     column half j, at VS = 8 warpgroup 0 alone; warp w rows 16 (w % 4)); B. X = diag(update) T R;
//     C. S <- gamma_C S + K^T X, the state in the accumulators of the warps that own its blocks,
//     written split into the other of two shared buffers;
//   4 read-out warps (off the chain; warpgroup 2): Q S_ch while R forms, then O = diag(gamma
//     qscale) Q S_ch + (P T) R once it has (a named barrier the recurrence warps only arrive at);
//   the producer (bf16 / fp16: a 13th warp; fp32: the first read-out warp) issues the next chunk's
//     copies (record by one bulk copy; bf16 / fp16 K / Q as 128-byte swizzled boxes by tensor
//     copies, fp32 the prep's images by one bulk copy; V's slice by a tensor copy) into a ring of
//     wy_scan_stages stages, and L2 prefetches further ahead. Where the stages have no room for V
//     (wy_v_in_smem), V goes from global memory to the recurrence warps' registers a chunk ahead.
// K S, Q S and K^T X run on wgmma with both operands in shared memory (the K / Q boxes as the TMA
// leaves them or the images; K^T as the M-major view; S and X as split K-major tiles whose rows
// hold each column group as hi rows then lo rows, wy_split_row, so one wgmma gives both parts),
// written from the accumulators by transposing stmatrix. T R and (P T) R stay on mma.sync
// (packed triangular records). One __syncthreads per chunk frees the stage and the state buffer
// that the last chunk read.
//
// Precision: products are bf16 (fp16 storage: K S, Q S and K^T X fp16) with fp32 accumulation.
// Raw bf16 / fp16 inputs are exact operands; fp32 K / Q (arithmetic FAST) enter as bf16 hi + lo
// (16 significant bits, the only rounding of an input); fp32 intermediates (S, R, X, T, P T) as
// bf16 hi + lo, and a product of two split operands keeps hi hi + hi lo + lo hi (~2^-16 relative).
// fp16: S and X, the B operands of the f16 products, as fp16 hi + lo (22 bits), each value column
// scaled by a power of two into fp16's range first (fp16_range_scale of the column's largest
// magnitude: the recurrence warps' partial maxima meet in shared memory, one more named barrier
// each), the scale undone on K S, Q S and K^T X (exact), as the transposed scan does per row. V and
// the norms are fp32 as given. Deterministic: fixed orders, no atomics.
//
// kSave (bf16, K = V = 128, VS = 32 only; kla_chunk_forward_saving): the scan also writes what the
// backward would recompute (layout/saved_states.hpp) to p.saved: the state warps each chunk's
// incoming state from their accumulators, step B's warps U = T R before its update scale, both
// rounded to bf16. Stores only: the outputs and the state are bitwise those of kSave = false.
#pragma once

#include <type_traits>

#include <cudaTypedefs.h>

#include "arch/copy.cuh"
#include "arch/mma_bf16.cuh"
#include "arch/profile.cuh"
#include "arch/split.cuh"
#include "arch/wgmma.cuh"
#include "epilogue/state_io.cuh"
#include "layout/saved_states.hpp"
#include "layout/wy_layout.hpp"
#include "scan/wy_products.cuh"

namespace kla::kernels {

// Named barriers (0 is __syncthreads): R ready for the read-out warps (the recurrence warps
// arrive, the read-out warps wait), the recurrence warps among themselves (R, then X), and two
// that pad the read-out warps and a producer warp of its own to as many barrier waits per chunk
// as the recurrence warps (3):
// compute-sanitizer racecheck behaves as if it ordered two warps' accesses by how many barriers
// each has waited at (docs/prefill_notes.md, 'Design decisions'), and without the padding reports
// accesses ordered by the chunk's __syncthreads as hazards.
constexpr int kWyBarR = 1, kWyBarRec = 2, kWyBarPadRead = 3, kWyBarPadProducer = 4;

/// L2 prefetch of one value slice's share of chunk cf's raw K and Q rows (key head h; rows past
/// the sequence end are not asked for).
template <class E, int KD>
__device__ __forceinline__ void prefetch_kq_rows_l2(const KernelParams& p, const SeqRange& sr,
                                                    int h, int cf, int slice, int nslices,
                                                    int lane) {
  const int64_t tf = sr.t0 + int64_t(cf) * kChunk;
  const int rows =
      int(sr.len - int64_t(cf) * kChunk < kChunk ? sr.len - int64_t(cf) * kChunk : kChunk);
  constexpr int lpr = (KD * 2 + 127) / 128;  // lines per row
  for (int l = slice + nslices * lane; l < 2 * rows * lpr; l += nslices * 32) {
    const int q = l / (rows * lpr), rem = l % (rows * lpr);
    const E* base = q ? static_cast<const E*>(p.q) + sr.b * p.qs[0] + (tf + rem / lpr) * p.qs[1] +
                            int64_t(h) * p.qs[2]
                      : static_cast<const E*>(p.k) + sr.b * p.ks[0] + (tf + rem / lpr) * p.ks[1] +
                            int64_t(h) * p.ks[2];
    asm volatile(
        "prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(base) + (rem % lpr) * 128));
  }
}

/// fp16's column scales: the largest magnitude in each column of this warp's NT 8-column mma C
/// fragments v (rows g and g + 8, column 8 nt + 2 t4 + e), written by lanes 0-3 to dst[8 nt + 2 t4
/// + e]; the warp leaves converged (it meets a barrier next).
template <int NT>
__device__ __forceinline__ void fragment_column_max(const float (&v)[NT][4], float* dst, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float m = fmaxf(fabsf(v[nt][e]), fabsf(v[nt][e + 2]));
      m = fmaxf(m, __shfl_xor_sync(~0u, m, 4));
      m = fmaxf(m, __shfl_xor_sync(~0u, m, 8));
      m = fmaxf(m, __shfl_xor_sync(~0u, m, 16));
      if (lane < 4) dst[8 * nt + 2 * lane + e] = m;
    }
  __syncwarp();
}
/// Lane l's share of the column scales: fp16_range_scale of column l % VS's largest magnitude
/// over ROWS partial maxima (pitch VS) at colmax; lane c then holds column c's scale, which the
/// warp's other lanes take by shuffle.
template <int VS, int ROWS>
__device__ __forceinline__ float lane_column_scale(const float* colmax, int lane) {
  float m = 0.f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) m = fmaxf(m, colmax[r * VS + lane % VS]);
  return fp16_range_scale(m);
}

template <class E, int KD, int VS, bool kSave = false>
__global__ void __launch_bounds__(wy_scan_threads(elem_of<E>()), 1)
    chunk_wy_scan_kernel(const KernelParams p, const char* __restrict__ ws,
                         const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap qmap,
                         const __grid_constant__ CUtensorMap vmap) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using R = WyRecord;
  // fp32: the K / Q tiles are the prep's images (hi + lo panels, write_wy_images) and enter every
  // product as both parts; bf16 / fp16: the raw TMA boxes, on the bf16 / f16 instruction (WE), S
  // and X split into WE hi + lo (fp16: scaled per column, wy_scale_floats).
  constexpr bool kImages = wy_kq_images(elem_of<E>()), kF16 = std::is_same_v<E, __half>;
  using WE = std::conditional_t<kF16, __half, __nv_bfloat16>;
  using E2 =
      std::conditional_t<std::is_same_v<E, float>, float2,
                         std::conditional_t<std::is_same_v<E, __half>, __half2, __nv_bfloat162>>;
  // GROUPS column groups of NH 8-column tiles each (wy_groups).
  constexpr int GROUPS = wy_groups(VS);
  constexpr int C = kChunk, SP = wy_scan_pitch(VS), MT = KD / 16, NJ = VS / 8, NH = NJ / GROUPS;
  constexpr int64_t kStage = wy_stage_bytes(elem_of<E>(), KD, VS),
                    kTile = wy_kq_tile_bytes(elem_of<E>(), KD);
  constexpr bool kVSmem = wy_v_in_smem(elem_of<E>(), KD, VS);
  constexpr int kPanels = (KD + 63) / 64, kProducer = wy_producer_warp(elem_of<E>());
  constexpr int kStages = wy_scan_stages(elem_of<E>(), KD, VS);
  // Bytes between the 64-column hi panels of the A tiles, and from a hi panel to its lo panel.
  constexpr int kAPanel = kImages ? 2 * kChunk * 128 : kChunk * 128, kALo = kChunk * 128;
  constexpr int kRecThreads = kWyRecWarps * 32, kRThreads = (kWyRecWarps + kWyReadWarps) * 32;
  // The 128-byte swizzle of the K / Q boxes needs their shared addresses 1024-byte aligned: the
  // dynamic block starts aligned (no static shared memory in this kernel) and every offset
  // below is a multiple of 1024.
  static_assert(R::bytes % 1024 == 0 && kStage % 1024 == 0 && kTile % 1024 == 0,
                "swizzled TMA boxes need 1024 B alignment");
  static_assert(MT <= kWyRecWarps && kWyReadWarps == 4, "warp roles");
  static_assert(
      !kSave || (std::is_same_v<E, __nv_bfloat16> && KD == kSavedHeadDim && VS == kSavedValueSlice),
      "saved states: bf16 at K = V = 128, 32-column slices (layout/saved_states.hpp)");
  extern __shared__ __align__(1024) char smem[];
  // Stage st: record (T_hi, T_lo, PT_hi, PT_lo, scalars) | K, Q, each [KD/64 panels][64][128 B
  // swizzled] (kmajor_sw128_offset with 64 rows a panel: wgmma operands, 128-byte TMA box rows;
  // fp32: each panel as hi then lo, the prep's images).
  auto st_rec = [&](int st) { return smem + st * kStage; };
  auto st_kq = [&](int st) { return smem + st * kStage + R::bytes; };  // K tile, then Q tile
  auto st_v = [&](int st) {
    return reinterpret_cast<E*>(smem + st * kStage + R::bytes + 2 * kTile);
  };
  // State split, two buffers: chunk ch reads buffer ch % 2 (S_ch) and writes S_ch+1 into the
  // other, so the read-out's Q S may still run while the state is updated. S and X are wgmma B
  // tiles (wgmma.cuh: K-major, [value column][key or token], 128-byte swizzle); R is an
  // mma.sync B operand ([token][SP]).
  constexpr int kSSplit = int(wy_state_split_bytes(KD, VS)), kXSplit = 2 * VS * 128;
  char* Sbuf = smem + kStages * kStage;  // [2][KD / 64 panels][2 VS rows][128 B]
  auto s_split = [&](int b) { return Sbuf + b * kSSplit; };
  char* Xs = Sbuf + 2 * kSSplit;  // [2 VS rows][128 B] diag(update scale) U split
  auto* Rh = reinterpret_cast<__nv_bfloat16*>(Xs + kXSplit);  // [C][SP] R split
  __nv_bfloat16* Rl = Rh + C * SP;
  auto* full = reinterpret_cast<uint64_t*>(Rl + C * SP);  // stage st landed
  // fp16: partial column maxima [8][VS] (row: the writer's row block), the state split's scales
  // [2][VS] (buffer b's in row b), X's scales [VS].
  float* colmax = reinterpret_cast<float*>(full + kStages);
  float* taus = colmax + kWyRecWarps * VS;
  float* sigs = taus + 2 * VS;
  static_assert(kSSplit % 1024 == 0 && (VS / GROUPS) % 8 == 0, "wgmma B tiles are 1024 B atoms");
  // One 16 x 8 tile (rows r0.., columns c0..) of a [row][column] matrix, held as an mma C
  // fragment v, split into a split B tile t (K-major: [2 VS rows (wy_split_row)][k = row]): one
  // transposing stmatrix of four 8 x 8 matrices (hi rows r0.. and r0 + 8.., then lo), lane l
  // addressing row l % 8 of matrix l / 8: 16 bytes, eight k of one value column.
  auto store_tile_kmajor = [&](char* t, int r0, int c0, float v0, float v1, float v2, float v3) {
    uint32_t h0, l0, h1, l1;
    split_pair<WE>(v0, v1, h0, l0);
    split_pair<WE>(v2, v3, h1, l1);
    const int l = int(threadIdx.x) & 31, m = l >> 3;
    stsm4_t(
        t + kmajor_sw128_offset(wy_split_row<VS>(c0 + (l & 7), m >> 1), r0 + (m & 1) * 8, 2 * VS),
        h0, h1, l0, l1);
  };

  // The warp index through a shuffle from lane 0: the compiler then knows it is warp-uniform and
  // keeps what derives from it (the wgmma descriptors above all) in uniform registers: fewer
  // issued instructions (docs/prefill_notes.md, 'Design decisions').
  const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(~0u, tid >> 5, 0);
  const int g = lane >> 2, t4 = lane & 3;
  const int V = p.V, nslices = V / VS;
  const ScanTile blk = scan_tile(p, KD, V, VS);
  if (blk.slot.skip) return;  // pool index -1: nothing read, nothing written
  const int slice = blk.slice, hv = blk.hv, n = blk.n, h = blk.h, c0 = blk.c0;
  const StateSlot slot = blk.slot;
  const SeqRange sr = blk.sr;
  const int nch = int((sr.len + C - 1) / C);
  E* obase = static_cast<E*>(p.o) + sr.b * p.os[0] + int64_t(hv) * p.os[2] + c0;
  const int64_t rec_bytes = p.ws_record_floats * 4;
  // kSave: chunk ch's saved record (S [KD][V], then U [C][V]) at this slice's first column.
  auto saved_at = [&](int ch) {
    return static_cast<__nv_bfloat16*>(p.saved) +
           (chunk_slot(p, n, sr, ch) * p.HV + hv) * saved_record_elems(KD, KD) + c0;
  };

  if (tid == 0)
    for (int st = 0; st < kStages; ++st) mbar_init(&full[st], 1);
  // The state in the recurrence warps' registers, as the two warpgroups' wgmma results of
  // K^T X: at KD = 64 warpgroup j holds the key rows in column half j, otherwise warpgroup j
  // key rows 64 j.. (at KD = 96 warps 6 and 7 compute rows past KD, zero, and hold nothing).
  // Warp w < MT * SCS holds key-row block srow, columns scol..; element (nj, e) is row srow*16 +
  // g + 8 (e / 2), column scol + nj*8 + 2 t4 + e % 2.
  constexpr int SCS = 2 * MT <= kWyRecWarps ? 2 : 1, SNJ = NJ / SCS;
  static_assert(SCS == 1 || GROUPS == 2, "VS = 8 needs KD >= 96 (a warp a whole key-row block)");
  const bool state_warp = warp < MT * SCS;
  const int srow = SCS == 2 ? warp & 3 : warp, scol = SCS == 2 ? (warp >> 2) * (VS / 2) : 0;
  float sacc[SNJ][4] = {};
  // fp16: each column scaled by tau (lane_column_scale of the state warps' partial maxima in
  // colmax rows 0..MT-1, published by the caller's barrier), kept in taus row b for the products
  // that undo it.
  auto store_state_split = [&](int b) {
    float mine = 1.f;  // fp16: column lane's scale
    if constexpr (kF16) {
      mine = lane_column_scale<VS, MT>(colmax, lane);
      if (warp == 0 && lane < VS) taus[b * VS + lane] = mine;
    }
#pragma unroll
    for (int nj = 0; nj < SNJ; ++nj) {
      float tau[2] = {1.f, 1.f};
      if constexpr (kF16)
#pragma unroll
        for (int e = 0; e < 2; ++e) tau[e] = __shfl_sync(~0u, mine, scol + nj * 8 + 2 * t4 + e);
      store_tile_kmajor(s_split(b), srow * 16, scol + nj * 8, tau[0] * sacc[nj][0],
                        tau[1] * sacc[nj][1], tau[0] * sacc[nj][2], tau[1] * sacc[nj][3]);
    }
    fence_proxy_async_shared();  // for the wgmma reads after the next barrier
  };
  if constexpr (kF16) {
    if (state_warp) {
      if (slot.in) load_state_fragments(sacc, slot.in, V, srow * 16, c0, scol, g, t4);
      fragment_column_max(sacc, colmax + srow * VS + scol, lane);
    }
    __syncthreads();  // the partial maxima
    if (state_warp) store_state_split(0);
  } else if (state_warp) {
    if (slot.in) load_state_fragments(sacc, slot.in, V, srow * 16, c0, scol, g, t4);
    store_state_split(0);
  }
  __syncthreads();  // barriers initialised, state split visible

  // Chunk ch's tiles into stage ch % kStages, completing on its barrier, issued by the producer
  // warp kStages - 1 chunks ahead, right after the barrier that ends every read of that stage: the
  // record by one bulk copy, the K and Q tiles by one tensor copy per 64-column panel, this slice's
  // V columns by one more (rows past the tensor's end arrive as zeros). Its lanes also ask L2 for
  // chunk ch + kAhead's record and K / Q rows (each slice of the head a share of the 128-byte
  // lines), so that the copies find them in L2 rather than DRAM.
  constexpr int kAhead = kStages + 1;
  // fp16 / fp32: chunk ch's K and Q images: wy_image_pair's address, written out (kTile is the
  // image size, asserted in layout/wy_layout.hpp; calling wy_image_pair here reorders the scan's
  // instructions).
  auto kq_image = [&](int ch) {
    return p.ws_images + (chunk_slot(p, n, sr, ch) * p.H + h) * (2 * kTile);
  };
  auto issue = [&](int st, int ch) {
    const char* rec = ws + (chunk_slot(p, n, sr, ch) * p.HV + hv) * rec_bytes;
    mbar_expect_tx(&full[st], unsigned(R::bytes + 2 * kTile + (kVSmem ? C * VS * sizeof(E) : 0)));
    bulk_load(st_rec(st), rec, unsigned(R::bytes), &full[st]);
    const int t0 = int(sr.t0 + int64_t(ch) * C);
    if constexpr (kImages) {
      const char* img = kq_image(ch);  // K image, then Q image
      bulk_load(st_kq(st), img, unsigned(2 * kTile), &full[st]);
    } else {
#pragma unroll
      for (int pn = 0; pn < kPanels; ++pn) {
        tile_load(st_kq(st) + pn * (C * 128), &kmap, pn * 64, t0, h, int(sr.b), &full[st]);
        tile_load(st_kq(st) + kTile + pn * (C * 128), &qmap, pn * 64, t0, h, int(sr.b), &full[st]);
      }
    }
    if constexpr (kVSmem) tile_load(st_v(st), &vmap, c0, t0, hv, int(sr.b), &full[st]);
  };
  auto prefetch_l2 = [&](int cf) {
    prefetch_share_l2(ws + (chunk_slot(p, n, sr, cf) * p.HV + hv) * rec_bytes, int(R::bytes / 128),
                      slice, nslices, lane);
    if constexpr (kImages)
      prefetch_share_l2(kq_image(cf), int(2 * kTile / 128), slice, nslices, lane);
    else
      prefetch_kq_rows_l2<E, KD>(p, sr, h, cf, slice, nslices, lane);
  };
  if (warp == kProducer) {
    for (int cf = kStages - 1; cf < kAhead && cf < nch; ++cf) prefetch_l2(cf);
    if (lane == 0)
      for (int cf = 0; cf < kStages - 1 && cf < nch; ++cf) issue(cf, cf);
  }
  // The producer's copies after chunk ch's first barrier: chunk ch + kStages - 1 into the stage
  // chunk ch - 1 used, and the L2 prefetch.
  auto produce = [&](int ch) {
    const int cn = ch + kStages - 1;
    if (lane == 0 && cn < nch) issue(cn % kStages, cn);
    if (ch + kAhead < nch) prefetch_l2(ch + kAhead);
  };

  // V without room in the stages (!kVSmem): each recurrence warp's step-A elements (rows 16 (w %
  // 4) + g (+8), columns of group w / 4), loaded from global memory one chunk ahead into
  // registers, so that the load's latency hides behind a whole chunk. Rows past the chunk's end
  // read as zero.
  E2 vreg[NH][2];
  // This thread's first element: row 16 (w % 4) + g of chunk 0, column n0 + 2 t4 of the slice;
  // rows + 8 and the next tile's columns are fixed offsets from it.
  const E* vrow = static_cast<const E*>(p.v) + sr.b * p.vs[0] + int64_t(hv) * p.vs[2] + c0 +
                  (sr.t0 + (warp & 3) * 16 + g) * p.vs[1] + (warp >> 2) * (VS / GROUPS) + 2 * t4;
  auto load_v = [&](int ch) {
    const int Lc = int(sr.len - int64_t(ch) * C < C ? sr.len - int64_t(ch) * C : C);
    const E* r = vrow + int64_t(ch) * C * p.vs[1];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int nt = 0; nt < NH; ++nt) {
        if ((warp & 3) * 16 + g + hr * 8 < Lc) {
          vreg[nt][hr] = *reinterpret_cast<const E2*>(r + hr * 8 * p.vs[1] + nt * 8);
        } else {
          vreg[nt][hr].x = Dtype<E>::from_float(0.f);
          vreg[nt][hr].y = Dtype<E>::from_float(0.f);
        }
      }
  };
  const bool step_a_warp = (warp >> 2) < GROUPS;  // recurrence warps of a step-A warpgroup
  if (!kVSmem && step_a_warp && nch > 0) load_v(0);

#ifdef KLA_WY_PROFILE
  const bool prof_on = blockIdx.x == 0 && (tid == 0 || tid == kRecThreads);
  long long prof[7] = {}, prof_t = clock64();
#endif
  for (int ch = 0; ch < nch; ++ch) {
    const int st = ch % kStages, sb = ch & 1;
    const int64_t cs0 = int64_t(ch) * C;
    const int L = int(sr.len - cs0 < C ? sr.len - cs0 : C);
    const int64_t tb = sr.t0 + cs0;
    if constexpr (kSave) {
      // The state entering chunk ch, as the accumulators hold it (rows srow * 16 + g (+8),
      // columns scol + nj * 8 + 2 t4 (+1)).
      if (state_warp) {
        __nv_bfloat16* const sv = saved_at(ch);
#pragma unroll
        for (int nj = 0; nj < SNJ; ++nj)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr)
            *reinterpret_cast<__nv_bfloat162*>(sv + (srow * 16 + g + 8 * hr) * KD + scol + nj * 8 +
                                               2 * t4) =
                __floats2bfloat162_rn(sacc[nj][2 * hr], sacc[nj][2 * hr + 1]);
      }
    }
    KLA_WY_MARK(6);
    mbar_wait(&full[st], unsigned(ch / kStages) & 1u);
    KLA_WY_MARK(0);
    // A last chunk: key rows past the sequence end may hold the next sequence's tokens; zero
    // them (the recurrence warps, their only readers; the images have zeros there already).
    // Query rows there only reach output rows that are not written.
    if (!kImages && L < C && warp < kWyRecWarps) {
      for (int idx = tid; idx < kPanels * (C - L) * 8; idx += kRecThreads) {
        const int pn = idx / ((C - L) * 8), rem = idx % ((C - L) * 8);
        reinterpret_cast<uint4*>(st_kq(st) + pn * (C * 128) + (L + rem / 8) * 128)[rem % 8] =
            make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async_shared();  // the tensor cores read the K tile (wgmma A operand)
    }
    // Chunk ch's tiles visible to all; every read of chunk ch - 1's stage (read-out included)
    // and of state buffer sb ^ 1 is done.
    __syncthreads();
    KLA_WY_MARK(1);
    const char* rec = st_rec(st);
    const float* sc = reinterpret_cast<const float*>(rec + R::sc);
    // The K and Q tiles as wgmma operands (bf16: raw; fp16 / fp32: images, hi panels kAPanel
    // apart, each lo panel kALo after its hi panel).
    const char* Kb = st_kq(st);
    const char* Qb = Kb + kTile;

    if (warp < kWyRecWarps) {
      // Step A. R = diag(cu) V - diag(cw) K S for row block w % 4, columns of group w / 4 (at
      // VS = 8 one group: warpgroup 1 waits).
      if (step_a_warp) {
        const int mi = warp & 3, n0 = (warp >> 2) * (VS / GROUPS);
        float kinv[NH][2];  // fp16: 1 / tau of this thread's columns, read before the products
        if constexpr (kF16)
#pragma unroll
          for (int nt = 0; nt < NH; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              kinv[nt][e] = pow2_inverse(taus[sb * VS + n0 + nt * 8 + 2 * t4 + e]);
        float d[NH][4];
        wg_times_split<KD / 16, 2 * VS / GROUPS, NH, false, kImages, kAPanel, WE>(
            Kb, kALo, 0, s_split(sb) + (warp >> 2) * (2 * VS / GROUPS) * 128, 2 * VS * 128, d);
        if constexpr (kF16)  // K (S diag(tau)): undo tau, column by column (exact)
#pragma unroll
          for (int nt = 0; nt < NH; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[nt][e] *= kinv[nt][e & 1];
        // R's 16 x 8 tiles split by one stmatrix each (hi rows mi*16.., +8.., then lo; lane l
        // addresses row l % 8 of matrix l / 8).
        const int m = lane >> 3, srow_r = mi * 16 + (m & 1) * 8 + (lane & 7);
        __nv_bfloat16* rdst = (m >> 1 ? Rl : Rh) + srow_r * SP + n0;
#pragma unroll
        for (int nt = 0; nt < NH; ++nt) {
          uint32_t h[2], l[2];
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int i = mi * 16 + g + hr * 8, cc = n0 + nt * 8 + 2 * t4;
            const E2 v =
                kVSmem ? *reinterpret_cast<const E2*>(st_v(st) + i * VS + cc) : vreg[nt][hr];
            const float cu = sc[kWyColU + i], cw = sc[kWyColW + i];
            split_bf16x2(fmaf(cu, Dtype<E>::to_float(v.x), -cw * d[nt][2 * hr]),
                         fmaf(cu, Dtype<E>::to_float(v.y), -cw * d[nt][2 * hr + 1]), h[hr], l[hr]);
          }
          stsm4(rdst + nt * 8, h[0], h[1], l[0], l[1]);
        }
        if (!kVSmem && ch + 1 < nch) load_v(ch + 1);  // consumed at the next chunk's step A
      }
      KLA_WY_MARK(2);
      named_bar_arrive(kWyBarR, kRThreads);    // R ready for the read-out warps
      named_bar_sync(kWyBarRec, kRecThreads);  // R visible to the recurrence warps
      KLA_WY_MARK(3);
      // Step B. X = diag(update) T R. Warps w and w + 4 share a scheduler: w takes row block w,
      // w + 4 row block 3 - w (other column half), so each scheduler has 5 k-blocks (at VS = 8,
      // one 8-column tile: warps 0-3 alone).
      if constexpr (kF16) {
        // Each column of X scaled by sigma (its largest magnitude over the step's row blocks),
        // kept in sigs for step C. Every recurrence warp meets the maxima's barrier at the same
        // instruction (bar.sync is aligned), so the products sit in conditionals around it.
        const bool bw = GROUPS == 2 || warp < 4;
        const int mi = warp < 4 ? warp : 7 - warp, n0 = (warp >> 2) * (VS / GROUPS);
        float xv[NH][4];
        if (bw) {
          float d[NH][3][4] = {};
          tri_split_times_split<NH, SP>(rec + R::th, rec + R::tl, Rh, Rl, mi, n0, d);
          const float w0 = sc[kWyScUpd + mi * 16 + g], w1 = sc[kWyScUpd + mi * 16 + g + 8];
#pragma unroll
          for (int nt = 0; nt < NH; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              xv[nt][e] = (e < 2 ? w0 : w1) *
                          (KLA_MUTANT(split_lo_dropped) ? d[nt][0][e] : parts_sum(d[nt], e));
          fragment_column_max(xv, colmax + mi * VS + n0, lane);
        }
        named_bar_sync(kWyBarRec, kRecThreads);  // the partial maxima
        if (bw) {
          const float mine = lane_column_scale<VS, 4>(colmax, lane);  // column lane's
          if (warp == 0 && lane < VS) sigs[lane] = mine;
#pragma unroll
          for (int nt = 0; nt < NH; ++nt) {
            float sig[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) sig[e] = __shfl_sync(~0u, mine, n0 + nt * 8 + 2 * t4 + e);
            store_tile_kmajor(Xs, mi * 16, n0 + nt * 8, sig[0] * xv[nt][0], sig[1] * xv[nt][1],
                              sig[0] * xv[nt][2], sig[1] * xv[nt][3]);
          }
          fence_proxy_async_shared();  // X for step C's wgmma, after the barrier
        }
      } else if (GROUPS == 2 || warp < 4) {
        const int mi = warp < 4 ? warp : 7 - warp, n0 = (warp >> 2) * (VS / GROUPS);
        float d[NH][3][4] = {};
        tri_split_times_split<NH, SP>(rec + R::th, rec + R::tl, Rh, Rl, mi, n0, d);
        const float w0 = sc[kWyScUpd + mi * 16 + g], w1 = sc[kWyScUpd + mi * 16 + g + 8];
        // (The mutant keeps the hi hi part alone.)
        auto x = [&](int nt, int e) {
          return KLA_MUTANT(split_lo_dropped) ? d[nt][0][e] : parts_sum(d[nt], e);
        };
#pragma unroll
        for (int nt = 0; nt < NH; ++nt)
          store_tile_kmajor(Xs, mi * 16, n0 + nt * 8, w0 * x(nt, 0), w0 * x(nt, 1), w1 * x(nt, 2),
                            w1 * x(nt, 3));
        if constexpr (kSave) {  // U = T R (rows mi * 16 + g (+8)), before the update scale
          __nv_bfloat16* const uv = saved_at(ch) + KD * KD;
#pragma unroll
          for (int nt = 0; nt < NH; ++nt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              // (The mutant keeps the update scale, X's rows instead of U's.)
              const float f = KLA_MUTANT(saved_u_update_scaled) ? (hr ? w1 : w0) : 1.f;
              *reinterpret_cast<__nv_bfloat162*>(uv + (mi * 16 + g + 8 * hr) * KD + n0 + nt * 8 +
                                                 2 * t4) =
                  __floats2bfloat162_rn(f * x(nt, 2 * hr), f * x(nt, 2 * hr + 1));
            }
        }
        fence_proxy_async_shared();  // X for step C's wgmma, after the barrier
      }
      KLA_WY_MARK(4);
      named_bar_sync(kWyBarRec, kRecThreads);  // X visible to the state warps
      KLA_WY_MARK(5);
      // Step C. S <- gamma_C S + K^T X (both warpgroups run the wgmma; the state warps keep
      // their block), split into the other buffer.
      {
        float sinv[SNJ][2];  // fp16: 1 / sigma of this thread's columns (the mutant: 1)
        if constexpr (kF16)
#pragma unroll
          for (int nj = 0; nj < SNJ; ++nj)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              sinv[nj][e] = KLA_MUTANT(wy_column_scale_missed)
                                ? 1.f
                                : pow2_inverse(sigs[scol + nj * 8 + 2 * t4 + e]);
        float d[SNJ][4];
        wg_times_split<C / 16, 2 * VS / SCS, NH, true, kImages, kAPanel, WE>(  // K^T X: K^T
            Kb, kALo, SCS == 2 ? 0 : (warp >> 2) * 64, Xs + 2 * scol * 128, 0, d);
        if (state_warp) {
          const float gend = sc[kWyGend];
          if constexpr (kF16)  // K^T (X diag(sigma)): undo sigma (exact)
#pragma unroll
            for (int nj = 0; nj < SNJ; ++nj)
#pragma unroll
              for (int e = 0; e < 4; ++e) d[nj][e] *= sinv[nj][e & 1];
#pragma unroll
          for (int nj = 0; nj < SNJ; ++nj)
#pragma unroll
            for (int e = 0; e < 4; ++e) sacc[nj][e] = fmaf(gend, sacc[nj][e], d[nj][e]);
          if constexpr (kF16)
            fragment_column_max(sacc, colmax + srow * VS + scol, lane);
          else
            store_state_split(sb ^ 1);  // read after the next chunk's first barrier
        }
        if constexpr (kF16) {
          named_bar_sync(kWyBarRec, kRecThreads);  // the state's partial maxima
          if (state_warp) store_state_split(sb ^ 1);
        }
      }
    } else if (warp < kWyRecWarps + kWyReadWarps) {
      // fp32: the first read-out warp is the producer; its copies before its share of the
      // read-out.
      if (!wy_own_producer(elem_of<E>()) && warp == kProducer) produce(ch);
      // Read-out of row block mi: O = diag(gamma qscale) Q S_ch + (P T) R, written out: Q S
      // while the recurrence warps form R, (P T) R once they have.
      const int mi = warp - kWyRecWarps;
      float o0[NJ][4];
      {
        float qinv[NJ][2];  // fp16: 1 / tau of this thread's columns
        if constexpr (kF16)
#pragma unroll
          for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              qinv[nj][e] = pow2_inverse(taus[sb * VS + nj * 8 + 2 * t4 + e]);
        float d[NJ][4];
        wg_times_split<KD / 16, 2 * VS, NH, false, kImages, kAPanel, WE>(Qb, kALo, 0, s_split(sb),
                                                                         2 * VS * 128, d);
        if constexpr (kF16)  // Q (S diag(tau)): undo tau
#pragma unroll
          for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[nj][e] *= qinv[nj][e & 1];
#pragma unroll
        for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
          for (int e = 0; e < 4; ++e) o0[nj][e] = sc[mi * 16 + g + (e >> 1) * 8] * d[nj][e];
      }
      named_bar_sync(kWyBarR, kRThreads);  // R of this chunk visible
      float d[NJ][3][4] = {};
      tri_split_times_split<NJ, SP>(rec + R::ph, rec + R::pl, Rh, Rl, mi, 0, d);
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = mi * 16 + g + hr * 8, cc = nj * 8 + 2 * t4;
          if (i >= L) continue;
          E2 pair;
          pair.x = Dtype<E>::from_float(o0[nj][2 * hr] + parts_sum(d[nj], 2 * hr));
          pair.y = Dtype<E>::from_float(o0[nj][2 * hr + 1] + parts_sum(d[nj], 2 * hr + 1));
          *reinterpret_cast<E2*>(obase + (tb + i) * p.os[1] + cc) = pair;
        }
#pragma unroll
      for (int i = 0; i < (kF16 ? 3 : 1); ++i)  // racecheck's count (see above; fp16: two more)
        named_bar_sync(kWyBarPadRead, kWyReadWarps * 32);
    } else {
      // bf16 / fp16's producer warp.
      produce(ch);
#pragma unroll
      for (int i = 0; i < (kF16 ? 4 : 2); ++i)  // racecheck's count (see above)
        named_bar_sync(kWyBarPadProducer, 32);
    }
  }

#ifdef KLA_WY_PROFILE
  if (prof_on) wy_profile_store(warp ? 1 : 0, prof, 7, nch);
#endif
  if (state_warp && slot.out) store_state_fragments(slot.out, V, srow * 16, c0, scol, g, t4, sacc);
#endif
}

}  // namespace kla::kernels
