// The sequence split of kla_chunk_forward (kla_params.segments; docs/architecture.md, 'Sequence
// split'). Where few sequences and value heads leave most multiprocessors idle, every sequence is
// cut into n chunk-aligned segments that run side by side as packed sequences:
//
//   maps pass    the segments from the state [I | 0] with values [0 | v] (V' = K + V): each
//                one's final state is [A | L], its affine map S_out = A S_in + L (A the [K, K]
//                transition, L its state from zero; reference/include/kla/ref/segment.hpp,
//                proofs_check seg.combine);
//   fold         S_in(0) = the sequence's initial state, S_in(s+1) = A_s S_in(s) + L_s (fp32);
//   second pass  the segments from S_in: the outputs, and the last segment's final state.
//
// This file is host code (kla_host): the cuts, whether a call can be split and why not, the
// workspace layout and the two passes' params. cp/segments.cu has the kernels and the launch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kla/kla.h"
#include "layout/hd.hpp"

namespace kla::cp {

constexpr int kMaxSegments = 16;
/// The plan's split (measured on an H200, docs/prefill_notes.md, round 2 session 26): one pass
/// over N * HV sequences x value heads runs 16 N HV blocks at V = 128 on the WY path's narrowest
/// slices, so at N * HV <= 2 most multiprocessors idle and up to 16 segments of at least
/// kAutoMinChunks chunks pay (about 2x); at N * HV <= kAutoMaxHeads = 4 half of them idle, and 8
/// segments pay only on long sequences (kAutoLongChunks chunks); fewer than 4 segments never paid.
constexpr int64_t kAutoMaxHeads = 4;
constexpr int64_t kAutoMinChunks = 32;
constexpr int64_t kAutoLongChunks = 1024;

/// Token offset of segment j of a sequence of `len` tokens cut into n: every segment but the last
/// holds ceil(chunks / n) whole chunks of 64 tokens (the last the rest; trailing segments of a
/// short sequence are empty). The host (cu_seqlens_host of the passes) and the setup kernel
/// (their device cu_seqlens) both call it.
KLA_HD inline int64_t segment_start(int64_t len, int n, int j) {
  const int64_t chunks = (len + 63) / 64, per = (chunks + n - 1) / n;
  const int64_t s = int64_t(j) * per * 64;
  return s < len ? s : len;
}

/// Byte offsets of the split's buffers in kla_params.workspace (16-byte aligned each).
struct SplitLayout {
  int n = 1;
  int64_t N = 0, M = 0;  // sequences, segments (N n)
  int64_t tokens = 0;    // packed tokens (B T)
  int64_t HV = 0, K = 0, V = 0;
  int64_t passes = 0;    // bytes of the passes' own workspace (the larger of the two)
  int64_t values = 0;    // [tokens, HV, K + V] dtype: [0 | v]
  int64_t maps_out = 0;  // [tokens, HV, K + V] dtype: the maps pass's outputs (not read)
  int64_t identity = 0;  // [M, HV, K, K + V] fp32: [I | 0]
  int64_t maps = 0;      // [M, HV, K, K + V] fp32: [A | L]
  int64_t states = 0;    // [M, HV, K, V] fp32: S_in
  int64_t finals = 0;    // [M, HV, K, V] fp32: the second pass's final states
  int64_t cuts = 0;      // [M + 1] int32: the segments' cu_seqlens
  int64_t total = 0;     // -1: the split cannot run (split_layout)
};

/// "" if the call's layout allows a split (any n), else why not. Device independent.
std::string split_can_implement(const kla_params& p);
/// Whether the plan may split this call on some device (kla_workspace_size then includes the
/// split's buffers for kMaxSegments): segments 0 and N * HV <= kAutoMaxHeads, or segments >= 2.
bool split_possible(const kla_params& p);
/// Segments the plan takes where none is requested (1: no split), with the reason.
int auto_segments(const kla_params& p, int sms, std::string& why);
/// The workspace layout of a split into n segments (p's sizes; pure host arithmetic); total -1
/// where it would exceed 2^62 bytes or the segments (or B T tokens) 2^31-1.
SplitLayout split_layout(const kla_params& p, int n);
/// The passes' host cu_seqlens: M + 1 offsets into the packed tokens.
std::vector<int32_t> segment_cuts(const kla_params& p, int n);
/// The params of the maps pass (maps = true) or the second pass, with their buffers in
/// `workspace` at `layout`, cuts = segment_cuts(p, n) (host; the device copy is at layout.cuts).
kla_params pass_params(const kla_params& p, const SplitLayout& layout, bool maps,
                       const std::vector<int32_t>& cuts);

}  // namespace kla::cp
