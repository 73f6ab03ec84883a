// Shared-memory layout of the generic (workspace-free) chunkwise kernel, scan/generic_chunk.cuh:
// plain host arithmetic shared by the plan and the kernel.
#pragma once

#include <cstdint>

namespace kla::layout {

constexpr int kGenericThreads = 256;

/// The generic kernel's tiling: chunk length C (32 or 64) and value columns per block VS.
struct GenericTiling {
  int C;
  int VS;
};

/// Floats of shared memory (row pitches padded by one word against bank conflicts):
/// kh[C][K+1], qs[C][K+1], st[K][VS+1], us[C][VS+1], os[C][VS+1], lm[C][C+1], pm[C][C+1], 4 x C.
constexpr int64_t generic_smem_floats(int K, GenericTiling t) {
  const int C = t.C, VS = t.VS;
  return 2LL * C * (K + 1) + int64_t(K) * (VS + 1) + 2LL * C * (VS + 1) + 2LL * C * (C + 1) +
         4LL * C;
}

}  // namespace kla::layout
