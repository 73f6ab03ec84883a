// Geometry shared by the host (validation, plan, workspace sizing: no CUDA) and the kernels: the
// chunk length, the element types, the workspace's records and images, the preps' matrices.
// One definition of each constant; the kernels' layouts (tf32_layout.hpp, wy_layout.hpp,
// generic_layout.hpp) build on it.
//
// Workspace (kla_params.workspace, kla_workspace_size): one record per (chunk slot, value head),
// each of the larger of the two paths' layouts, then (WY path, fp32 FAST) the K / Q images.
//   TF32 record (fp32): T [64][64] = (I + B(A^- o K^K^T))^-1 (zero above the diagonal),
//     P [64][64] the read-out matrix qscale_i (A o Q K^T)_ij kscale_j, 5 x 64 per-token scalars.
//   WY record: T_hi, T_lo, PT_hi, PT_lo: the 10 lower 16 x 16 blocks of T and of P T split into
//     bf16 hi + lo (block (mi, kb <= mi) at index mi(mi+1)/2 + kb, 512 B each in ldmatrix order,
//     wy_packed_offset), then 512 floats of per-token scalars.
//   K / Q images (after all records): per (chunk slot, key head) a K image then a Q image, each
//     [ceil(K/64) 64-column panels][hi 64 x 128 B | lo 64 x 128 B], the chunk's tiles split into
//     bf16 hi + lo in the scan's wgmma layout (128-byte swizzle).
// Chunk slots: fixed lengths n * ceil(T/64) + c; packed (cu_seqlens) cu[n]/64 + n + c, which never
// collide and stay below T/64 + N.
#pragma once

#include <cstdint>

#include "layout/hd.hpp"

namespace kla::layout {

/// Tokens per chunk of the two-pass paths (TF32, WY).
constexpr int kChunk = 64;
/// Shared memory of a compute capability 9.0 multiprocessor: 228 KB, of which each resident block
/// reserves 1 KB; the largest dynamic shared memory one block may opt into (the WY path, the
/// backward's bf16 kernels) is the rest, 227 KB.
constexpr int64_t kSm90SmemPerMultiprocessor = 228 * 1024, kSm90SmemReservedPerBlock = 1024;
constexpr int64_t kSm90MaxSmem = kSm90SmemPerMultiprocessor - kSm90SmemReservedPerBlock;
/// Threads of either prep kernel (prep/token_scalars.cuh is written for this count).
constexpr int kPrepThreads = 256;

/// Storage types of q, k, v, o; the values of kla_dtype.
enum class Elem : int { F32 = 0, BF16 = 1, F16 = 2 };
constexpr int elem_bytes(Elem e) {
  return e == Elem::F32 ? 4 : 2;
}

/// Byte offset of element (n, k) of a 2-byte K-major tile in the 128-byte swizzle (the TMA boxes'
/// and the wgmma operands' layout): panels of 64 k (NR rows x 128 B each), 16-byte piece c of row n
/// at piece c ^ n % 8.
KLA_HD constexpr int kmajor_sw128_offset(int n, int k, int NR) {
  return (k >> 6) * NR * 128 + n * 128 + ((((k >> 3) & 7) ^ (n & 7)) << 4) + (k & 7) * 2;
}

// ---- the preps' 64 x 64 matrices ---------------------------------------------------------------
/// Pitch (floats) of 64 x 64 fp32 matrices used as mma A operands: == 4 mod 32, conflict-free.
constexpr int kMatrixPitch = kChunk + 4;
/// Floats of scratch that the blocked triangular inverse needs (prep/invert.cuh).
constexpr int kInvScratch = 6 * 16 * 12;
/// Row pitch (elements) of raw K / Q tiles in shared memory: rows 16-byte aligned and A-operand
/// fragment loads conflict-free (pitch == 4 mod 32 words).
constexpr int raw_pitch(int esize, int K) {
  return K + 16 / esize;
}

// ---- workspace records -------------------------------------------------------------------------
/// TF32 record, in floats: T at 0, P at kTf32P, the scalars at kTf32Scalars (5 x 64).
constexpr int kTf32T = 0, kTf32P = kChunk * kChunk, kTf32Scalars = 2 * kChunk * kChunk;
constexpr int64_t kTf32RecordFloats = 2 * kChunk * kChunk + 5 * kChunk;

/// WY record scalars (floats from the scalars' start): [0,64) gamma qscale, [64,128) update scale
/// kscale gamma_L / gamma_i (0 past the chunk end), [128] gamma_L, [256,320) beta kscale,
/// [320,384) beta kscale gamma.
constexpr int kWyScUpd = 64, kWyGend = 128, kWyColU = 256, kWyColW = 320, kWyScalars = 512;
/// Byte offsets inside one WY record: four packed lower triangles of 16 x 16 bf16 blocks, then
/// the scalars.
struct WyRecord {
  static constexpr int64_t block = 16 * 16 * 2, tile = 10 * block;
  static constexpr int64_t th = 0, tl = tile, ph = 2 * tile, pl = 3 * tile, sc = 4 * tile,
                           bytes = sc + kWyScalars * 4;
};

/// Bytes of one workspace record: room for either path's layout (both are fixed; the head dims
/// stay in the signature for layouts that may depend on them).
constexpr int64_t ws_record_bytes(int64_t K, int64_t V) {
  (void)K, (void)V;
  const int64_t tf32 = kTf32RecordFloats * 4, wy = WyRecord::bytes;
  return tf32 > wy ? tf32 : wy;
}

/// Whether the WY path's [token][column] scan takes K and Q as the prep's images (fp32: split into
/// bf16 hi + lo) rather than by tensor copies of the raw tiles (bf16 / fp16: exact operands of the
/// bf16 / f16 wgmma). The transposed scan always takes the raw tiles.
constexpr bool wy_kq_images(Elem e) {
  return e == Elem::F32;
}
/// Whether a call's WY scan reads K / Q images: fp32 runs the WY path with arithmetic FAST only.
/// Takes the kla_dtype / kla_arithmetic values.
constexpr bool wy_needs_images(int dtype, int arithmetic) {
  return wy_kq_images(Elem(dtype)) && arithmetic == 1 /* FAST */;
}
/// Bytes of one K or Q image, 0 where none is kept (no images wanted, or K off the WY list).
constexpr int64_t wy_image_bytes(int64_t K, bool images) {
  if (!images || (K != 64 && K != 96 && K != 128)) return 0;
  return 2 * ((K + 63) / 64) * kChunk * 128;
}

/// Chunk slots of the workspace: one per (sequence, chunk).
constexpr int64_t chunk_slots(int64_t N, int64_t T, bool packed) {
  return packed ? T / kChunk + N : N * ((T + kChunk - 1) / kChunk);
}
/// Bytes of all records, slots * HV of them: the offset at which the K / Q images begin.
constexpr int64_t ws_records_bytes(int64_t N, int64_t T, bool packed, int64_t HV, int64_t K,
                                   int64_t V) {
  return chunk_slots(N, T, packed) * HV * ws_record_bytes(K, V);
}

}  // namespace kla::layout
