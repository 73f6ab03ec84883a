// Workspace geometry of the fast chunkwise path (chunk_fast.cuh), shared by the host-only
// validation (validate.cpp, no CUDA) and the kernels. One record per (chunk slot, value head):
//   T [64][64]  (I + B(A^- o K^K^T))^-1, fp32, zero above the diagonal
//   P [64][64]  read-out matrix qscale_i * (A o Q K^T)_ij * kscale_j, fp32
//   5 x 64 per-token scalars (see chunk_fast.cuh)
// Chunk slots: fixed lengths: n * ceil(T/64) + c; packed (cu_seqlens): cu[n]/64 + n + c, which
// never collide and stay below T/64 + N.
#pragma once

#include <cstdint>

namespace kla::detail {

constexpr int64_t kFastChunk = 64;
constexpr int64_t kWsFloatsPerChunk = 2 * kFastChunk * kFastChunk + 5 * kFastChunk;

inline int64_t fast_chunk_slots(int64_t N, int64_t T, bool packed) {
  return packed ? T / kFastChunk + N : N * ((T + kFastChunk - 1) / kFastChunk);
}

}  // namespace kla::detail
