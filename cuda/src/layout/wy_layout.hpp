// Layout of the WY path (prep/wy_prep.cuh, scan/wy_scan.cuh, scan/wy_scan_transposed.cuh): warp
// roles, the 128-byte-swizzled tiles, the packed triangles and every shared-memory size. Plain
// host arithmetic: the plan (plan/) decides with the same numbers the kernels carve their shared
// memory with.
#pragma once

#include <cstdint>

#include "layout/chunk_geometry.hpp"
#include "layout/hd.hpp"

namespace kla::layout {

/// Byte offset of element (i, j), j <= i's block, of a packed lower-triangular 64 x 64 bf16 tile:
/// block (i / 16, j / 16) at index mi(mi+1)/2 + kb, inside it the four 8 x 8 matrices of an A
/// fragment in ldmatrix order (rows 0-7 | 8-15 of columns 0-7, then of columns 8-15), rows of
/// 16 B. Lane l of an ldmatrix.x4 then reads the block's bytes [16 l, 16 l + 16): one 512-byte
/// sweep, conflict-free, and the blocks above the diagonal (zero) take no room.
KLA_HD constexpr int wy_packed_offset(int i, int j) {
  const int mi = i >> 4, kb = j >> 4;
  return (mi * (mi + 1) / 2 + kb) * int(WyRecord::block) + (((i >> 3) & 1) + ((j >> 2) & 2)) * 128 +
         (i & 7) * 16 + (j & 7) * 2;
}

/// Bytes of one 2-byte K or Q tile in the 128-byte-swizzled panel layout (kmajor_sw128_offset):
/// 64-column panels of 64 rows x 128 B.
constexpr int64_t wy_tile_bytes(int KD) {
  return int64_t((KD + 63) / 64) * kChunk * 128;
}

// ---- prep (chunk_wy_prep_kernel) ---------------------------------------------------------------
constexpr int kWyPrepThreads = kPrepThreads;
/// Blocks a multiprocessor the prep is compiled for (__launch_bounds__): 4, fp32 3 (its tiles take
/// twice the shared memory).
constexpr int wy_prep_min_blocks(Elem e) {
  return e == Elem::F32 ? 3 : 4;
}
/// The prep's shared layout: the K tile and the lead region it opens (K, then the inverse's
/// scratch beside P split; bf16 / fp16: 1024-byte aligned, so that the Q tile after it is a wgmma
/// operand too), the region after it (Q, then lm | T), and the 7 x 64 scalars.
struct WyPrepLayout {
  bool swizzled;  // bf16 / fp16: 128-byte-swizzled panels (wgmma operands); fp32: rows
  int64_t kq, l, lead, region, bytes;
};
constexpr WyPrepLayout wy_prep_layout(Elem e, int KD) {
  WyPrepLayout y{};
  y.swizzled = elem_bytes(e) == 2;
  y.kq = y.swizzled ? wy_tile_bytes(KD) : int64_t(kChunk) * raw_pitch(elem_bytes(e), KD) * 4;
  y.l = int64_t(kChunk) * kMatrixPitch * 4;
  const int64_t scratch = kInvScratch * 4 + 2 * WyRecord::tile;
  const int64_t lead_min = y.kq > scratch ? y.kq : scratch;
  y.lead = y.swizzled ? (lead_min + 1023) / 1024 * 1024 : lead_min;
  y.region = y.kq > 2 * y.l ? y.kq : 2 * y.l;
  y.bytes = y.lead + y.region + 7 * kChunk * 4;
  return y;
}

// ---- scan (chunk_wy_scan_kernel): warp roles ---------------------------------------------------
/// 8 recurrence warps (R, X and the state: the chain from chunk to chunk), 4 read-out warps (O,
/// off the chain), and the producer, which issues the copies: for bf16 / fp16 a warp of its own
/// (on a read-out warp its five tensor copies a chunk would delay that warpgroup's Q S wgmma and
/// with it the chunk; docs/prefill_notes.md, 'Design decisions'), for fp32 (one bulk copy of the
/// images) the first read-out warp.
constexpr int kWyRecWarps = 8, kWyReadWarps = 4;
constexpr bool wy_own_producer(Elem e) {
  return e != Elem::F32;
}
constexpr int wy_producer_warp(Elem e) {
  return kWyRecWarps + (wy_own_producer(e) ? kWyReadWarps : 0);
}
constexpr int wy_scan_threads(Elem e) {
  return (kWyRecWarps + kWyReadWarps + (wy_own_producer(e) ? 1 : 0)) * 32;
}

// ---- scan: tiles -------------------------------------------------------------------------------
/// Pitch (elements) of the scan's VS-wide bf16 tiles: rows 16 B apart modulo 128 (ldmatrix
/// conflict-free; VS = 8 takes 48-byte rows as VS = 16 does).
constexpr int wy_scan_pitch(int VS) {
  return VS == 8 ? 24 : VS + 8;
}
/// Column groups of a VS-column value slice: two halves (warpgroup j's step A takes half j), or
/// one group at VS = 8 (step A on warpgroup 0 alone). The split B tiles hold each group's hi rows,
/// then its lo rows (wy_split_row).
constexpr int wy_groups(int VS) {
  return VS >= 16 ? 2 : 1;
}
/// Bytes of one K or Q tile in a scan stage: bf16 / fp16, the raw TMA boxes (exact wgmma operands
/// of the bf16 / f16 instruction); fp32, the prep's image of the tile split into bf16 hi + lo
/// (each 64-column panel as its hi panel, then its lo panel).
constexpr int64_t wy_kq_tile_bytes(Elem e, int KD) {
  return wy_kq_images(e) ? 2 * wy_tile_bytes(KD) : wy_tile_bytes(KD);
}
static_assert(wy_image_bytes(64, true) == wy_kq_tile_bytes(Elem::F32, 64) &&
                  wy_image_bytes(96, true) == wy_kq_tile_bytes(Elem::F32, 96) &&
                  wy_image_bytes(128, true) == wy_kq_tile_bytes(Elem::F32, 128) &&
                  wy_image_bytes(128, false) == 0,
              "the workspace's images are the scan's tiles");
/// Bytes of the split state as the wgmma B operand: [KD / 64 panels][2 VS rows][128 B].
constexpr int64_t wy_state_split_bytes(int KD, int VS) {
  return int64_t((KD + 63) / 64) * 2 * VS * 128;
}
/// Row of value column c's part p (0 hi, 1 lo) in the scan's split wgmma B tiles (S, X): each
/// column group of the slice as its hi rows, then its lo rows, so that one wgmma over a group
/// (N = 2 VS / groups) or the slice (N = 2 VS) gives both parts.
template <int VS>
KLA_HD constexpr int wy_split_row(int c, int p) {
  constexpr int gw = VS / wy_groups(VS);  // columns a group
  return (c / gw) * 2 * gw + p * gw + c % gw;
}
/// The split B tiles are laid out one to one: wy_split_row maps (column, part) onto the 2 VS
/// rows, and kmajor_sw128_offset maps every (row, k) of a [KD / 64 panels][2 VS rows] tile onto
/// its own 2 bytes, 8 consecutive k to each 16-byte piece (what stmatrix and the wgmma
/// descriptors assume).
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

// ---- scan: shared memory -----------------------------------------------------------------------
/// One stage: record | K tile | Q tile | V slice [64][VS] raw (when V goes through the stages).
constexpr int64_t wy_stage_bytes_v(Elem e, int KD, int VS, bool v_in_smem) {
  return WyRecord::bytes + 2 * wy_kq_tile_bytes(e, KD) +
         (v_in_smem ? int64_t(kChunk) * VS * elem_bytes(e) : 0);
}
/// fp16's per-column scales (fp32): the recurrence warps' partial column maxima [8][VS], the
/// state split's scales [2 buffers][VS], X's [VS]; nothing for bf16 / fp32.
constexpr int64_t wy_scale_floats(Elem e, int VS) {
  return e == Elem::F16 ? int64_t(kWyRecWarps + 3) * VS : 0;
}
/// `stages` stages, the state split twice (S_c read while S_c+1 is written) and X split (wgmma B
/// tiles, K-major: [value column][key or token]), R split ([token][SP], mma.sync B), the stage
/// barriers, then fp16's column scales.
constexpr int64_t wy_scan_smem_bytes_v(Elem e, int KD, int VS, bool v_in_smem, int stages = 2) {
  return stages * wy_stage_bytes_v(e, KD, VS, v_in_smem) + 2 * wy_state_split_bytes(KD, VS) +
         2LL * VS * 128 + 2LL * kChunk * wy_scan_pitch(VS) * 2 + stages * 8 +
         4 * wy_scale_floats(e, VS);
}
/// Whether the scan's V slice goes through the stages (a tensor copy a chunk) or, where the
/// stages have no room for it (fp32 at VS = 32), from global memory straight to the
/// recurrence warps' registers a chunk ahead (the slower way where both fit; docs/prefill_notes.md,
/// 'Design decisions').
constexpr bool wy_v_in_smem(Elem e, int KD, int VS) {
  return wy_scan_smem_bytes_v(e, KD, VS, true) <= kSm90MaxSmem;
}
constexpr int64_t wy_stage_bytes(Elem e, int KD, int VS) {
  return wy_stage_bytes_v(e, KD, VS, wy_v_in_smem(e, KD, VS));
}
/// Stages of the scan's copy ring: three at VS = 8 where they fit, so that a chunk's copies have
/// two chunk periods to land, not one; else two (a third stage does not pay at VS >= 16;
/// docs/prefill_notes.md, 'Design decisions').
constexpr int wy_scan_stages(Elem e, int KD, int VS) {
  return VS == 8 && wy_v_in_smem(e, KD, VS) &&
                 wy_scan_smem_bytes_v(e, KD, VS, true, 3) <= kSm90MaxSmem
             ? 3
             : 2;
}
constexpr int64_t wy_scan_smem_bytes(Elem e, int KD, int VS) {
  return wy_scan_smem_bytes_v(e, KD, VS, wy_v_in_smem(e, KD, VS), wy_scan_stages(e, KD, VS));
}

// ---- transposed scan (chunk_wy_scan_transposed_kernel) -----------------------------------------
/// A chain warpgroup and a helper warpgroup (copies, the [T; P T] tiles, the O tile's stores).
constexpr int kWyTThreads = 256, kWyTChainThreads = 128;
/// Value columns a block.
constexpr int kWyTColumns = 64;
/// One stage: record | K and Q, [KD / 64 panels][K's 64 rows | Q's 64 rows][128 B swizzled] (each
/// panel one K-major B tile of 128 rows) | V's 64 columns [64 rows][128 B swizzled].
constexpr int64_t wy_t_stage_bytes(int KD) {
  return WyRecord::bytes + 2 * wy_tile_bytes(KD) + int64_t(kChunk) * 128;
}
/// Two stages, two [T; P T] buffers of hi and lo parts, the O tile [64 tokens][128 B swizzled],
/// the two stage barriers.
constexpr int64_t wy_t_smem_bytes(int KD) {
  return 2 * wy_t_stage_bytes(KD) + 4 * (2 * kChunk * 128) + kChunk * 128 + 2 * 8;
}
/// The saving scan (kSave, kla_chunk_forward_saving) also holds the chunk's incoming S and its U,
/// transposed for the helpers' stores: [KD keys | 64 tokens][128 B swizzled] bf16 after the rest.
constexpr int64_t wy_t_save_tile_offset(int KD) {
  return (wy_t_smem_bytes(KD) + 127) / 128 * 128;
}
constexpr int64_t wy_t_saving_smem_bytes(int KD) {
  return wy_t_save_tile_offset(KD) + int64_t(KD + kChunk) * 128;
}

}  // namespace kla::layout
