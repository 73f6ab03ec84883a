// Tiling of the tokenwise (decode) kernel, scan/tokenwise.cuh: plain host arithmetic shared by the
// plan and the kernel.
#pragma once

#include <cstdint>

namespace kla::layout {

/// Warps a block (each independent) and state columns a warp.
constexpr int kTokWarps = 4;
constexpr int kTokSlice = 16;

/// The register-tile family for head dim K: state rows K <= 64, <= 128 or <= 256.
constexpr int tokenwise_kmax(int K) {
  return K <= 64 ? 64 : K <= 128 ? 128 : 256;
}

/// Blocks of a call: one warp per (sequence, value head, 16 columns), kTokWarps a block.
constexpr int64_t tokenwise_blocks(int64_t N, int64_t HV, int64_t V) {
  return (N * HV * (V / kTokSlice) + kTokWarps - 1) / kTokWarps;
}

}  // namespace kla::layout
