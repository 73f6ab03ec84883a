// WY path, pass 1 (prep): chunk_wy_prep_kernel, fully parallel over (sequence, chunk, value head),
// for bf16 / fp16 storage and fp32 with arithmetic FAST on sm_90a. It forms what the scan needs of
// a chunk without the state (paper App. B, WY form, in the normalised-key form):
//   T = (I + B(A^- o K^K^T))^-1    (prep/invert.cuh: fp32 diagonal blocks, the blocks below on the
//                                   tensor cores in split TF32)
//   P T, P = the masked read-out matrix (A o Q K^T) scaled by qscale_i and kscale_j
//   the per-token scalars (gamma qscale, update scale, gamma_L, beta kscale, beta kscale gamma)
// written split (bf16 hi + lo) into the chunk's workspace record: the lower 16 x 16 blocks only,
// packed in ldmatrix order (layout/wy_layout.hpp, wy_packed_offset), 22 KB whatever the head
// dims. K K^T and Q K^T: bf16 / fp16 one m64n64 wgmma chain a warpgroup on the K and Q tiles
// loaded in the 128-byte swizzle (exact products, fp32 sums); fp32 split TF32 on mma.sync. fp32
// (for the [token][column] scan) also writes the chunk's K and Q tiles split into bf16 hi + lo as
// the scan's wgmma operand images (write_wy_images), once per key head.
//
// Precision: T fp32-grade (~2^-21); P T from fp32 P and T entering the tensor cores split (hi hi +
// hi lo + lo hi, ~2^-16 relative), below the bf16 / fp16 storage roundoff that bounds the outputs.
#pragma once

#include <type_traits>

#include "arch/copy.cuh"
#include "arch/mma_bf16.cuh"
#include "arch/mma_tf32.cuh"
#include "arch/split.cuh"
#include "arch/wgmma.cuh"
#include "layout/wy_layout.hpp"
#include "prep/invert.cuh"
#include "prep/tile_loads.cuh"
#include "prep/token_scalars.cuh"

namespace kla::kernels {

/// Chunk slot `slot`'s K image (its Q image follows) for key head h in the workspace
/// (layout/chunk_geometry.hpp; images of KD-column tiles).
template <int KD>
__device__ __forceinline__ char* wy_image_pair(const KernelParams& p, int64_t slot, int h) {
  return p.ws_images + (slot * p.H + h) * (2 * wy_image_bytes(KD, true));
}

/// fp32 (arithmetic FAST): the chunk's K and Q tiles (raw in shared memory, rows of pitch KP, rows
/// past the chunk zero) as the [token][column] scan's wgmma A operands, split into bf16 hi + lo: a
/// K image then a Q image at dst (chunk_geometry.hpp), each 64-column panel as its hi panel then
/// its lo panel, 64 rows x 128 B with the 128-byte swizzle (16-byte piece c of row r at c ^ r %
/// 8), columns past KD zero; 16 significant bits (relative error <= 2^-17). Piece order: 8
/// consecutive threads fill one 128-byte line. Called by all kWyPrepThreads threads.
template <int KD>
__device__ __forceinline__ void write_wy_images(const float* Kr, const float* Qr, int KP,
                                                char* dst) {
  constexpr int kPanels = (KD + 63) / 64, kPieces = kChunk * kPanels * 8, kPanel = kChunk * 128;
  constexpr int64_t kImage = 2LL * kPanels * kPanel;
  static_assert(kImage == wy_image_bytes(KD, true),
                "the workspace's image size (layout/chunk_geometry.hpp)");
  for (int idx = int(threadIdx.x); idx < 2 * kPieces; idx += kWyPrepThreads) {
    const bool isq = idx >= kPieces;
    const int q = isq ? idx - kPieces : idx, row = q / (kPanels * 8), pn = (q >> 3) % kPanels,
              c = q & 7, k0 = pn * 64 + c * 8;
    const int line = kmajor_sw128_offset(row, k0, kChunk);  // in the tile, or in a part's panels
    uint4 hi = make_uint4(0, 0, 0, 0), lo = hi;
    if (k0 < KD) {
      const float* src = (isq ? Qr : Kr) + row * KP + k0;
      const float4 a = *reinterpret_cast<const float4*>(src);
      const float4 b = *reinterpret_cast<const float4*>(src + 4);
      split_bf16x2(a.x, a.y, hi.x, lo.x);
      split_bf16x2(a.z, a.w, hi.y, lo.y);
      split_bf16x2(b.x, b.y, hi.z, lo.z);
      split_bf16x2(b.z, b.w, hi.w, lo.w);
    }
    char* d = dst + (isq ? kImage : 0) + pn * kPanel + line;
    *reinterpret_cast<uint4*>(d) = hi;
    *reinterpret_cast<uint4*>(d + kPanel) = lo;
  }
}

// 4 blocks a multiprocessor (64 registers a thread): the prep is bound by issue and latency and
// runs faster at 4 blocks than at 3 with more registers (docs/prefill_notes.md, 'Design
// decisions'). fp32 tiles take twice the shared memory, so 3 blocks fit.
template <class E, int KD>
__global__ void __launch_bounds__(kWyPrepThreads, sizeof(E) == 4 ? 3 : 4)
    chunk_wy_prep_kernel(const KernelParams p, char* __restrict__ ws) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using R = WyRecord;
  constexpr WyPrepLayout Lay = wy_prep_layout(elem_of<E>(), KD);
  constexpr int C = kChunk, KP = raw_pitch(int(sizeof(E)), KD);
  // bf16 / fp16: K and Q as 128-byte-swizzled panels, K K^T and Q K^T by wgmma (exact products,
  // fp32 sums); fp32: rows of KP elements, the products in split TF32 on mma.sync.
  constexpr bool kSw = Lay.swizzled;
  extern __shared__ __align__(1024) float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const PrepTile pt = prep_tile(p);
  if (pt.L == 0) return;
  const int c = pt.c, hv = pt.hv, n = pt.n, h = pt.h, L = pt.L;
  const SeqRange sr = pt.sr;
  const int64_t tb = pt.tb;

  constexpr int64_t kq_bytes = Lay.kq, l_bytes = Lay.l;
  // The lead region holds K, then the inverse's scratch beside P split (hi, lo) for P T. The
  // region after it holds Q until the masked K K^T overwrites it (Q K^T waits in registers by
  // then), then lm and T side by side: fp32 (KD = 128) 69 KB in all, so that 3 blocks fit a
  // multiprocessor.
  constexpr int64_t region_bytes = Lay.region, lead_bytes = Lay.lead;
  E* Kr = reinterpret_cast<E*>(smem);    // raw keys, then the inverse's scratch
  char* Ps = smem + kInvScratch * 4;     // P split (before the inverse): packed hi tile, then lo
  char* region = smem + lead_bytes;      // Q, then lm | T
  E* Qr = reinterpret_cast<E*>(region);  // raw queries
  float* lm = reinterpret_cast<float*>(region);  // [C][kMatrixPitch] B(A^- o K^K^T)
  char* Ts = region;  // T split (after the inverse, in lm's place): packed hi tile, then lo
  float* tm = reinterpret_cast<float*>(region + l_bytes);  // [C][kMatrixPitch] T
  float* ksc = reinterpret_cast<float*>(region + region_bytes);
  float* bet = ksc + C;
  float* qsc = bet + C;
  float* Gv = qsc + C;
  float* kn2 = Gv + C;   // squared key norms
  float* vsc = kn2 + C;  // value scales (token_coef)
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
  // fp32: the K / Q images every value slice of the scan reads, once per key head (by its
  // group's first value head); bf16 / fp16 K and Q go to the scans by tensor copies as they are.
  if constexpr (wy_kq_images(elem_of<E>()))
    if (p.ws_images && (p.HV == p.H || hv % (p.HV / p.H) == 0))
      write_wy_images<KD>(Kr, Qr, KP, wy_image_pair<KD>(p, slot, h));
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
  // 8-column tile nj. The products leave the warps' issue slots and registers, which mma.sync
  // over 16 x 16 tiles would take (docs/prefill_notes.md, 'Design decisions').
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
      wgmma_ss<0, E>(wd, wgmma_desc_advance(ad0, off), wgmma_desc_advance(bd0, off));
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
  chunk_token_scalars(p, L, Kr, Qr, KP, KD, ksc, vsc, bet, qsc, Gv, kn2, kSw);  // + barrier
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
    *reinterpret_cast<float2*>(lm + i * kMatrixPitch + j) = make_float2(x0, x1);
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
  for (int q = tid; q < int(R::tile / 16); q += kWyPrepThreads) {
    const int b = q >> 5, m = (q >> 3) & 3, mi = b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3;
    const int i = mi * 16 + (m & 1) * 8 + (q & 7), j0 = (b - mi * (mi + 1) / 2) * 16 + (m >> 1) * 8;
    const float4 x0 = *reinterpret_cast<const float4*>(tm + i * kMatrixPitch + j0);
    const float4 x1 = *reinterpret_cast<const float4*>(tm + i * kMatrixPitch + j0 + 4);
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
  for (int u = warp; u < 10; u += kWyPrepThreads / 32) {
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
  for (int i = tid; i < kWyScalars; i += kWyPrepThreads) {
    float x = 0.f;
    if (i < C)
      x = expf(Gv[i]) * qsc[i];
    else if (i < kWyGend)
      x = i - C < L ? ksc[i - C] * expf(Gend - Gv[i - C]) : 0.f;
    else if (i == kWyGend)
      x = expf(KLA_MUTANT(handoff_decay_off_by_one) && L > 1 ? Gv[L - 2] : Gend);
    else if (i >= kWyColU && i < kWyColU + C)
      x = bet[i - kWyColU] * vsc[i - kWyColU];
    else if (i >= kWyColW && i < kWyColW + C)
      x = bet[i - kWyColW] * ksc[i - kWyColW] * __expf(Gv[i - kWyColW]);
    sc[i] = x;
  }
#endif
}

}  // namespace kla::kernels
