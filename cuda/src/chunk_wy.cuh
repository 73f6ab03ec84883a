// WY chunkwise path (prefill) for bf16 / fp16 storage, and fp32 with kla_params.fp32_math FAST,
// on sm_90a: bf16 tensor cores with every fp32 intermediate split into hi + lo, the scan reduced
// to the state-dependent products.
//
// Same mathematics as chunk_fast.cuh (SPEC §1 chunk form in the normalised-key form, chunks of
// C = 64), with the chunk system's inverse formed ahead of the scan (paper App. B, WY form):
//   R = diag(beta kscale) (V - D_gamma K S)           (the chunk's innovation, needs S)
//   U = T R,   T = (I + B(A^- o K^K^T))^-1            (per chunk, no S)
//   O = diag(gamma qscale) Q S + (P T) R,   P = the masked read-out matrix
//   S <- gamma_C S + K^T diag(kscale gamma_C / gamma_j) U
//
//  1. chunk_wy_prep_kernel, fully parallel over (sequence, chunk, value head): K K^T and Q K^T
//     (bf16 / fp16: one m64n64 wgmma chain a warpgroup on the K and Q tiles loaded in the
//     128-byte swizzle; fp32: split TF32 on mma.sync), the per-token scalars, T exactly as the
//     TF32 path (invert_unit_lower: fp32 diagonal blocks, the blocks below on the tensor cores in
//     split TF32) and P T (fp32 P and T entering the tensor cores split), written split into the
//     workspace record (workspace.hpp): their lower 16 x 16
//     blocks only, packed in ldmatrix order, 22 KB whatever the head dims. fp16 / fp32: also the
//     chunk's K and Q tiles split into bf16 hi + lo, as the scan's wgmma operand images
//     (write_wy_images), once per key head, so that the value slices do not each split them
//     (not for the transposed scan, which reads fp16 K / Q as they are).
//     4 blocks a multiprocessor (64 registers, 53 KB of shared memory at K = 128; fp32 3).
//  2. chunk_wy_scan_kernel, one block per (sequence, value head, VS = 8, 16 or 32 value
//     columns: 8 only where 16 would leave more than half the multiprocessors idle), chunks in
//     order, warps in three roles:
//       8 recurrence warps (the chain from chunk to chunk; warpgroups 0 and 1): A. R = diag(cu) V
//         - diag(cw) K S (warpgroup j: column half j, at VS = 8 warpgroup 0 alone; warp w rows
//         16 (w % 4)); B. X =
//         diag(update) T R; C. S <- gamma_C S + K^T X, the state in the accumulators of the
//         warps that own its blocks, written split into the other of two shared buffers;
//       4 read-out warps (off the chain; warpgroup 2): Q S_ch while R forms, then O =
//         diag(gamma qscale) Q S_ch + (P T) R once it has (a named barrier the recurrence warps
//         only arrive at);
//       the producer (bf16: a 13th warp; fp16 / fp32: the first read-out warp) issues the next
//         chunk's copies (record by one bulk copy; bf16 K / Q as
//         128-byte swizzled boxes by tensor copies, fp16 / fp32 the prep's images of them by one
//         bulk copy; V's slice by a tensor copy) into a two-stage ring (three at bf16 VS = 8,
//         wy_scan_stages: copies then issued two chunks ahead), and L2 prefetches further
//         ahead. Where the stages have no room for V (fp16 / fp32 at VS = 32, wy_v_in_smem), V
//         goes from global memory to the recurrence warps' registers a chunk ahead instead.
//     K S, Q S and K^T X run on wgmma (wgmma.cuh) with both operands in shared memory: the K / Q
//     boxes as the TMA leaves them or the images (K^T as the M-major view), S and X as split
//     K-major tiles whose rows hold each column group of the slice as hi rows then lo rows
//     (wy_split_row), so one wgmma gives both parts; they are written from the accumulators by
//     transposing stmatrix. T R and (P T) R stay on mma.sync (packed triangular records).
//     One __syncthreads per chunk frees the stage and the state buffer that the last chunk read.
//  2'. chunk_wy_scan_transposed_kernel (bf16 / fp16, 64 value columns a block, where those blocks
//     fill the GPU): the state transposed in the chain's wgmma accumulators and taken as the
//     register A operand (its section below).
//
// Precision. The products are bf16 with fp32 accumulation. Raw bf16 inputs are exact operands;
// fp16 K / Q enter as bf16 hi + lo (exact), fp32 K / Q (fp32_math FAST) as hi + lo (16
// significant bits, the only rounding of an input: ~5e-6 relative RMS on the accuracy test, up
// to ~2e-5 with colinear keys, docs/accuracy.md; the default TF32 path keeps ~5e-7 at about 3x
// the time), and both parts enter the products (the transposed scan's fp16 products on K / Q
// run on fp16 wgmma instead, with S and X as fp16 hi + lo, 22 bits, scaled per value column); fp32
// intermediates (S, R, X, T, P T) as hi = bf16(x), lo = bf16(x - hi), 16 significant bits
// together, and a product of two split operands keeps hi*hi + hi*lo + lo*hi (relative error
// ~2^-16, far below the bf16 / fp16 storage roundoff that bounds the outputs). V and the
// norms are used in fp32 as given (K K^T, whose diagonal gives the norms, is exact for bf16 /
// fp16 inputs and split TF32, ~2^-21, for fp32). The inverse stays fp32-grade (split TF32,
// ~2^-21; see prefill_notes.md: a low-precision inverse is a known weak point).
// Deterministic: fixed orders, no atomics.
#pragma once

#include <type_traits>
#ifdef KLA_WY_PROFILE
#include <cstdio>
#endif

#include <cudaTypedefs.h>

#include "bf16_mma.cuh"
#include "chunk_fast.cuh"
#include "wgmma.cuh"
#include "workspace.hpp"

namespace kla::kernels {

// KLA_WY_PROFILE (a development build only): block 0 of the scan records the cycles per chunk
// that warp 0 (recurrence) and warp 8 (read-out; the transposed scan: warp 0 only) spend in each
// phase, and a kernel launched after it prints them. Not printf in the scan itself: a kernel
// that calls printf has every wgmma serialised by ptxas (a wait after each), and the phases
// measured there (sessions 3-10 until w60) overstate the products (prefill_notes.md, w60).
#ifdef KLA_WY_PROFILE
#define KLA_WY_MARK(k) \
  if (prof_on) prof[k] += clock64() - prof_t, prof_t = clock64()
/// [row: warp 0, warp 8][phase 0-6 (7 unused), then the chunk count].
static __device__ long long g_wy_profile[2][9];  // one per translation unit
static __global__ void wy_profile_print_kernel(int transposed) {
  for (int row = 0; row < (transposed ? 1 : 2); ++row) {
    const long long* v = g_wy_profile[row];
    const long long n = v[8] > 0 ? v[8] : 1;
    if (transposed)
      printf(
          "wy64 scan block 0 warp 0, cycles per chunk (%lld chunks): wait %lld, barrier0 %lld, "
          "KS|QS %lld, R %lld, X|O %lld, update issue %lld, O tile + update wait %lld\n",
          v[8], v[0] / n, v[1] / n, v[2] / n, v[3] / n, v[4] / n, v[5] / n, v[6] / n);
    else
      printf(
          "wy scan block 0 warp %d, cycles per chunk (%lld chunks): wait %lld, barrier0 %lld, "
          "stepA %lld, barrierA %lld, stepB %lld, barrierB %lld, stepC %lld\n",
          row ? 8 : 0, v[8], v[0] / n, v[1] / n, v[2] / n, v[3] / n, v[4] / n, v[5] / n, v[6] / n);
  }
}
/// Block 0's phases into g_wy_profile (the thread that measured).
__device__ __forceinline__ void wy_profile_store(int row, const long long* prof, int phases,
                                                 int nch) {
  for (int k = 0; k < 8; ++k) g_wy_profile[row][k] = k < phases ? prof[k] : 0;
  g_wy_profile[row][8] = nch;
}
#else
#define KLA_WY_MARK(k)
#endif

constexpr int kWyThreads = 256;  // prep
// Warp roles of the scan: 8 recurrence warps (R, X and the state: the chain from chunk to
// chunk), 4 read-out warps (O, off the chain), and the producer, which issues the copies: for
// bf16 a warp of its own (its five tensor copies a chunk, on a read-out warp, made the scan 14%
// slower), for fp16 / fp32 (one bulk copy of the images) the first read-out warp (one warp
// fewer on its scheduler: 1-5% faster; prefill_notes.md, w42).
constexpr int kWyRecWarps = 8, kWyReadWarps = 4;
template <class E>
constexpr bool wy_own_producer() {
  return std::is_same_v<E, __nv_bfloat16>;
}
template <class E>
constexpr int wy_producer_warp() {
  return kWyRecWarps + (wy_own_producer<E>() ? kWyReadWarps : 0);
}
template <class E>
constexpr int wy_scan_threads() {
  return (kWyRecWarps + kWyReadWarps + (wy_own_producer<E>() ? 1 : 0)) * 32;
}
// Named barriers (0 is __syncthreads): R ready for the read-out warps (the recurrence warps
// arrive, the read-out warps wait), the recurrence warps among themselves (R, then X), and two
// that pad the read-out warps and a producer warp of its own to as many barrier waits per chunk
// as the recurrence warps (3):
// compute-sanitizer racecheck behaves as if it ordered two warps' accesses by how many barriers
// each has waited at (prefill_notes.md, w18), and without the padding reports accesses ordered by
// the chunk's __syncthreads as hazards.
constexpr int kWyBarR = 1, kWyBarRec = 2, kWyBarPadRead = 3, kWyBarPadProducer = 4;
// Record scalars (floats): [0,64) gamma qscale, [64,128) update scale kscale gamma_L / gamma_i
// (0 past the chunk end), [128] gamma_L, [256,320) beta kscale, [320,384) beta kscale gamma.
constexpr int kWyScUpd = 64, kWyGend = 128, kWyColU = 256, kWyColW = 320, kWyScalars = 512;

/// Byte offsets inside one WY record (must agree with workspace.hpp): four packed lower
/// triangles of 16 x 16 blocks (wy_packed_offset), then the scalars.
struct WyRecord {
  static constexpr int64_t block = 16 * 16 * 2, tile = 10 * block;
  static constexpr int64_t th = 0, tl = tile, ph = 2 * tile, pl = 3 * tile, sc = 4 * tile,
                           bytes = sc + kWyScalars * 4;
  static_assert(bytes == kla::detail::kWyRecordBytes, "workspace.hpp layout");
};

/// Byte offset of element (i, j), j <= i's block, of a packed lower-triangular 64 x 64 bf16
/// tile: block (i / 16, j / 16) at index mi(mi+1)/2 + kb, inside it the four 8 x 8 matrices of an
/// A fragment in ldmatrix order (rows 0-7 | 8-15 of columns 0-7, then of columns 8-15), rows of
/// 16 B. Lane l of an ldmatrix.x4 then reads the block's bytes [16 l, 16 l + 16): one 512-byte
/// sweep, conflict-free, and the blocks above the diagonal (zero) take no room.
__device__ __forceinline__ int wy_packed_offset(int i, int j) {
  const int mi = i >> 4, kb = j >> 4;
  return (mi * (mi + 1) / 2 + kb) * int(WyRecord::block) + (((i >> 3) & 1) + ((j >> 2) & 2)) * 128 +
         (i & 7) * 16 + (j & 7) * 2;
}

/// Issues cp.async copies of rows [0, kFC) of a [.., T, head, NCOLS] tensor (row stride rs, first
/// row at src) into dst (pitch DP elements); rows >= L are zero-filled. Not committed. Called by
/// all kWyThreads threads. When whole rows fit a pass, thread tid keeps one 16-byte column piece
/// and steps rows (no index arithmetic per copy); otherwise it takes pieces tid, tid +
/// kWyThreads, ... with (row, piece) stepped, not divided.
template <class E, int NCOLS>
__device__ __forceinline__ void load_rows_async(E* dst, int DP, const E* src, int64_t rs, int L) {
  constexpr int VE = int(16 / sizeof(E)), nv = NCOLS / VE;
  if constexpr (kWyThreads % nv == 0 && kFC % (kWyThreads / nv) == 0) {
    constexpr int di = kWyThreads / nv;
    const int r = (int(threadIdx.x) % nv) * VE, i0 = int(threadIdx.x) / nv;
    // The source offset is stepped by di rows, not multiplied per row (64-bit products).
    const int64_t step = int64_t(di) * rs;
    int64_t off = int64_t(i0) * rs + r;
#pragma unroll
    for (int k = 0; k < kFC / di; ++k, off += step) {
      const int i = i0 + k * di;
      cp16(dst + i * DP + r, src + (i < L ? off : int64_t(r)), i < L);
    }
  } else {
    constexpr int di = kWyThreads / nv, dr = (kWyThreads - di * nv) * VE;
    int i = int(threadIdx.x) / nv, r = (int(threadIdx.x) - i * nv) * VE;
    while (i < kFC) {
      cp16(dst + i * DP + r, src + int64_t(i < L ? i : 0) * rs + r, i < L);
      i += di, r += dr;
      if (r >= NCOLS) r -= NCOLS, ++i;
    }
  }
}

/// Issues cp.async copies of rows [0, kFC) of a 2-byte [.., T, head, KD] tensor (row stride rs,
/// first row at src) into dst as the wgmma K-major layout: 64-column panels of kFC rows x 128 B,
/// 16-byte piece c of row r at c ^ r % 8 (the 128-byte swizzle of the TMA boxes). Rows >= L and
/// columns >= KD (the last panel's tail) are zero-filled. Not committed. Called by all kWyThreads
/// threads.
template <class E, int KD>
__device__ __forceinline__ void load_rows_sw128(void* dst, const E* src, int64_t rs, int L) {
  static_assert(sizeof(E) == 2, "8 elements a piece");
  constexpr int nv = (KD + 63) / 64 * 8, di = kWyThreads / nv;  // pieces a row, rows a pass
  static_assert(kWyThreads % nv == 0 && kFC % di == 0, "whole rows a pass");
  const int c = int(threadIdx.x) % nv, i0 = int(threadIdx.x) / nv;
  const bool col_in = c * 8 < KD;
  // The source offset is stepped by di rows, not multiplied per row (64-bit products).
  const int64_t step = int64_t(di) * rs;
  int64_t off = int64_t(i0) * rs + (col_in ? c * 8 : 0);
  char* d = static_cast<char*>(dst);
#pragma unroll
  for (int k = 0; k < kFC / di; ++k, off += step) {
    const int i = i0 + k * di;
    cp16(d + kmajor_sw128_offset(i, c * 8, kFC), src + (i < L ? off : 0), i < L && col_in);
  }
}

// ---- pass 1: per-chunk preparation ----------------------------------------------------------

/// Chunk slot `slot`'s K image (its Q image follows) for key head h in the workspace
/// (workspace.hpp; images of KD-column tiles).
template <int KD>
__device__ __forceinline__ char* wy_image_pair(const KernelParams& p, int64_t slot, int h) {
  return p.ws_images + (slot * p.H + h) * (2 * kla::detail::wy_image_bytes(KD, true));
}

/// fp16 / fp32: the chunk's K and Q tiles (raw in shared memory, rows past the chunk zero; fp16:
/// swizzled panels as load_rows_sw128 leaves them, fp32: rows of pitch KP) as the scan's wgmma A
/// operands, split into bf16 hi + lo: a K image then a Q image at dst (workspace.hpp), each
/// 64-column panel as its hi panel then its lo panel, 64 rows x 128 B with the 128-byte swizzle
/// (16-byte piece c of row r at c ^ r % 8), columns past KD zero. fp16 values are exact in hi +
/// lo; fp32 keep 16 significant bits (relative error <= 2^-17). Piece order: 8 consecutive
/// threads fill one 128-byte line. Called by all kWyThreads threads.
template <class E, int KD>
__device__ __forceinline__ void write_wy_images(const E* Kr, const E* Qr, int KP, char* dst) {
  constexpr int kPanels = (KD + 63) / 64, kPieces = kFC * kPanels * 8, kPanel = kFC * 128;
  constexpr int64_t kImage = 2LL * kPanels * kPanel;
  static_assert(kImage == kla::detail::wy_image_bytes(KD, true), "workspace.hpp's image size");
  for (int idx = int(threadIdx.x); idx < 2 * kPieces; idx += kWyThreads) {
    const bool isq = idx >= kPieces;
    const int q = isq ? idx - kPieces : idx, row = q / (kPanels * 8), pn = (q >> 3) % kPanels,
              c = q & 7, k0 = pn * 64 + c * 8;
    const int line = kmajor_sw128_offset(row, k0, kFC);  // in the tile, or in a part's panels
    uint4 hi = make_uint4(0, 0, 0, 0), lo = hi;
    if (k0 < KD) {
      if constexpr (std::is_same_v<E, float>) {
        const E* src = (isq ? Qr : Kr) + row * KP + k0;
        const float4 a = *reinterpret_cast<const float4*>(src);
        const float4 b = *reinterpret_cast<const float4*>(src + 4);
        split_bf16x2(a.x, a.y, hi.x, lo.x);
        split_bf16x2(a.z, a.w, hi.y, lo.y);
        split_bf16x2(b.x, b.y, hi.z, lo.z);
        split_bf16x2(b.z, b.w, hi.w, lo.w);
      } else {
        const uint4 x =
            *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(isq ? Qr : Kr) + line);
        split_f16x2(x.x, hi.x, lo.x);
        split_f16x2(x.y, hi.y, lo.y);
        split_f16x2(x.z, hi.z, lo.z);
        split_f16x2(x.w, hi.w, lo.w);
      }
    }
    char* d = dst + (isq ? kImage : 0) + pn * kPanel + line;
    *reinterpret_cast<uint4*>(d) = hi;
    *reinterpret_cast<uint4*>(d + kPanel) = lo;
  }
}

/// Bytes of one 2-byte K or Q tile in the 128-byte-swizzled panel layout (kmajor_sw128_offset):
/// 64-column panels of 64 rows x 128 B; the scan's bf16 tiles, the prep's bf16 / fp16 ones.
template <int KD>
constexpr int64_t wy_tile_bytes() {
  return int64_t((KD + 63) / 64) * kFC * 128;
}
/// The WY prep's shared layout (chunk_wy_prep_kernel): the K tile and the lead region it opens
/// (K, then the inverse's scratch beside P split; bf16 / fp16: 1024-byte aligned, so that the Q
/// tile after it is a wgmma operand too), the region after it (Q, then lm | T), and the scalars.
template <class E, int KD>
struct WyPrepLayout {
  // bf16 / fp16: 128-byte-swizzled panels (wgmma operands); fp32: rows of raw_pitch elements.
  static constexpr bool swizzled = sizeof(E) == 2;
  static constexpr int64_t kq =
      swizzled ? wy_tile_bytes<KD>() : int64_t(kFC) * raw_pitch<E>(KD) * 4;
  static constexpr int64_t l = int64_t(kFC) * kMP * 4;
  static constexpr int64_t lead_min =
      kq > kInvScratch * 4 + 2 * WyRecord::tile ? kq : kInvScratch * 4 + 2 * WyRecord::tile;
  static constexpr int64_t lead = swizzled ? (lead_min + 1023) / 1024 * 1024 : lead_min;
  static constexpr int64_t region = kq > 2 * l ? kq : 2 * l;
  static constexpr int64_t bytes = lead + region + 7 * kFC * 4;
};
template <class E, int KD>
__host__ __device__ constexpr int64_t wy_prep_smem_bytes() {
  return WyPrepLayout<E, KD>::bytes;
}

// 4 blocks a multiprocessor: 64 registers with a few spills beat 71 registers at 3 blocks
// (prefill_notes.md, w24: 295 -> 275 us at 1 x 32768 x 16). fp32 tiles take twice the shared
// memory, so 3 blocks fit (w43).
template <class E, int KD>
__global__ void __launch_bounds__(kWyThreads, sizeof(E) == 4 ? 3 : 4)
    chunk_wy_prep_kernel(const KernelParams p, char* __restrict__ ws) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using R = WyRecord;
  using Lay = WyPrepLayout<E, KD>;
  constexpr int C = kFC, KP = raw_pitch<E>(KD);
  // bf16 / fp16: K and Q as 128-byte-swizzled panels, K K^T and Q K^T by wgmma (exact products,
  // fp32 sums); fp32: rows of KP elements, the products in split TF32 on mma.sync.
  constexpr bool kSw = Lay::swizzled;
  extern __shared__ __align__(1024) float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const PrepTile pt = prep_tile(p);
  if (pt.L == 0) return;
  const int c = pt.c, hv = pt.hv, n = pt.n, h = pt.h, L = pt.L;
  const SeqRange sr = pt.sr;
  const int64_t tb = pt.tb;

  constexpr int64_t kq_bytes = Lay::kq, l_bytes = Lay::l;
  // The lead region holds K, then the inverse's scratch beside P split (hi, lo) for P T. The
  // region after it holds Q until the masked K K^T overwrites it (Q K^T waits in registers by
  // then), then lm and T side by side: fp32 (KD = 128) 69 KB in all, not 85, so that 3 blocks
  // fit a multiprocessor.
  constexpr int64_t region_bytes = Lay::region, lead_bytes = Lay::lead;
  E* Kr = reinterpret_cast<E*>(smem);    // raw keys, then the inverse's scratch
  char* Ps = smem + kInvScratch * 4;     // P split (before the inverse): packed hi tile, then lo
  char* region = smem + lead_bytes;      // Q, then lm | T
  E* Qr = reinterpret_cast<E*>(region);  // raw queries
  float* lm = reinterpret_cast<float*>(region);  // [C][kMP] B(A^- o K^K^T)
  char* Ts = region;  // T split (after the inverse, in lm's place): packed hi tile, then lo
  float* tm = reinterpret_cast<float*>(region + l_bytes);  // [C][kMP] T
  float* ksc = reinterpret_cast<float*>(region + region_bytes);
  float* bet = ksc + C;
  float* qsc = bet + C;
  float* Gv = qsc + C;
  float* kn2 = Gv + C;  // squared key norms
  static_assert(!kSw || lead_bytes % 1024 == 0, "swizzled tiles need 1024 B alignment");
  static_assert(l_bytes >= 2 * R::tile && (kInvScratch * 4) % 16 == 0, "split tiles' places");
  static_assert(kq_bytes >= kInvScratch * 4, "the inverse's scratch fits in the key tile");
  static_assert((lead_bytes + l_bytes) % 16 == 0, "T's rows are read as float4");

  // The warp index through a shuffle from lane 0: the compiler then knows it is warp-uniform
  // and branches on the units (for_units) without reconvergence bookkeeping.
  const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int g = lane >> 2, t4 = lane & 3;
  const E* kb = static_cast<const E*>(p.k) + sr.b * p.ks[0] + tb * p.ks[1] + int64_t(h) * p.ks[2];
  const E* qb = static_cast<const E*>(p.q) + sr.b * p.qs[0] + tb * p.qs[1] + int64_t(h) * p.qs[2];
  if constexpr (kSw) {
    load_rows_sw128<E, KD>(Kr, kb, p.ks[1], L);
    load_rows_sw128<E, KD>(Qr, qb, p.qs[1], L);
  } else {
    load_rows_async<E, KD>(Kr, KP, kb, p.ks[1], L);
    load_rows_async<E, KD>(Qr, KP, qb, p.qs[1], L);
  }
  cp_commit();
  token_scalars_preload(p, sr, tb, L, hv, bet, Gv);
  cp_wait<0>();
  if constexpr (kSw) fence_proxy_async_shared();  // the tiles for wgmma's reads
  __syncthreads();

  const int64_t slot = chunk_slot(p, n, sr, c);
  char* rec = ws + (slot * p.HV + hv) * (p.ws_record_floats * 4);
  // fp16 / fp32: the K / Q images every value slice of the scan reads, once per key head (by
  // its group's first value head); none for the transposed scan (null ws_images), which reads
  // fp16 K / Q as they are.
  if constexpr (!std::is_same_v<E, __nv_bfloat16>)
    if (p.ws_images && (p.HV == p.H || hv % (p.HV / p.H) == 0))
      write_wy_images<E, KD>(Kr, Qr, KP, wy_image_pair<KD>(p, slot, h));
  // Unit u < 10: K K^T tile, else Q K^T tile (the 10 lower 16 x 16 tiles of each); tile tl -> (row
  // block mi, column block nb <= mi).
  auto unit_tile = [](int u, bool& isq, int& mi, int& nb) {
    isq = u >= 10;
    const int tl = isq ? u - 10 : u;
    mi = tl < 1 ? 0 : tl < 3 ? 1 : tl < 6 ? 2 : 3;
    nb = tl - mi * (mi + 1) / 2;
  };
  // This warp's units u = warp + 8 k below nu: f(k, isq, mi, nb).
  auto for_units = [&](int nu, auto f) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const int u = warp + 8 * k;
      if (u >= nu) break;
      bool isq;
      int mi, nb;
      unit_tile(u, isq, mi, nb);
      f(k, isq, mi, nb);
    }
  };
  // bf16 / fp16: warpgroup 0 forms K K^T, warpgroup 1 Q K^T, each as one m64n64 wgmma chain (full
  // 64 x 64; the tiles above the diagonal are not read): warp w holds rows 16 (w % 4).. of all 64
  // columns, wd[4 (2 nb + nj) + e] as tile (row block w % 4, column block nb)'s mma C fragment of
  // 8-column tile nj. On mma.sync (16 x 16 tiles spread over the warps) they cost the prep ~15 us
  // at 1 x 32768 x 16 (prefill_notes.md, session 12).
  [[maybe_unused]] float wd[32];
  [[maybe_unused]] float acc[3][2][4];  // fp32: unit k's tile, mma C fragments of its 2 tiles
  if constexpr (kSw) {
#pragma unroll
    for (int i = 0; i < 32; ++i) wd[i] = 0.f;
    wgmma_reg_fence(wd);
    wgmma_fence();
    const uint64_t ad0 = wgmma_desc_sw128(warp >= 4 ? Qr : Kr), bd0 = wgmma_desc_sw128(Kr);
#pragma unroll
    for (int ks = 0; ks < KD / 16; ++ks) {
      const int off = kmajor_sw128_offset(0, 16 * ks, C);  // k-step ks of both tiles
      wgmma_ss_n64<0, E>(wd, wgmma_desc_advance(ad0, off), wgmma_desc_advance(bd0, off));
    }
    wgmma_commit();
    wgmma_wait_all();
    wgmma_reg_fence(wd);
    // Squared key norms from the diagonal of K K^T (fp32 sums of exact products).
    if (warp < 4)
#pragma unroll
      for (int nb = 0; nb < 4; ++nb)
        if (nb == warp)
#pragma unroll
          for (int nj = 0; nj < 2; ++nj)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = g + (e >> 1) * 8, j = nj * 8 + 2 * t4 + (e & 1);
              if (i == j) kn2[nb * 16 + i] = wd[4 * (2 * nb + nj) + e];
            }
  } else {
    // fp32: the 10 lower 16 x 16 tiles of each in split TF32 hi + lo (three products, ~2^-21, as
    // the TF32 path), unit u < 10 a K K^T tile, else a Q K^T tile, spread over the warps.
    for_units(20, [&](int k, bool isq, int mi, int nb) {
      const E* A = isq ? Qr : Kr;
      float d[2][3][4] = {};  // [nj][part]; the A fragment is split once for both column tiles
#pragma unroll 2
      for (int kk = 0; kk < KD; kk += 8) {
        const FragA fa = load_a_perm<true>(A, KP, mi * 16, kk, g, t4);
#pragma unroll
        for (int nj = 0; nj < 2; ++nj) {
          const FragB fb = load_b_nk_perm<true>(Kr, KP, kk, nb * 16 + nj * 8, g, t4);
          mma3<true, true>(d[nj][0], d[nj][1], d[nj][2], fa, fb);
        }
      }
#pragma unroll
      for (int nj = 0; nj < 2; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[k][nj][e] = parts_sum(d[nj], e);
    });
    // Squared key norms from the diagonal of K K^T (of the three-part products).
    for_units(10, [&](int k, bool, int mi, int nb) {
      if (nb != mi) return;
#pragma unroll
      for (int nj = 0; nj < 2; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = g + (e >> 1) * 8, j = nj * 8 + 2 * t4 + (e & 1);
          if (i == j) kn2[mi * 16 + i] = acc[k][nj][e];
        }
    });
  }
  __syncthreads();
  chunk_token_scalars(p, L, Kr, Qr, KP, KD, ksc, bet, qsc, Gv, kn2, kSw);  // + barrier
  // The masked, scaled tiles: K K^T -> lm (the inverse's input), Q K^T -> P, split into bf16
  // hi + lo in the packed layout (wy_packed_offset) for the P T product. tile_epilogue takes one
  // 16 x 16 tile (row block mi, column block nb) of K K^T (isq false) or Q K^T, its products in
  // a[nj][e] (the mma C layout of 8-column tile nj). A thread's rows i = 16 mi + g + 8 hr and
  // columns j = 16 nb + 8 nj + 2 t4 + e: their scalars are read once a tile, and a masked entry's
  // exponent is forced to 0 and its value selected to 0 (no branch; the kept entries are
  // bit-identical to exp(G_i - G_j) scaled in the same order).
  auto tile_epilogue = [&](bool isq, int mi, int nb, const float(&a)[2][4], auto store) {
    float gi[2], ri[2], si[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int i = mi * 16 + g + hr * 8;
      gi[hr] = Gv[i], ri[hr] = isq ? qsc[i] : bet[i], si[hr] = ksc[i];
    }
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {
      const int j = nb * 16 + nj * 8 + 2 * t4;
      const float2 gj = *reinterpret_cast<const float2*>(Gv + j);
      const float2 cj = *reinterpret_cast<const float2*>(ksc + j);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = mi * 16 + g + hr * 8;
        float x[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool keep = isq ? j + e <= i : j + e < i;
          const float gam = __expf(keep ? gi[hr] - (e ? gj.y : gj.x) : 0.f);
          const float c = e ? cj.y : cj.x, dot = a[nj][2 * hr + e];
          x[e] = keep ? (isq ? ri[hr] * gam * c * dot : ri[hr] * gam * (si[hr] * c) * dot) : 0.f;
        }
        store(i, j, x[0], x[1]);
      }
    }
  };
  // Both before the inverse, so that no accumulator stays live through it (registers: the prep
  // runs at 64).
  auto store_l = [&](int i, int j, float x0, float x1) {
    *reinterpret_cast<float2*>(lm + i * kMP + j) = make_float2(x0, x1);
  };
  auto store_p = [&](int i, int j, float x0, float x1) {
    const int off = wy_packed_offset(i, j);
    store_split_bf16x2(Ps + off, Ps + R::tile + off, x0, x1);
  };
  if constexpr (kSw) {  // this warp's tiles of its row block
    const int mi = warp & 3;
#pragma unroll
    for (int nb = 0; nb < 4; ++nb)
      if (nb <= mi) {
        const float a[2][4] = {{wd[8 * nb], wd[8 * nb + 1], wd[8 * nb + 2], wd[8 * nb + 3]},
                               {wd[8 * nb + 4], wd[8 * nb + 5], wd[8 * nb + 6], wd[8 * nb + 7]}};
        if (warp < 4)
          tile_epilogue(false, mi, nb, a, store_l);
        else
          tile_epilogue(true, mi, nb, a, store_p);
      }
  } else {  // fp32: the K K^T tiles, then the Q K^T tiles
    for_units(20, [&](int k, bool isq, int mi, int nb) {
      if (!isq) tile_epilogue(false, mi, nb, acc[k], store_l);
    });
    for_units(20, [&](int k, bool isq, int mi, int nb) {
      if (isq) tile_epilogue(true, mi, nb, acc[k], store_p);
    });
  }
  __syncthreads();
  invert_unit_lower(lm, tm, reinterpret_cast<float*>(Kr));  // K is dead by now; + barrier

  // T split into the record and into Ts: 16-byte piece q of the packed triangle (block q / 32,
  // matrix (q / 8) % 4, row q % 8: 8 columns of one row), stores in record order (coalesced).
  // Only blocks on and below the diagonal are read, where tm is valid (zeros above the diagonal
  // inside the diagonal blocks).
  for (int q = tid; q < int(R::tile / 16); q += kWyThreads) {
    const int b = q >> 5, m = (q >> 3) & 3, mi = b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3;
    const int i = mi * 16 + (m & 1) * 8 + (q & 7), j0 = (b - mi * (mi + 1) / 2) * 16 + (m >> 1) * 8;
    const float4 x0 = *reinterpret_cast<const float4*>(tm + i * kMP + j0);
    const float4 x1 = *reinterpret_cast<const float4*>(tm + i * kMP + j0 + 4);
    uint4 hi, lo;
    split_bf16x2(x0.x, x0.y, hi.x, lo.x);
    split_bf16x2(x0.z, x0.w, hi.y, lo.y);
    split_bf16x2(x1.x, x1.y, hi.z, lo.z);
    split_bf16x2(x1.z, x1.w, hi.w, lo.w);
    *reinterpret_cast<uint4*>(rec + R::th + q * 16) = hi;
    *reinterpret_cast<uint4*>(rec + R::tl + q * 16) = lo;
    *reinterpret_cast<uint4*>(Ts + q * 16) = hi;
    *reinterpret_cast<uint4*>(Ts + R::tile + q * 16) = lo;
  }
  __syncthreads();
  // P T on the 10 lower 16 x 16 tiles (mi, nb): sum over k-blocks nb..mi of P_(mi,ks) T_(ks,nb)
  // (hi hi + hi lo + lo hi), both operands by ldmatrix from the packed split tiles: P's block
  // as the A fragment, T's by the transposing load as the two 8-column B fragments.
  for (int u = warp; u < 10; u += kWyThreads / 32) {
    bool isq;
    int mi, nb;
    unit_tile(u, isq, mi, nb);
    float d[2][3][4] = {};
    for (int ks = nb; ks <= mi; ++ks) {
      const int pa = (mi * (mi + 1) / 2 + ks) * int(R::block) + lane * 16;
      const int tb = (ks * (ks + 1) / 2 + nb) * int(R::block) + lane * 16;
      uint32_t ah[4], al[4], bh[4], bl[4];
      ldsm4(ah, Ps + pa);
      ldsm4(al, Ps + R::tile + pa);
      ldsm4_t(bh, Ts + tb);
      ldsm4_t(bl, Ts + R::tile + tb);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        mma_bf16_split(d[nt], ah, al, bh[2 * nt], bh[2 * nt + 1], bl[2 * nt], bl[2 * nt + 1]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int off = wy_packed_offset(mi * 16 + g + hr * 8, nb * 16 + nt * 8 + 2 * t4);
        store_split_bf16x2(rec + R::ph + off, rec + R::pl + off, parts_sum(d[nt], 2 * hr),
                           parts_sum(d[nt], 2 * hr + 1));
      }
  }
  // Per-token scalars (layout at kWyScUpd above).
  float* sc = reinterpret_cast<float*>(rec + R::sc);
  const float Gend = Gv[L - 1];
  for (int i = tid; i < kWyScalars; i += kWyThreads) {
    float x = 0.f;
    if (i < C)
      x = expf(Gv[i]) * qsc[i];
    else if (i < kWyGend)
      x = i - C < L ? ksc[i - C] * expf(Gend - Gv[i - C]) : 0.f;
    else if (i == kWyGend)
      x = expf(Gend);
    else if (i >= kWyColU && i < kWyColU + C)
      x = bet[i - kWyColU] * ksc[i - kWyColU];
    else if (i >= kWyColW && i < kWyColW + C)
      x = bet[i - kWyColW] * ksc[i - kWyColW] * __expf(Gv[i - kWyColW]);
    sc[i] = x;
  }
#endif
}

// ---- pass 2: the sequential scan ------------------------------------------------------------

/// Pitch (elements) of the scan's VS-wide bf16 tiles: rows 16 B apart modulo 128 (ldmatrix
/// conflict-free; VS = 8 takes 48-byte rows as VS = 16 does).
template <int VS>
constexpr int wy_scan_pitch() {
  return VS == 8 ? 24 : VS + 8;
}
/// Column groups of a VS-column value slice: two halves (warpgroup j's step A takes half j), or
/// one group at VS = 8 (8 columns, the narrowest tile; step A on warpgroup 0 alone). The split B
/// tiles hold each group's hi rows, then its lo rows (wy_split_row).
template <int VS>
constexpr int wy_groups() {
  return VS >= 16 ? 2 : 1;
}
/// Bytes of one K or Q tile in a scan stage: bf16, the raw TMA boxes (exact wgmma operands);
/// fp16 / fp32, the prep's image of the tile split into bf16 hi + lo (write_wy_images): for each
/// 64-column panel its hi panel, then its lo panel.
template <class E, int KD>
__host__ __device__ constexpr int64_t wy_kq_tile_bytes() {
  return std::is_same_v<E, __nv_bfloat16> ? wy_tile_bytes<KD>() : 2 * wy_tile_bytes<KD>();
}
static_assert(kla::detail::wy_image_bytes(64, true) == wy_kq_tile_bytes<float, 64>() &&
                  kla::detail::wy_image_bytes(96, true) == wy_kq_tile_bytes<__half, 96>() &&
                  kla::detail::wy_image_bytes(128, true) == wy_kq_tile_bytes<float, 128>() &&
                  kla::detail::wy_image_bytes(128, false) == 0,
              "workspace.hpp's image size");
/// Largest dynamic shared memory a block may opt into on compute capability 9.0 (the only one the
/// WY path runs on).
constexpr int64_t kSm90MaxSmem = 227 * 1024;
template <class E, int KD, int VS>
__host__ __device__ constexpr int64_t wy_scan_smem_bytes_v(bool v_in_smem, int stages = 2);
/// Whether the scan's V slice goes through the stages (a tensor copy per chunk) or, where the
/// stages have no room for it (fp16 / fp32 at VS = 32), from global memory straight to the
/// recurrence warps' registers a chunk ahead (~4% slower where both fit, measured on bf16).
template <class E, int KD, int VS>
__host__ __device__ constexpr bool wy_v_in_smem() {
  return wy_scan_smem_bytes_v<E, KD, VS>(true) <= kSm90MaxSmem;
}
/// One stage: record | K tile | Q tile | V slice [64][VS] raw (when wy_v_in_smem).
template <class E, int KD, int VS>
__host__ __device__ constexpr int64_t wy_stage_bytes_v(bool v_in_smem) {
  return WyRecord::bytes + 2 * wy_kq_tile_bytes<E, KD>() +
         (v_in_smem ? int64_t(kFC) * VS * int(sizeof(E)) : 0);
}
template <class E, int KD, int VS>
__host__ __device__ constexpr int64_t wy_stage_bytes() {
  return wy_stage_bytes_v<E, KD, VS>(wy_v_in_smem<E, KD, VS>());
}
/// Bytes of the split state as the wgmma B operand: [KD / 64 panels][2 VS rows][128 B].
template <int KD, int VS>
__host__ __device__ constexpr int64_t wy_state_split_bytes() {
  return int64_t((KD + 63) / 64) * 2 * VS * 128;
}
/// Row of value column c's part p (0 hi, 1 lo) in the scan's split wgmma B tiles (S, X): each
/// column group of the VS-column slice (wy_groups) as its hi rows, then its lo rows, so that one
/// wgmma over a group (N = 2 VS / groups) or the slice (N = 2 VS) gives both parts.
template <int VS>
__host__ __device__ constexpr int wy_split_row(int c, int p) {
  constexpr int gw = VS / wy_groups<VS>();  // columns a group
  return (c / gw) * 2 * gw + p * gw + c % gw;
}
/// The scan's split B tiles are laid out one to one: wy_split_row maps (column, part) onto the
/// 2 VS rows, and kmajor_sw128_offset maps every (row, k) of a [KD / 64 panels][2 VS rows] tile
/// onto its own 2 bytes inside the tile, 8 consecutive k to each 16-byte piece (what stmatrix
/// and the wgmma descriptors assume).
template <int KD, int VS>
constexpr bool wy_split_layout_is_one_to_one() {
  constexpr int rows = 2 * VS, panels = (KD + 63) / 64, bytes = panels * rows * 128;
  bool row_seen[rows] = {}, slot_seen[bytes / 2] = {};
  for (int c = 0; c < VS; ++c)
    for (int part = 0; part < 2; ++part) {
      const int r = wy_split_row<VS>(c, part);
      if (r < 0 || r >= rows || row_seen[r]) return false;
      row_seen[r] = true;
    }
  for (int n = 0; n < rows; ++n)
    for (int k = 0; k < panels * 64; ++k) {
      const int o = kmajor_sw128_offset(n, k, rows);
      if (o < 0 || o >= bytes || o % 2 != 0 || slot_seen[o / 2]) return false;
      if (k % 8 != 0 && o != kmajor_sw128_offset(n, k - 1, rows) + 2) return false;
      slot_seen[o / 2] = true;
    }
  return true;
}
static_assert(wy_split_layout_is_one_to_one<128, 8>() && wy_split_layout_is_one_to_one<128, 16>() &&
                  wy_split_layout_is_one_to_one<128, 32>() &&
                  wy_split_layout_is_one_to_one<96, 16>() &&
                  wy_split_layout_is_one_to_one<64, 32>(),
              "split B tile layout");

/// `stages` stages, the state split twice (S_c read while S_c+1 is written) and X split (wgmma
/// B tiles, K-major: [value column][key or token]), R split ([token][SP], mma.sync B), then the
/// stage barriers.
template <class E, int KD, int VS>
__host__ __device__ constexpr int64_t wy_scan_smem_bytes_v(bool v_in_smem, int stages) {
  return stages * wy_stage_bytes_v<E, KD, VS>(v_in_smem) + 2 * wy_state_split_bytes<KD, VS>() +
         2LL * VS * 128 + 2LL * kFC * wy_scan_pitch<VS>() * 2 + stages * 8;
}
/// Stages of the scan's copy ring: three at VS = 8 where they fit (bf16), so that a chunk's
/// copies have two chunk periods to land, not one (H200 1 x 131072 x 8: the stage wait 202 -> 66
/// cycles a chunk, -10%); else two (at VS = 16 a third stage made bf16 1 x 32768 x 16 2% and
/// K96 / V192 6% slower; prefill_notes.md, session 11).
template <class E, int KD, int VS>
__host__ __device__ constexpr int wy_scan_stages() {
  return VS == 8 && wy_v_in_smem<E, KD, VS>() &&
                 wy_scan_smem_bytes_v<E, KD, VS>(true, 3) <= kSm90MaxSmem
             ? 3
             : 2;
}
template <class E, int KD, int VS>
__host__ __device__ constexpr int64_t wy_scan_smem_bytes() {
  return wy_scan_smem_bytes_v<E, KD, VS>(wy_v_in_smem<E, KD, VS>(), wy_scan_stages<E, KD, VS>());
}

/// One k-step of a split product: d[nt][part] += A B_ks for an A fragment as bf16 parts (ah, al)
/// and k-step ks of a split B (Bh / Bl, [k][SP]), NT 8-column tiles from column n0: parts hi hi,
/// hi lo and lo hi.
template <int NT, int SP>
__device__ __forceinline__ void split_k_step(float (&d)[NT][3][4], const uint32_t (&ah)[4],
                                             const uint32_t (&al)[4], const __nv_bfloat16* Bh,
                                             const __nv_bfloat16* Bl, int ks, int n0, int lane) {
  if constexpr (NT == 1) {
    uint32_t bh[2], bl[2];
    ldsm2_t(bh, Bh + frag_b_kn(SP, ks * 16, n0, lane));
    ldsm2_t(bl, Bl + frag_b_kn(SP, ks * 16, n0, lane));
    mma_bf16_split(d[0], ah, al, bh[0], bh[1], bl[0], bl[1]);
  } else {
    static_assert(NT % 2 == 0, "one tile or pairs of tiles");
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bh[4], bl[4];
      ldsm4_t(bh, Bh + frag_b_kn(SP, ks * 16, n0 + np * 16, lane));
      ldsm4_t(bl, Bl + frag_b_kn(SP, ks * 16, n0 + np * 16, lane));
      mma_bf16_split(d[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
      mma_bf16_split(d[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
    }
  }
}

/// d[nt][part] (row block mi) = A B for a split lower-triangular 64 x 64 A (Ah / Al, packed
/// triangles, wy_packed_offset: k-blocks 0..mi) and a split B (Bh / Bl, [64][SP], NT tiles from
/// column n0).
/// mi must be warp-uniform: each row block has its own fully unrolled body (offsets fold into
/// the instructions: fewer issued instructions, w48).
template <int NT, int SP>
__device__ __forceinline__ void tri_split_times_split(const char* Ah, const char* Al,
                                                      const __nv_bfloat16* Bh,
                                                      const __nv_bfloat16* Bl, int mi, int n0,
                                                      float (&d)[NT][3][4]) {
  const int lane = threadIdx.x & 31;
  auto rows = [&](auto MI) {
#pragma unroll
    for (int ks = 0; ks <= decltype(MI)::value; ++ks) {
      uint32_t ah[4], al[4];
      const int off = wy_packed_offset(decltype(MI)::value * 16, ks * 16) + lane * 16;
      ldsm4(ah, Ah + off);
      ldsm4(al, Al + off);
      split_k_step<NT, SP>(d, ah, al, Bh, Bl, ks, n0, lane);
    }
  };
  switch (mi) {
    case 0: rows(std::integral_constant<int, 0>{}); break;
    case 1: rows(std::integral_constant<int, 1>{}); break;
    case 2: rows(std::integral_constant<int, 2>{}); break;
    default: rows(std::integral_constant<int, 3>{}); break;
  }
}

/// L2 prefetch of one value slice's share of `lines` 128-byte lines from base: lines slice,
/// slice + nslices, ... spread over the warp's lanes (each slice of a head asks for its own).
__device__ __forceinline__ void prefetch_share_l2(const char* base, int lines, int slice,
                                                  int nslices, int lane) {
  for (int l = slice + nslices * lane; l < lines; l += nslices * 32)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + l * 128));
}
/// L2 prefetch of one value slice's share of chunk cf's raw K and Q rows (key head h; rows past
/// the sequence end are not asked for).
template <class E, int KD>
__device__ __forceinline__ void prefetch_kq_rows_l2(const KernelParams& p, const SeqRange& sr,
                                                    int h, int cf, int slice, int nslices,
                                                    int lane) {
  const int64_t tf = sr.t0 + int64_t(cf) * kFC;
  const int rows = int(sr.len - int64_t(cf) * kFC < kFC ? sr.len - int64_t(cf) * kFC : kFC);
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

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/// r[nj] (8-column tile nj, mma C layout; this warp's 16 rows of the warpgroup's 64) = A B over
/// KSTEPS k-steps, one wgmma group with both operands read by the tensor cores from shared memory.
/// A: rows m0.. of a bf16 tile as the TMA boxes leave it (panels of 64 columns x 64 rows x 128 B,
/// 128-byte swizzle, kAPanel bytes apart), or of its transpose (kTransA: A = tile^T, m0 a
/// multiple of 64); with kALo also its lo part, a_lo bytes further (fp16 / fp32 inputs: the
/// prep's images, hi panels 16 KB apart, each lo panel 8 KB after its hi panel). B: a split tile
/// (K-major, 128-byte swizzle, rows as wy_split_row from a column group's first row, b_panel bytes
/// between 64-k panels); N counts its hi and lo rows (N / 16 column tiles), NH tiles a group. The
/// result is
/// A B_hi + A B_lo (+ A_lo B_hi + A_lo B_lo: the last, up to 2^-18 relative, is as large as the
/// split's own error, and leaving it out costs more small wgmma than it saves; prefill_notes.md).
template <int KSTEPS, int N, int NH, bool kTransA, bool kALo, int kAPanel>
__device__ __forceinline__ void wg_times_split(const char* A, int a_lo, int m0, const char* B,
                                               int b_panel, float (&r)[N / 16][4]) {
  static_assert(N % (16 * NH) == 0, "whole column groups of hi and lo rows");
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wgmma_reg_fence(d);
  wgmma_fence();
  // The descriptors of k-step 0; every later k-step (and A's lo part) starts a fixed number of
  // bytes further, added to the start-address field (wgmma_desc_advance): rebuilding each
  // descriptor from its address cost ~10 instructions a k-step (w47). kTransA: rows = tile columns
  // m0.. (panel m0 / 64), k = tile rows 16 ks.. (8-row groups 1024 B apart); else rows = tile rows
  // m0.., k = tile columns 16 ks.. (panel ks / 4).
  const uint64_t bd0 = wgmma_desc_sw128(B);
  const uint64_t ad0 = wgmma_desc_sw128(kTransA ? A + (m0 >> 6) * kAPanel : A + m0 * 128, kAPanel);
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    const uint64_t bd = wgmma_desc_advance(bd0, (ks >> 2) * b_panel + (ks & 3) * 32);
    const uint64_t ad =
        wgmma_desc_advance(ad0, kTransA ? ks * 2048 : (ks >> 2) * kAPanel + (ks & 3) * 32);
#pragma unroll
    for (int part = 0; part < (kALo ? 2 : 1); ++part)
      wgmma_ss_bf16<kTransA ? 1 : 0>(d, wgmma_desc_advance(ad, part * a_lo), bd);
  }
  wgmma_commit();
  wgmma_wait_all();
  wgmma_reg_fence(d);
  // Tile nj's hi rows in B: its group's first tile, then its place in the group; the lo rows
  // follow NH tiles later.
#pragma unroll
  for (int nj = 0; nj < N / 16; ++nj) {
    const int th = (nj / NH) * 2 * NH + nj % NH;
#pragma unroll
    for (int e = 0; e < 4; ++e) r[nj][e] = d[4 * th + e] + d[4 * (th + NH) + e];
  }
}
#endif

template <class E, int KD, int VS>
__global__ void __launch_bounds__(wy_scan_threads<E>(), 1)
    chunk_wy_scan_kernel(const KernelParams p, const char* __restrict__ ws,
                         const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap qmap,
                         const __grid_constant__ CUtensorMap vmap) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using R = WyRecord;
  // fp16 / fp32: the K / Q tiles are the prep's images (hi + lo panels, write_wy_images) and
  // enter every product as both parts; bf16: the raw TMA boxes.
  constexpr bool kImages = !std::is_same_v<E, __nv_bfloat16>;
  using E2 =
      std::conditional_t<std::is_same_v<E, float>, float2,
                         std::conditional_t<std::is_same_v<E, __half>, __half2, __nv_bfloat162>>;
  // GROUPS column groups of NH 8-column tiles each (wy_groups).
  constexpr int GROUPS = wy_groups<VS>();
  constexpr int C = kFC, SP = wy_scan_pitch<VS>(), MT = KD / 16, NJ = VS / 8, NH = NJ / GROUPS;
  constexpr int64_t kStage = wy_stage_bytes<E, KD, VS>(), kTile = wy_kq_tile_bytes<E, KD>();
  constexpr bool kVSmem = wy_v_in_smem<E, KD, VS>();
  constexpr int kPanels = (KD + 63) / 64, kProducer = wy_producer_warp<E>();
  constexpr int kStages = wy_scan_stages<E, KD, VS>();
  // Bytes between the 64-column hi panels of the A tiles, and from a hi panel to its lo panel.
  constexpr int kAPanel = kImages ? 2 * kFC * 128 : kFC * 128, kALo = kFC * 128;
  constexpr int kRecThreads = kWyRecWarps * 32, kRThreads = (kWyRecWarps + kWyReadWarps) * 32;
  // The 128-byte swizzle of the K / Q boxes needs their shared addresses 1024-byte aligned: the
  // dynamic block starts aligned (no static shared memory in this kernel) and every offset
  // below is a multiple of 1024.
  static_assert(R::bytes % 1024 == 0 && kStage % 1024 == 0 && kTile % 1024 == 0,
                "swizzled TMA boxes need 1024 B alignment");
  static_assert(MT <= kWyRecWarps && kWyReadWarps == 4, "warp roles");
  extern __shared__ __align__(1024) char smem[];
  // Stage st: record (T_hi, T_lo, PT_hi, PT_lo, scalars) | K, Q, each [KD/64 panels][64][128 B
  // swizzled] (kmajor_sw128_offset with 64 rows a panel: wgmma operands, 128-byte TMA box rows;
  // fp16 / fp32: each panel as hi then lo, the prep's images).
  auto st_rec = [&](int st) { return smem + st * kStage; };
  auto st_kq = [&](int st) { return smem + st * kStage + R::bytes; };  // K tile, then Q tile
  auto st_v = [&](int st) {
    return reinterpret_cast<E*>(smem + st * kStage + R::bytes + 2 * kTile);
  };
  // State split, two buffers: chunk ch reads buffer ch % 2 (S_ch) and writes S_ch+1 into the
  // other, so the read-out's Q S may still run while the state is updated. S and X are wgmma B
  // tiles (wgmma.cuh: K-major, [value column][key or token], 128-byte swizzle); R is an
  // mma.sync B operand ([token][SP]).
  constexpr int kSSplit = int(wy_state_split_bytes<KD, VS>()), kXSplit = 2 * VS * 128;
  char* Sbuf = smem + kStages * kStage;  // [2][KD / 64 panels][2 VS rows][128 B]
  auto s_split = [&](int b) { return Sbuf + b * kSSplit; };
  char* Xs = Sbuf + 2 * kSSplit;  // [2 VS rows][128 B] diag(update scale) U split
  auto* Rh = reinterpret_cast<__nv_bfloat16*>(Xs + kXSplit);  // [C][SP] R split
  __nv_bfloat16* Rl = Rh + C * SP;
  auto* full = reinterpret_cast<uint64_t*>(Rl + C * SP);  // stage st landed
  static_assert(kSSplit % 1024 == 0 && (VS / GROUPS) % 8 == 0, "wgmma B tiles are 1024 B atoms");
  // One 16 x 8 tile (rows r0.., columns c0..) of a [row][column] matrix, held as an mma C
  // fragment v, split into a split B tile t (K-major: [2 VS rows (wy_split_row)][k = row]): one
  // transposing stmatrix of four 8 x 8 matrices (hi rows r0.. and r0 + 8.., then lo), lane l
  // addressing row l % 8 of matrix l / 8: 16 bytes, eight k of one value column.
  auto store_tile_kmajor = [&](char* t, int r0, int c0, float v0, float v1, float v2, float v3) {
    uint32_t h0, l0, h1, l1;
    split_bf16x2(v0, v1, h0, l0);
    split_bf16x2(v2, v3, h1, l1);
    const int l = int(threadIdx.x) & 31, m = l >> 3;
    stsm4_t(
        t + kmajor_sw128_offset(wy_split_row<VS>(c0 + (l & 7), m >> 1), r0 + (m & 1) * 8, 2 * VS),
        h0, h1, l0, l1);
  };

  // The warp index through a shuffle from lane 0: the compiler then knows it is warp-uniform and
  // keeps what derives from it (the wgmma descriptors above all) in uniform registers, which
  // saved 4-8% (w47).
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
  auto store_state_split = [&](int b) {
#pragma unroll
    for (int nj = 0; nj < SNJ; ++nj)
      store_tile_kmajor(s_split(b), srow * 16, scol + nj * 8, sacc[nj][0], sacc[nj][1], sacc[nj][2],
                        sacc[nj][3]);
    fence_proxy_async_shared();  // for the wgmma reads after the next barrier
  };
  if (state_warp) {
    if (slot.in)
#pragma unroll
      for (int nj = 0; nj < SNJ; ++nj)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = srow * 16 + g + hr * 8, cc = scol + nj * 8 + 2 * t4;
          const float2 x = *reinterpret_cast<const float2*>(slot.in + int64_t(r) * V + c0 + cc);
          sacc[nj][2 * hr] = x.x, sacc[nj][2 * hr + 1] = x.y;
        }
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
  // image size, asserted with workspace.hpp's above; calling wy_image_pair here reorders the
  // scan's instructions).
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
        float d[NH][4];
        wg_times_split<KD / 16, 2 * VS / GROUPS, NH, false, kImages, kAPanel>(
            Kb, kALo, 0, s_split(sb) + (warp >> 2) * (2 * VS / GROUPS) * 128, 2 * VS * 128, d);
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
      if (GROUPS == 2 || warp < 4) {
        const int mi = warp < 4 ? warp : 7 - warp, n0 = (warp >> 2) * (VS / GROUPS);
        float d[NH][3][4] = {};
        tri_split_times_split<NH, SP>(rec + R::th, rec + R::tl, Rh, Rl, mi, n0, d);
        const float w0 = sc[kWyScUpd + mi * 16 + g], w1 = sc[kWyScUpd + mi * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < NH; ++nt)
          store_tile_kmajor(Xs, mi * 16, n0 + nt * 8, w0 * parts_sum(d[nt], 0),
                            w0 * parts_sum(d[nt], 1), w1 * parts_sum(d[nt], 2),
                            w1 * parts_sum(d[nt], 3));
        fence_proxy_async_shared();  // X for step C's wgmma, after the barrier
      }
      KLA_WY_MARK(4);
      named_bar_sync(kWyBarRec, kRecThreads);  // X visible to the state warps
      KLA_WY_MARK(5);
      // Step C. S <- gamma_C S + K^T X (both warpgroups run the wgmma; the state warps keep
      // their block), split into the other buffer.
      {
        float d[SNJ][4];
        wg_times_split<C / 16, 2 * VS / SCS, NH, true, kImages, kAPanel>(  // K^T X: K^T
            Kb, kALo, SCS == 2 ? 0 : (warp >> 2) * 64, Xs + 2 * scol * 128, 0, d);
        if (state_warp) {
          const float gend = sc[kWyGend];
#pragma unroll
          for (int nj = 0; nj < SNJ; ++nj)
#pragma unroll
            for (int e = 0; e < 4; ++e) sacc[nj][e] = fmaf(gend, sacc[nj][e], d[nj][e]);
          store_state_split(sb ^ 1);  // read after the next chunk's first barrier
        }
      }
    } else if (warp < kWyRecWarps + kWyReadWarps) {
      // fp16 / fp32: the first read-out warp is the producer; its copies before its share of
      // the read-out.
      if (!wy_own_producer<E>() && warp == kProducer) produce(ch);
      // Read-out of row block mi: O = diag(gamma qscale) Q S_ch + (P T) R, written out: Q S
      // while the recurrence warps form R, (P T) R once they have.
      const int mi = warp - kWyRecWarps;
      float o0[NJ][4];
      {
        float d[NJ][4];
        wg_times_split<KD / 16, 2 * VS, NH, false, kImages, kAPanel>(Qb, kALo, 0, s_split(sb),
                                                                     2 * VS * 128, d);
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
      named_bar_sync(kWyBarPadRead, kWyReadWarps * 32);  // racecheck's count (see above)
    } else {
      // bf16's producer warp.
      produce(ch);
      named_bar_sync(kWyBarPadProducer, 32);  // racecheck's count (see above)
      named_bar_sync(kWyBarPadProducer, 32);
    }
  }

#ifdef KLA_WY_PROFILE
  if (prof_on) wy_profile_store(warp ? 1 : 0, prof, 7, nch);
#endif
  if (state_warp && slot.out)
#pragma unroll
    for (int nj = 0; nj < SNJ; ++nj)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = srow * 16 + g + hr * 8, cc = scol + nj * 8 + 2 * t4;
        *reinterpret_cast<float2*>(slot.out + int64_t(r) * V + c0 + cc) =
            make_float2(sacc[nj][2 * hr], sacc[nj][2 * hr + 1]);
      }
#endif
}

// ---- pass 2, transposed (bf16 / fp16, KLA_CHUNK_PATH=wy64): the state as wgmma's register operand
//
// One block per (sequence, value head, 64 value columns). Its first warpgroup runs the chain with
// the state held transposed, S^T (64 value rows x KD keys, fp32), in its wgmma accumulators, so
// that every state product takes S^T (or R^T, X^T) as the A operand from registers and streams
// only B from shared memory (prefill_notes.md, w50: in isolation 2.4x cheaper a value column than
// the [token][column] scan's step A; a chunk takes ~4,900 cycles for 64 columns against ~3,450
// for 32 in that scan, session 10). Each product runs as two independent m64n64 accumulator
// chains:
//   (K S)^T = S^T K^T, (Q S)^T = S^T Q^T     m64n64k16 x KD / 16 k-steps x S^T hi, lo
//   R^T = V^T diag(cu) - (K S)^T diag(cw)    (split hi + lo),  O^T = (Q S)^T diag(gamma qscale)
//   X^T = (R^T T^T) diag(update),  O^T += R^T (P T)^T   m64n64k16 x 4, parts hi hi, hi lo, lo hi
//   S^T <- gamma_C S^T + X^T K               per 64-key panel m64n64k16 x 4, K as MN-major B
// The second warpgroup issues the copies (its first warp), lays the next chunk's packed T and P T
// triangles out as one K-major B tile [T; P T] (128 rows x 64 tokens, 128-byte swizzle; two
// buffers), and writes out the O tile the chain leaves in shared memory. Laid out a chunk ahead,
// not beside the chain's K S: tiles written through the generic proxy just before the wgmma that
// read them cost that batch ~630 cycles a chunk (prefill_notes.md, w61). Same record,
// scalars and arithmetic as chunk_wy_scan_kernel (every product of split operands keeps hi hi +
// hi lo + lo hi), in another order of summation.
//
// fp16: K and Q are fp16 (not exact in bf16), so every product on them runs on the f16 wgmma with
// the other operand as fp16 hi + lo: S^T and X^T, each row (value column) scaled by a power of two
// into fp16's range first (fp16_range_scale), 22 bits where the bf16 split keeps 16. The scale of
// S^T is undone on (K S)^T and (Q S)^T; X^T's stays in the state: the accumulators hold
// diag(sig) S^T, sig the last X^T scale of the row, rescaled with the decay each chunk. The
// products on T and P T (record values) stay bf16 hi + lo, and the prep writes no K / Q images.
// (tools/state_precision_study.py: one fp16 part for S^T would give 3.2e-4 at alpha = 1, above the
// fp16 target.)
constexpr int kWyTThreads = 256, kWyTChainThreads = 128;
// Named barriers: the chain's padding to the helpers' count of barrier waits a chunk (two:
// racecheck, see kWyBarPadRead); the chunk's O tile in shared memory (the chain arrives, the
// helpers wait and write it out).
constexpr int kWyTBarPad = 1, kWyTBarO = 2;

/// One stage: record | K and Q, [KD / 64 panels][K's 64 rows | Q's 64 rows][128 B swizzled]
/// (each panel one K-major B tile of 128 rows) | V's 64 columns [64 rows][128 B swizzled].
template <int KD>
__host__ __device__ constexpr int64_t wy_t_stage_bytes() {
  return WyRecord::bytes + 2 * wy_tile_bytes<KD>() + int64_t(kFC) * 128;
}
/// Two stages, two [T; P T] buffers of hi and lo parts, the O tile [64 tokens][128 B swizzled], the
/// two stage barriers.
template <int KD>
__host__ __device__ constexpr int64_t wy_t_smem_bytes() {
  return 2 * wy_t_stage_bytes<KD>() + 4 * (2 * kFC * 128) + kFC * 128 + 2 * 8;
}

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
#endif

template <class E, int KD>
__global__ void __launch_bounds__(kWyTThreads, 1)
    chunk_wy_scan_transposed_kernel(const KernelParams p, const char* __restrict__ ws,
                                    const __grid_constant__ CUtensorMap kmap,
                                    const __grid_constant__ CUtensorMap qmap,
                                    const __grid_constant__ CUtensorMap vmap) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>,
                "raw K / Q / V tiles as wgmma operands");
  constexpr bool kF16 = std::is_same_v<E, __half>;
  using R = WyRecord;
  constexpr int C = kFC, VS = 64, kPanels = (KD + 63) / 64, KS = KD / 16;
  constexpr int kPanelKQ = 2 * C * 128,
                kTpt = 2 * C * 128;  // bytes: a K | Q panel, a [T; P T] part
  constexpr int64_t kStage = wy_t_stage_bytes<KD>();
  static_assert(R::bytes % 1024 == 0 && kStage % 1024 == 0, "swizzled tiles need 1024 B alignment");
  extern __shared__ __align__(1024) char smem[];
  auto st_rec = [&](int st) { return smem + st * kStage; };
  auto st_kq = [&](int st) { return smem + st * kStage + R::bytes; };
  auto st_v = [&](int st) { return smem + st * kStage + R::bytes + kPanels * kPanelKQ; };
  // [T; P T] of chunk ch in buffer ch % 2: hi part, then lo part.
  auto tpt = [&](int b) { return smem + 2 * kStage + b * 2 * kTpt; };
  char* otile = tpt(2);  // O, [token][64 columns], 16-byte piece c of row r at c ^ r % 8
  auto* full = reinterpret_cast<uint64_t*>(otile + C * 128);

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
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn)
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int key = 64 * pn + 8 * (i >> 2) + 2 * t4 + (i & 1),
                col = c0 + 16 * warp + g + 8 * ((i >> 1) & 1);
      sT[pn][i] = chain && slot.in && key < KD ? slot.in[int64_t(key) * V + col] : 0.f;
    }
  // S^T split into hi + lo as the register A fragments of K S | Q S (k-step ks: keys 16 ks..),
  // made for chunk ch + 1 as soon as chunk ch's update lands, before the stage wait and the chunk
  // barrier rather than after them (-1% of the scan at 4 x 8192 x 16; prefill_notes.md, w68).
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
        wgmma_rs_n64<0, E>(accK, al[ks], bk);
        wgmma_rs_n64<0, E>(accQ, al[ks], bq);
      }
      wgmma_commit();
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
#pragma unroll
      for (int i = 0; i < 32; ++i) accX[i] *= sc[kWyScUpd + 8 * (i >> 2) + 2 * t4 + (i & 1)];
      if constexpr (kF16) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const float m = accumulator_row_max<1>(&accX, hr);
          const float sn =
              m == 0.f ? sig[hr] : fminf(fmaxf(fp16_range_scale(m), 0x1p-32f), 0x1p32f);
          gsc[hr] = gend * (sn * pow2_inverse(sig[hr]));
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
        for (int part = 0; part < 2; ++part)
#pragma unroll
          for (int pn = 0; pn < kPanels; ++pn)
            wgmma_rs_n64<1, E>(sT[pn], part ? xl[ks] : xh[ks],
                               wgmma_desc_advance(kd0, pn * kPanelKQ + ks * 2048));
      wgmma_commit();
      KLA_WY_MARK(5);
      // O^T into the O tile by transposing stmatrix (8 x 8 block (nb, hr): tokens 8 nb..,
      // columns 16 w + 8 hr..; lane l addresses token row l % 8 of block l / 8 of the four), for
      // the helpers to write out: scattered 2-byte stores from here held the next chunk's wgmma
      // back by ~1,800 cycles a chunk (prefill_notes.md, session 10).
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t r4[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int i = 4 * (2 * k + (m >> 1)) + 2 * (m & 1);
          r4[m] = Dtype<E>::pack2(accO[i], accO[i + 1]);
        }
        const int mm = lane >> 3, row = 8 * (2 * k + (mm >> 1)) + (lane & 7),
                  pc = 2 * warp + (mm & 1);
        stsm4_t(otile + row * 128 + ((pc ^ (row & 7)) << 4), r4[0], r4[1], r4[2], r4[3]);
      }
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
  if (chain && slot.out)
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn)
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int key = 64 * pn + 8 * (i >> 2) + 2 * t4 + (i & 1),
                  col = c0 + 16 * warp + g + 8 * ((i >> 1) & 1);
        if (key < KD)
          slot.out[int64_t(key) * V + col] = sT[pn][i] * pow2_inverse(sig[(i >> 1) & 1]);
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

/// Tensor map of a raw [B, T, heads, cols] tensor (element strides st) whose box is box_cols
/// columns of one 64-token tile of one head: dims (element, token, head, batch), box (box_cols,
/// 64, 1, 1); elements past the tensor's end arrive as zeros. K / Q (bf16): 64-column boxes,
/// 128-byte swizzled; V (when its slice goes through shared memory, wy_v_in_smem): the scan's
/// value slice, unswizzled. False when the driver refuses it.
template <class E>
bool make_tile_map(CUtensorMap& m, const void* base, const int64_t (&st)[3], const KernelParams& p,
                   int cols, int heads, int box_cols, bool swizzle) {
  const auto encode = tensor_map_encoder();
  if (!encode) return false;
  const int64_t B = p.cu_seqlens ? 1 : p.N;
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(p.T), cuuint64_t(heads), cuuint64_t(B)};
  constexpr cuuint64_t es = sizeof(E);
  const cuuint64_t strides[3] = {cuuint64_t(st[1]) * es, cuuint64_t(st[2]) * es,
                                 cuuint64_t(st[0]) * es};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(kFC), 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = std::is_same_v<E, float>    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                 : std::is_same_v<E, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(&m, dt, 4, const_cast<void*>(base), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class E, int KD, int VS>
cudaError_t launch_scan_wy(const KernelParams& p, cudaStream_t stream, const char* ws,
                           const CUtensorMap& kmap, const CUtensorMap& qmap) {
  constexpr int64_t bytes = wy_scan_smem_bytes<E, KD, VS>();
  CUtensorMap vmap{};
  if (wy_v_in_smem<E, KD, VS>() && !make_tile_map<E>(vmap, p.v, p.vs, p, p.V, p.HV, VS, false))
    return cudaErrorInvalidValue;
  const auto kern = chunk_wy_scan_kernel<E, KD, VS>;
  const cudaError_t e =
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / VS);
  kern<<<dim3(unsigned(blocks)), wy_scan_threads<E>(), size_t(bytes), stream>>>(p, ws, kmap, qmap,
                                                                                vmap);
#ifdef KLA_WY_PROFILE
  wy_profile_print_kernel<<<1, 1, 0, stream>>>(0);
#endif
  return cudaGetLastError();
}

/// The transposed scan (bf16 / fp16, KD a multiple of 64, V a multiple of 64): vmap is V's map with
/// 64-column, 128-byte-swizzled boxes.
template <class E, int KD>
cudaError_t launch_scan_wy_transposed(const KernelParams& p, cudaStream_t stream, const char* ws,
                                      const CUtensorMap& kmap, const CUtensorMap& qmap,
                                      const CUtensorMap& vmap) {
  constexpr int64_t bytes = wy_t_smem_bytes<KD>();
  const auto kern = chunk_wy_scan_transposed_kernel<E, KD>;
  const cudaError_t e =
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / 64);
  kern<<<dim3(unsigned(blocks)), kWyTThreads, size_t(bytes), stream>>>(p, ws, kmap, qmap, vmap);
#ifdef KLA_WY_PROFILE
  wy_profile_print_kernel<<<1, 1, 0, stream>>>(1);
#endif
  return cudaGetLastError();
}

template <class E, int KD>
cudaError_t launch_chunk_wy_kd(const KernelParams& p, cudaStream_t stream, int sms,
                               int64_t max_smem, int force_vs, bool& ran) {
  constexpr int64_t prep_bytes = wy_prep_smem_bytes<E, KD>();
  if (prep_bytes > max_smem || wy_scan_smem_bytes<E, KD, 16>() > max_smem) return cudaSuccess;
  // bf16: the K / Q tensor maps are made before anything is launched (a layout the driver
  // refuses leaves the TF32 path); fp16 / fp32 read K and Q through the prep's images.
  constexpr bool kImages = !std::is_same_v<E, __nv_bfloat16>;
  // V's map is probed with the 16-column box (the 32-column one has the same strides).
  CUtensorMap kmap{}, qmap{}, vprobe;
  if (kImages && !p.ws_images) return cudaSuccess;
  if ((!kImages && (!make_tile_map<E>(kmap, p.k, p.ks, p, KD, p.H, 64, true) ||
                    !make_tile_map<E>(qmap, p.q, p.qs, p, KD, p.H, 64, true))) ||
      !make_tile_map<E>(vprobe, p.v, p.vs, p, p.V, p.HV, 16, false))
    return cudaSuccess;
  // Value slice: 32 columns halve the per-column traffic of the scan (every slice reads the
  // chunk's record and K / Q tiles) but also the number of blocks; take it while it still leaves
  // about one block per multiprocessor.
  bool wide = p.V % 32 == 0 && wy_scan_smem_bytes<E, KD, 32>() <= max_smem &&
              int64_t(p.N) * p.HV * (p.V / 32) >= sms / 2;
  if (force_vs == 32 && p.V % 32 == 0 && wy_scan_smem_bytes<E, KD, 32>() <= max_smem) wide = true;
  if (force_vs == 16 || force_vs == 8) wide = false;
  // 8 columns where 16 would leave more than half the multiprocessors idle (few sequences and
  // heads, e.g. 1 x 131072 x 8): twice the blocks, each with a shorter chunk step. KD >= 96 only
  // (at KD = 64 two warps share a key-row block of the state).
  bool narrow = false;
  if constexpr (KD >= 96)
    narrow = !wide && force_vs != 16 && wy_scan_smem_bytes<E, KD, 8>() <= max_smem &&
             (force_vs == 8 || int64_t(p.N) * p.HV * (p.V / 16) <= sms / 2);
  // The transposed scan (64 value columns a block, the state as the register wgmma operand;
  // KLA_CHUNK_PATH=wy64 forces it): its chunk step costs ~1.4x a 32-column step for twice the
  // columns, so a quarter of the blocks, and it pays only where its blocks still fill the
  // multiprocessors (H200: 4 x 8192 x 16 and 8 x 4096 x 16 -8%; 1 x 32768 x 16 2.2x slower;
  // prefill_notes.md, session 10).
  // fp16 takes it too (f16 wgmma on K / Q as they are; no images).
  constexpr bool kTransposable = !std::is_same_v<E, float> && KD % 64 == 0;
  CUtensorMap vmap64{};
  bool transposed = false;
  if constexpr (kTransposable)
    transposed =
        (force_vs == 64 || (force_vs == 0 && int64_t(p.N) * p.HV * (p.V / 64) >= sms - sms / 8)) &&
        p.V % 64 == 0 && wy_t_smem_bytes<KD>() <= max_smem &&
        reinterpret_cast<uintptr_t>(p.o) % 16 == 0 && p.os[0] % 8 == 0 && p.os[1] % 8 == 0 &&
        p.os[2] % 8 == 0 &&  // 16-byte O stores
        make_tile_map<E>(vmap64, p.v, p.vs, p, p.V, p.HV, 64, true) &&
        (!kImages || (make_tile_map<E>(kmap, p.k, p.ks, p, KD, p.H, 64, true) &&
                      make_tile_map<E>(qmap, p.q, p.qs, p, KD, p.H, 64, true)));
  ran = true;
  cudaError_t e = cudaFuncSetAttribute(
      chunk_wy_prep_kernel<E, KD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prep_bytes));
  if (e != cudaSuccess) return e;
  char* ws = reinterpret_cast<char*>(p.ws);
  KernelParams pp = p;
  if (transposed) pp.ws_images = nullptr;  // the prep writes no images
  chunk_wy_prep_kernel<E, KD><<<dim3(unsigned(p.max_chunks), unsigned(p.HV), unsigned(p.N)),
                                kWyThreads, size_t(prep_bytes), stream>>>(pp, ws);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  if constexpr (kTransposable)
    if (transposed) return launch_scan_wy_transposed<E, KD>(p, stream, ws, kmap, qmap, vmap64);
  if constexpr (KD >= 96)
    if (narrow) return launch_scan_wy<E, KD, 8>(p, stream, ws, kmap, qmap);
  return wide ? launch_scan_wy<E, KD, 32>(p, stream, ws, kmap, qmap)
              : launch_scan_wy<E, KD, 16>(p, stream, ws, kmap, qmap);
}

/// Runs the WY path when it applies: sm_90, workspace given, K in {64, 96, 128},
/// V a multiple of 16, shared memory fits, the driver encodes the K / Q / V tensor maps. `ran`
/// says whether it did. force_vs (8, 16 or 32; 0 = choose) pins the scan's value slice where it
/// applies, for tests.
template <class E>
cudaError_t launch_chunk_wy(const KernelParams& p, cudaStream_t stream, int cc_major, int sms,
                            int64_t max_smem, int force_vs, bool& ran) {
  ran = false;
#ifndef KLA_HAVE_SM90A
  (void)p, (void)stream, (void)cc_major, (void)sms, (void)max_smem, (void)force_vs;
  return cudaSuccess;  // the scan's wgmma needs an sm_90a image (cuda/CMakeLists.txt)
#else
  // sm_90a code runs on compute capability 9.0 only.
  if (cc_major != 9 || !p.ws || p.max_chunks <= 0 || p.N > 65535 || p.HV > 65535 || p.V % 16 != 0)
    return cudaSuccess;
  switch (p.K) {
    case 64: return launch_chunk_wy_kd<E, 64>(p, stream, sms, max_smem, force_vs, ran);
    case 96: return launch_chunk_wy_kd<E, 96>(p, stream, sms, max_smem, force_vs, ran);
    case 128: return launch_chunk_wy_kd<E, 128>(p, stream, sms, max_smem, force_vs, ran);
    default: return cudaSuccess;
  }
#endif
}

}  // namespace kla::kernels
