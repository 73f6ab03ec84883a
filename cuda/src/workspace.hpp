// Workspace geometry of the fast chunkwise paths, shared by the host-only validation
// (validate.cpp, no CUDA) and the kernels. One record per (chunk slot, value head); the
// workspace holds slots * HV records of the larger of the two layouts below.
//
// TF32 path (chunk_fast.cuh: fp32 storage, head dims off the WY path's list, pre-sm_90):
//   T [64][64]  (I + B(A^- o K^K^T))^-1, fp32, zero above the diagonal
//   P [64][64]  read-out matrix qscale_i * (A o Q K^T)_ij * kscale_j, fp32
//   5 x 64 per-token scalars (see chunk_fast.cuh)
// WY path (chunk_wy.cuh: bf16 / fp16 / fp32 storage, K in {64, 96, 128}, V % 16 == 0, sm_90):
//   T_hi, T_lo, PT_hi, PT_lo: the 10 lower 16 x 16 blocks of T and of P T (bf16 split hi + lo),
//                block (mi, kb <= mi) at index mi(mi+1)/2 + kb, 512 B each in ldmatrix order
//                (chunk_wy.cuh, wy_packed_offset); the blocks above the diagonal are zero and
//                not stored
//   512 floats   per-token scalars
//   fp16 (and fp32 with fp32_math FAST) also keeps, after all records, each chunk's K and Q tiles
//   split into bf16 hi + lo (written by the prep, read by every value slice of the scan): per
//   (chunk slot, key head) a K image then a Q image, each [ceil(K/64) 64-column panels][hi 64 x 128
//   B | lo 64 x 128 B], the shared-memory image of the scan's wgmma A tiles (128-byte swizzle).
// Chunk slots: fixed lengths: n * ceil(T/64) + c; packed (cu_seqlens): cu[n]/64 + n + c, which
// never collide and stay below T/64 + N.
#pragma once

#include <cstdint>

namespace kla::detail {

constexpr int64_t kFastChunk = 64;
constexpr int64_t kWsFloatsPerChunk = 2 * kFastChunk * kFastChunk + 5 * kFastChunk;

/// Bytes of one WY record (independent of the head dims): 4 packed triangles + the scalars.
constexpr int64_t kWyRecordBytes = 4 * 10 * 16 * 16 * 2 + 512 * 4;
/// Bytes of one workspace record: room for either path.
constexpr int64_t ws_record_bytes(int64_t K, int64_t V) {
  (void)K, (void)V;  // both layouts are fixed today; the head dims stay in the signature
  const int64_t tf32 = kWsFloatsPerChunk * 4, wy = kWyRecordBytes;
  return tf32 > wy ? tf32 : wy;
}

/// Whether a call's WY path reads K / Q images: fp16 storage, and fp32 with fp32_math FAST
/// (the accurate fp32 path is the TF32 one); bf16's raw tiles are exact wgmma operands. Takes
/// the kla_dtype and kla_fp32_math values (kla.h).
constexpr bool wy_needs_images(int dtype, int fp32_math) {
  return dtype == 2 /* KLA_DTYPE_FP16 */ ||
         (dtype == 0 /* KLA_DTYPE_FP32 */ && fp32_math == 1 /* KLA_FP32_MATH_FAST */);
}
/// Bytes of one K or Q image (the WY path's split tiles), 0 where the WY path keeps none (no
/// images wanted, or K off its list).
constexpr int64_t wy_image_bytes(int64_t K, bool images) {
  if (!images || (K != 64 && K != 96 && K != 128)) return 0;
  return 2 * ((K + 63) / 64) * kFastChunk * 128;
}

inline int64_t fast_chunk_slots(int64_t N, int64_t T, bool packed) {
  return packed ? T / kFastChunk + N : N * ((T + kFastChunk - 1) / kFastChunk);
}
/// Bytes of all records, slots * HV of them: the offset at which the K / Q images begin.
inline int64_t ws_records_bytes(int64_t N, int64_t T, bool packed, int64_t HV, int64_t K,
                                int64_t V) {
  return fast_chunk_slots(N, T, packed) * HV * ws_record_bytes(K, V);
}

}  // namespace kla::detail
