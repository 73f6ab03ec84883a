// Shared-memory layout of the TF32 path (prep/tf32_prep.cuh, scan/tf32_scan.cuh): plain host
// arithmetic, so the plan (plan/) sizes the kernels without CUDA and the kernels carve their
// shared memory from the same formulas.
#pragma once

#include <cstdint>

#include "layout/chunk_geometry.hpp"

namespace kla::layout {

constexpr int kTf32PrepThreads = kPrepThreads, kTf32ScanThreads = 256;

/// Prep: the raw K / Q tiles (E) and, aliased after the products, T's columns (fp32); then lm
/// [64][kMatrixPitch] and 4 x 64 per-token scalars.
constexpr int64_t tf32_prep_kq_floats(int K, int esize) {
  const int64_t kq = 2LL * kChunk * raw_pitch(esize, K) * esize / 4;
  const int64_t tm = int64_t(kChunk) * kMatrixPitch + kInvScratch;  // T + the inverse's scratch
  return kq > tm ? kq : tm;
}
constexpr int64_t tf32_prep_smem_bytes(int K, int esize) {
  return (tf32_prep_kq_floats(K, esize) + int64_t(kChunk) * kMatrixPitch + 5LL * kChunk) * 4;
}

/// Scan: pitch (floats) of the VS-wide state and value tiles, == 4 mod 16 so that the permuted
/// B-operand loads (rows 2t, 2t + 1) are conflict-free.
constexpr int tf32_scan_pitch(int VS) {
  return VS + 4;
}
/// Floats of one pipeline stage: raw K, Q, V tiles (E), T, P and the scalars (fp32).
constexpr int64_t tf32_scan_stage_floats(int K, int VS, int esize) {
  return (2LL * kChunk * raw_pitch(esize, K) + int64_t(kChunk) * VS) * esize / 4 +
         2LL * kChunk * kMatrixPitch + 5LL * kChunk;
}
/// `stages` stages, then the state slice and its split parts (3 K x SP) and 7 token tiles.
constexpr int64_t tf32_scan_smem_bytes(int K, int VS, int esize, int stages) {
  const int SP = tf32_scan_pitch(VS);
  return (stages * tf32_scan_stage_floats(K, VS, esize) + 3LL * K * SP + 7LL * kChunk * SP) * 4;
}

}  // namespace kla::layout
