// WY path, pass 2, transposed (bf16 / fp16, KLA_PATH_WY_TRANSPOSED):
// chunk_wy_scan_transposed_kernel, the state as wgmma's register operand.
//
// One block per (sequence, value head, 64 value columns). Its first warpgroup runs the chain with
// the state held transposed, S^T (64 value rows x KD keys, fp32), in its wgmma accumulators, so
// that every state product takes S^T (or R^T, X^T) as the A operand from registers and streams
// only B from shared memory: fewer shared-memory bytes and cycles a value column than the
// [token][column] scan; it pays where its 64-column blocks fill the GPU (docs/prefill_notes.md,
// 'Design decisions'). Each product runs as two independent m64n64 accumulator chains:
//   (K S)^T = S^T K^T, (Q S)^T = S^T Q^T     m64n64k16 x KD / 16 k-steps x S^T hi, lo
//   R^T = V^T diag(cu) - (K S)^T diag(cw)    (split hi + lo),  O^T = (Q S)^T diag(gamma qscale)
//   X^T = (R^T T^T) diag(update),  O^T += R^T (P T)^T   m64n64k16 x 4, parts hi hi, hi lo, lo hi
//   S^T <- gamma_C S^T + X^T K               per 64-key panel m64n64k16 x 4, K as MN-major B
// The second warpgroup issues the copies (its first warp), lays the next chunk's packed T and P T
// triangles out as one K-major B tile [T; P T] (128 rows x 64 tokens, 128-byte swizzle; two
// buffers), and writes out the O tile the chain leaves in shared memory. Laid out a chunk ahead,
// not beside the chain's K S: tiles written through the generic proxy just before the wgmma that
// read them slow that batch down (docs/prefill_notes.md, 'Design decisions'). Same record,
// scalars and arithmetic as chunk_wy_scan_kernel (every product of split operands keeps hi hi +
// hi lo + lo hi), in another order of summation.
//
// kFast (kla_params.arithmetic FAST, kla.h): S^T and X^T enter as one part, hi, rounded once to
// E (the products on T and P T keep their split): 48 state-product wgmma a chunk instead of 72,
// the output's error within FLA's on the same inputs (tools/state_precision_study.py models it;
// docs/accuracy.md measures it).
//
// fp16: K and Q are fp16 (not exact in bf16), so every product on them runs on the f16 wgmma with
// the other operand as fp16 hi + lo: S^T and X^T, each row (value column) scaled by a power of two
// into fp16's range first (fp16_range_scale), 22 bits where the bf16 split keeps 16. The scale of
// S^T is undone on (K S)^T and (Q S)^T; X^T's stays in the state: the accumulators hold
// diag(sig) S^T, sig the last X^T scale of the row, rescaled with the decay each chunk. The
// products on T and P T (record values) stay bf16 hi + lo, and the prep writes no K / Q images.
// (tools/state_precision_study.py: one fp16 part for S^T would give 3.2e-4 at alpha = 1, above the
// fp16 target.)
//
// kSave (bf16, FAST, K = V = 128; kla_chunk_forward_saving where the plan takes this scan): the
// chain also lays out what the backward would recompute (layout/saved_states.hpp) in a tile beside
// the O tile: each chunk's incoming S (from S^T's accumulators, while the tensor cores run K S) and
// U^T = R^T T^T before its update scale, both rounded to bf16 and stored transposed by stmatrix as
// O is; the helpers write them to p.saved with O's rows. Stores only: the outputs and the state are
// bitwise those of kSave = false.
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

// Named barriers: the chain's padding to the helpers' count of barrier waits a chunk (two:
// racecheck, see kWyBarPadRead); the chunk's O tile in shared memory (the chain arrives, the
// helpers wait and write it out).
constexpr int kWyTBarPad = 1, kWyTBarO = 2;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/// Fragment (k-step ks, register r) of an m64nN accumulator d as a register A operand split into
/// hi + lo of E (bf16, or fp16 for fp16 inputs): the pair (d[8 ks + 2 r], d[8 ks + 2 r + 1])
/// (wgmma.cuh; row g + 8 (r % 2) of the warp's 16), scaled by (sx, sy).
template <class E = __nv_bfloat16, int N>
__device__ __forceinline__ void split_fragment(const float (&d)[N], int ks, int r, float sx,
                                               float sy, uint32_t& hi, uint32_t& lo) {
  split_pair<E>(sx * d[8 * ks + 2 * r], sy * d[8 * ks + 2 * r + 1], hi, lo);
}
/// The largest magnitude in row g + 8 hr of this warp's 16 rows of m64n64 accumulators d[0..NA)
/// (element i is in row hr = (i / 2) % 2; a row's 64 columns lie in the four lanes of a quad).
template <int NA>
__device__ __forceinline__ float accumulator_row_max(const float (*d)[32], int hr) {
  float m = 0.f;
#pragma unroll
  for (int a = 0; a < NA; ++a)
#pragma unroll
    for (int i = 0; i < 32; ++i)
      if (((i >> 1) & 1) == hr) m = fmaxf(m, fabsf(d[a][i]));
  m = fmaxf(m, __shfl_xor_sync(~0u, m, 1));
  return fmaxf(m, __shfl_xor_sync(~0u, m, 2));
}
/// An m64n64 accumulator d of the chain warpgroup (element 4 nb + 2 hr + e: row 16 warp + g + 8 hr
/// of its 64, column 8 nb + 2 t4 + e) rounded to E and stored transposed into a [64][128 B] tile:
/// column j of d is the tile's row j, 16-byte piece pc of a row at pc ^ row % 8 (transposing
/// stmatrix, 8 x 8 block (nb, hr) a matrix; lane l addresses row l % 8 of block l / 8 of four).
template <class E>
__device__ __forceinline__ void store_tile_transposed(char* tile, const float (&d)[32], int warp,
                                                      int lane) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t r4[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int i = 4 * (2 * k + (m >> 1)) + 2 * (m & 1);
      r4[m] = Dtype<E>::pack2(d[i], d[i + 1]);
    }
    const int mm = lane >> 3, row = 8 * (2 * k + (mm >> 1)) + (lane & 7), pc = 2 * warp + (mm & 1);
    stsm4_t(tile + row * 128 + ((pc ^ (row & 7)) << 4), r4[0], r4[1], r4[2], r4[3]);
  }
}
#endif

template <class E, int KD, bool kFast, bool kSave = false>
__global__ void __launch_bounds__(kWyTThreads, 1)
    chunk_wy_scan_transposed_kernel(const KernelParams p, const char* __restrict__ ws,
                                    const __grid_constant__ CUtensorMap kmap,
                                    const __grid_constant__ CUtensorMap qmap,
                                    const __grid_constant__ CUtensorMap vmap) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>,
                "raw K / Q / V tiles as wgmma operands");
  static_assert(!kSave || (std::is_same_v<E, __nv_bfloat16> && kFast && KD == kSavedHeadDim),
                "saved states: bf16, FAST, K = V = 128 (layout/saved_states.hpp)");
  static_assert(!kSave || wy_t_saving_smem_bytes(KD) <= kSm90MaxSmem, "the save tile fits");
  constexpr bool kF16 = std::is_same_v<E, __half>;
  using R = WyRecord;
  constexpr int C = kChunk, VS = 64, kPanels = (KD + 63) / 64, KS = KD / 16;
  constexpr int kPanelKQ = 2 * C * 128,
                kTpt = 2 * C * 128;  // bytes: a K | Q panel, a [T; P T] part
  constexpr int64_t kStage = wy_t_stage_bytes(KD);
  static_assert(R::bytes % 1024 == 0 && kStage % 1024 == 0, "swizzled tiles need 1024 B alignment");
  extern __shared__ __align__(1024) char smem[];
  auto st_rec = [&](int st) { return smem + st * kStage; };
  auto st_kq = [&](int st) { return smem + st * kStage + R::bytes; };
  auto st_v = [&](int st) { return smem + st * kStage + R::bytes + kPanels * kPanelKQ; };
  // [T; P T] of chunk ch in buffer ch % 2: hi part, then lo part.
  auto tpt = [&](int b) { return smem + 2 * kStage + b * 2 * kTpt; };
  char* otile = tpt(2);  // O, [token][64 columns], 16-byte piece c of row r at c ^ r % 8
  auto* full = reinterpret_cast<uint64_t*>(otile + C * 128);
  // kSave: chunk ch's S (rows 0..KD-1, key k) and U (rows KD.., token) for the helpers' stores,
  // 64 value columns of 128 B a row, swizzled as the O tile.
  char* const save_tile = smem + wy_t_save_tile_offset(KD);

  const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(~0u, tid >> 5, 0);
  const int g = lane >> 2, t4 = lane & 3;
  const int V = p.V, nslices = V / VS;
  const ScanTile blk = scan_tile(p, KD, V, VS);
  if (blk.slot.skip) return;  // pool index -1: nothing read, nothing written
  const int slice = blk.slice, hv = blk.hv, n = blk.n, h = blk.h, c0 = blk.c0;
  const StateSlot slot = blk.slot;
  const SeqRange sr = blk.sr;
  const int nch = int((sr.len + C - 1) / C);
  const int64_t rec_bytes = p.ws_record_floats * 4;
  const bool chain = warp < 4;
  // kSave: chunk ch's saved record (S [KD][V], then U [C][V]) at this block's first column.
  auto saved_at = [&](int ch) {
    return static_cast<__nv_bfloat16*>(p.saved) +
           (chunk_slot(p, n, sr, ch) * p.HV + hv) * saved_record_elems(KD, KD) + c0;
  };

  // The blocks of [T; P T] above the diagonal stay zero: each chunk writes only the packed
  // triangles' blocks.
  for (int i = tid; i < 4 * kTpt / 16; i += kWyTThreads)
    reinterpret_cast<uint4*>(tpt(0))[i] = make_uint4(0, 0, 0, 0);
  if (tid == 0) {
    mbar_init(&full[0], 1);
    mbar_init(&full[1], 1);
  }
  // S^T as one m64n64 accumulator a 64-key panel (two independent wgmma chains in the update):
  // element 4 nb + 2 hr + e of panel pn is value column c0 + 16 w + g + 8 hr, key 64 pn + 8 nb +
  // 2 t4 + e (keys past KD stay zero: their K columns are zero).
  float sT[kPanels][32];
  load_state_transposed<KD, kPanels>(sT, chain, slot.in, V, c0, warp, g, t4);
  // S^T split into hi + lo as the register A fragments of K S | Q S (k-step ks: keys 16 ks..),
  // made for chunk ch + 1 as soon as chunk ch's update lands, before the stage wait and the chunk
  // barrier rather than after them (docs/prefill_notes.md, 'Design decisions').
  // fp16: the accumulators hold row hr of S^T times sig[hr] (a power of two; 1 until the first
  // update), and kinv[hr] undoes the scale the split applied on (K S)^T and (Q S)^T. bf16: both
  // stay 1 (multiplications by them fold away).
  float sig[2] = {1.f, 1.f}, kinv[2] = {1.f, 1.f};
  uint32_t ah[KS][4], al[KS][4];
  auto split_state = [&] {
    float tau[2] = {1.f, 1.f};
    if constexpr (kF16) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        tau[hr] = fp16_range_scale(accumulator_row_max<kPanels>(sT, hr));
        kinv[hr] = pow2_inverse(tau[hr] * sig[hr]);
      }
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        split_fragment<E>(sT[ks >> 2], ks & 3, r, tau[r & 1], tau[r & 1], ah[ks][r], al[ks][r]);
  };
  if (chain) split_state();
  fence_proxy_async_shared();  // the zeroed [T; P T] for the tensor cores
  __syncthreads();

  constexpr int kAhead = 3;
  auto issue = [&](int st, int ch) {
    const char* rec = ws + (chunk_slot(p, n, sr, ch) * p.HV + hv) * rec_bytes;
    mbar_expect_tx(&full[st], unsigned(R::bytes + kPanels * kPanelKQ + C * 128));
    bulk_load(st_rec(st), rec, unsigned(R::bytes), &full[st]);
    const int t0 = int(sr.t0 + int64_t(ch) * C);
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      tile_load(st_kq(st) + pn * kPanelKQ, &kmap, pn * 64, t0, h, int(sr.b), &full[st]);
      tile_load(st_kq(st) + pn * kPanelKQ + C * 128, &qmap, pn * 64, t0, h, int(sr.b), &full[st]);
    }
    tile_load(st_v(st), &vmap, c0, t0, hv, int(sr.b), &full[st]);
  };
  // L2 prefetch of chunk cf's record and K / Q rows, each slice of the head a share of the lines.
  auto prefetch_l2 = [&](int cf) {
    prefetch_share_l2(ws + (chunk_slot(p, n, sr, cf) * p.HV + hv) * rec_bytes, int(R::bytes / 128),
                      slice, nslices, lane);
    prefetch_kq_rows_l2<E, KD>(p, sr, h, cf, slice, nslices, lane);
  };
  // [T; P T] of chunk ch from its record's packed triangles, by the helpers: 16-byte piece r of
  // part q (T hi, T lo, P T hi, P T lo) is 8 columns j0.. of row i (wy_packed_offset), row i (T)
  // or 64 + i (P T) of the tile, 16-byte piece j0 / 8 ^ row % 8 of it. Waits for the stage.
  auto lay_out_tpt = [&](int ch) {
    const int st = ch & 1;
    mbar_wait(&full[st], unsigned(ch >> 1) & 1u);
    const char* rec = st_rec(st);
    char* dst = tpt(st);
    for (int q = tid - kWyTChainThreads; q < 4 * int(R::tile / 16);
         q += kWyTThreads - kWyTChainThreads) {
      const int part = q / int(R::tile / 16), r = q % int(R::tile / 16);
      const int b = r >> 5, m = (r >> 3) & 3, mi = b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3;
      const int i = mi * 16 + (m & 1) * 8 + (r & 7),
                j0 = (b - mi * (mi + 1) / 2) * 16 + (m >> 1) * 8;
      const int row = i + (part >> 1) * C;
      *reinterpret_cast<uint4*>(dst + (part & 1) * kTpt + row * 128 +
                                (((j0 >> 3) ^ (row & 7)) << 4)) =
          *reinterpret_cast<const uint4*>(rec + part * R::tile + r * 16);
    }
    fence_proxy_async_shared();  // for the wgmma reads after the next chunk barrier
  };
  if (warp == 4) {
    for (int cf = 1; cf < kAhead && cf < nch; ++cf) prefetch_l2(cf);
    if (nch > 0 && lane == 0) issue(0, 0);
  }
  if (!chain && nch > 0) lay_out_tpt(0);
  E* obase = static_cast<E*>(p.o) + sr.b * p.os[0] + int64_t(hv) * p.os[2] + c0;

#ifdef KLA_WY_PROFILE
  const bool prof_on = blockIdx.x == 0 && tid == 0;
  long long prof[7] = {}, prof_t = clock64();
#endif
  for (int ch = 0; ch < nch; ++ch) {
    const int st = ch & 1;
    const int64_t cs0 = int64_t(ch) * C;
    const int L = int(sr.len - cs0 < C ? sr.len - cs0 : C);
    mbar_wait(&full[st], unsigned(ch >> 1) & 1u);
    KLA_WY_MARK(0);
    // A last chunk: key rows past the sequence end may hold the next sequence's tokens; zero
    // them (K enters K S and S's update; query rows there reach only outputs not written).
    if (L < C && chain) {
      for (int idx = tid; idx < kPanels * (C - L) * 8; idx += kWyTChainThreads) {
        const int pn = idx / ((C - L) * 8), rem = idx % ((C - L) * 8);
        reinterpret_cast<uint4*>(st_kq(st) + pn * kPanelKQ + (L + rem / 8) * 128)[rem % 8] =
            make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async_shared();
    }
    // Chunk ch's stage and [T; P T] visible to all; every read of the other stage and [T; P T]
    // buffer is done.
    __syncthreads();
    KLA_WY_MARK(1);
    const char* rec = st_rec(st);
    const float* sc = reinterpret_cast<const float*>(rec + R::sc);
    if (!chain) {
      if (warp == 4) {
        if (lane == 0 && ch + 1 < nch) issue(st ^ 1, ch + 1);
        if (ch + kAhead < nch) prefetch_l2(ch + kAhead);
      }
      if (ch + 1 < nch) lay_out_tpt(ch + 1);
      // The chunk's O rows, 16 bytes a store (coalesced: 8 threads a row).
      named_bar_sync(kWyTBarO, kWyTThreads);
      E* orow = obase + (sr.t0 + cs0) * p.os[1];
      for (int q = tid - kWyTChainThreads; q < C * 8; q += kWyTThreads - kWyTChainThreads) {
        const int row = q >> 3, pc = q & 7;
        if (row < L)
          *reinterpret_cast<uint4*>(orow + row * p.os[1] + pc * 8) =
              *reinterpret_cast<const uint4*>(otile + row * 128 + ((pc ^ (row & 7)) << 4));
      }
      if constexpr (kSave) {  // S then U: rows of the tile are rows of the record, pitch V
        __nv_bfloat16* const sv = saved_at(ch);
        for (int q = tid - kWyTChainThreads; q < (KD + C) * 8;
             q += kWyTThreads - kWyTChainThreads) {
          const int row = q >> 3, pc = q & 7;
          *reinterpret_cast<uint4*>(sv + int64_t(row) * V + pc * 8) =
              *reinterpret_cast<const uint4*>(save_tile + row * 128 + ((pc ^ (row & 7)) << 4));
        }
      }
      continue;
    }
    // (K S)^T = S^T K^T and (Q S)^T = S^T Q^T, two independent accumulator chains issued in
    // turn; S^T enters split (hi, then lo, each k-step: ah, al).
    float accK[32], accQ[32];
    {
#pragma unroll
      for (int i = 0; i < 32; ++i) accK[i] = accQ[i] = 0.f;
      wgmma_reg_fence(accK);
      wgmma_reg_fence(accQ);
      wgmma_fence();
      const uint64_t bd0 = wgmma_desc_sw128(st_kq(st));
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const uint64_t bk = wgmma_desc_advance(bd0, (ks >> 2) * kPanelKQ + (ks & 3) * 32);
        const uint64_t bq = wgmma_desc_advance(bk, C * 128);
        wgmma_rs_n64<0, E>(accK, ah[ks], bk);
        wgmma_rs_n64<0, E>(accQ, ah[ks], bq);
        if constexpr (!kFast) {
          wgmma_rs_n64<0, E>(accK, al[ks], bk);
          wgmma_rs_n64<0, E>(accQ, al[ks], bq);
        }
      }
      wgmma_commit();
      // kSave: the state entering this chunk, while the tensor cores form K S and Q S (S^T's
      // accumulators are not their operands: ah is).
      if constexpr (kSave)
#pragma unroll
        for (int pn = 0; pn < kPanels; ++pn)
          store_tile_transposed<E>(save_tile + pn * 64 * 128, sT[pn], warp, lane);
      wgmma_wait<0>();
      wgmma_reg_fence(accK);
      wgmma_reg_fence(accQ);
    }
    KLA_WY_MARK(2);
    // R^T split as register A fragments (k-step = 16 tokens); V^T's pairs by transposing
    // ldmatrix from the swizzled V tile (matrix r: tokens 16 ks + 8 (r / 2).., columns 16 w + 8 (r
    // % 2)..; lane l addresses token row l % 8 of matrix l / 8).
    uint32_t rh[4][4], rl[4][4];
    float accO[32];
    {
      const char* vt = st_v(st);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t vv[4];
        const int mm = lane >> 3, i = 16 * ks + 8 * (mm >> 1) + (lane & 7),
                  pc = 2 * warp + (mm & 1);
        ldsm4_t(vv, vt + i * 128 + ((pc ^ (i & 7)) << 4));
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i0 = 16 * ks + 8 * (r >> 1) + 2 * t4;
          const float2 cu = *reinterpret_cast<const float2*>(sc + kWyColU + i0);
          const float2 cw = *reinterpret_cast<const float2*>(sc + kWyColW + i0);
          const float2 v = Dtype<E>::unpack2(vv[r]);
          const float ki = kinv[r & 1];
          split_bf16x2(fmaf(cu.x, v.x, -cw.x * (ki * accK[8 * ks + 2 * r])),
                       fmaf(cu.y, v.y, -cw.y * (ki * accK[8 * ks + 2 * r + 1])), rh[ks][r],
                       rl[ks][r]);
        }
      }
#pragma unroll
      for (int i = 0; i < 32; ++i)
        accO[i] = sc[8 * (i >> 2) + 2 * t4 + (i & 1)] * (kinv[(i >> 1) & 1] * accQ[i]);
    }
    KLA_WY_MARK(3);
    // X^T (before its update scale) = R^T T^T and O^T += R^T (P T)^T, two accumulator chains
    // issued in turn.
    float accX[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) accX[i] = 0.f;
    named_bar_sync(kWyTBarPad, kWyTChainThreads);  // racecheck's count (see above)
    wgmma_reg_fence(accX);
    wgmma_reg_fence(accO);
    wgmma_fence();
    {
      const uint64_t th = wgmma_desc_sw128(tpt(st)), tl = wgmma_desc_sw128(tpt(st) + kTpt);
      // B: rows 0.. of the tile (T) or C.. (P T); parts hi hi, hi lo, lo hi each k-step.
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const int off = ks * 32, offp = C * 128 + ks * 32;
        wgmma_rs_bf16<0>(accX, rh[ks], wgmma_desc_advance(th, off));
        wgmma_rs_bf16<0>(accO, rh[ks], wgmma_desc_advance(th, offp));
        wgmma_rs_bf16<0>(accX, rh[ks], wgmma_desc_advance(tl, off));
        wgmma_rs_bf16<0>(accO, rh[ks], wgmma_desc_advance(tl, offp));
        wgmma_rs_bf16<0>(accX, rl[ks], wgmma_desc_advance(th, off));
        wgmma_rs_bf16<0>(accO, rl[ks], wgmma_desc_advance(th, offp));
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
    wgmma_reg_fence(accX);
    wgmma_reg_fence(accO);
    KLA_WY_MARK(4);
    // S^T <- gamma_C S^T + X^T K, X^T = U^T diag(update) split. fp16: X^T's rows scaled into
    // fp16's range first (sig), the state's rows rescaled to match with the decay.
    {
      uint32_t xh[4][4], xl[4][4];
      const float gend = sc[kWyGend];
      float gsc[2] = {gend, gend};
      // kSave: U^T = R^T T^T, before the update scale (the mutant: after it, X^T's rows).
      if constexpr (kSave)
        if (!KLA_MUTANT(saved_u_update_scaled_transposed))
          store_tile_transposed<E>(save_tile + KD * 128, accX, warp, lane);
#pragma unroll
      for (int i = 0; i < 32; ++i) accX[i] *= sc[kWyScUpd + 8 * (i >> 2) + 2 * t4 + (i & 1)];
      if constexpr (kSave)
        if (KLA_MUTANT(saved_u_update_scaled_transposed))
          store_tile_transposed<E>(save_tile + KD * 128, accX, warp, lane);
      if constexpr (kF16) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const float m = accumulator_row_max<1>(&accX, hr);
          const float sn =
              m == 0.f ? sig[hr] : fminf(fmaxf(fp16_range_scale(m), 0x1p-32f), 0x1p32f);
          gsc[hr] =
              KLA_MUTANT(transposed_rescale_missed) ? gend : gend * (sn * pow2_inverse(sig[hr]));
          sig[hr] = sn;
        }
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          split_fragment<E>(accX, ks, r, sig[r & 1], sig[r & 1], xh[ks][r], xl[ks][r]);
#pragma unroll
      for (int pn = 0; pn < kPanels; ++pn) {
#pragma unroll
        for (int i = 0; i < 32; ++i) sT[pn][i] *= gsc[(i >> 1) & 1];
        wgmma_reg_fence(sT[pn]);
      }
      wgmma_fence();
      // K as the MN-major B operand: k = tokens (16 rows, 2048 B, a k-step), n = the panel's 64
      // keys; one accumulator chain a panel, issued in turn.
      const uint64_t kd0 = wgmma_desc_sw128(st_kq(st));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int part = 0; part < (kFast ? 1 : 2); ++part)
#pragma unroll
          for (int pn = 0; pn < kPanels; ++pn)
            wgmma_rs_n64<1, E>(sT[pn], part ? xl[ks] : xh[ks],
                               wgmma_desc_advance(kd0, pn * kPanelKQ + ks * 2048));
      wgmma_commit();
      KLA_WY_MARK(5);
      // O^T into the O tile [token][64 columns] by transposing stmatrix, for the helpers to write
      // out 16 bytes a store, off the chain (docs/prefill_notes.md, 'Design decisions').
      store_tile_transposed<E>(otile, accO, warp, lane);
      named_bar_arrive(kWyTBarO, kWyTThreads);
      wgmma_wait<0>();
#pragma unroll
      for (int pn = 0; pn < kPanels; ++pn) wgmma_reg_fence(sT[pn]);
      split_state();  // for chunk ch + 1
      KLA_WY_MARK(6);
    }
  }
#ifdef KLA_WY_PROFILE
  if (prof_on) wy_profile_store(0, prof, 7, nch);
#endif
  if (chain && slot.out) store_state_transposed<KD, kPanels>(slot.out, V, c0, warp, g, t4, sT, sig);
#endif
}

}  // namespace kla::kernels
