// Saved states (kla_chunk_forward_saving, kla_chunk_backward_saved; kla.h "Saved states"): what a
// forward keeps so that its backward skips the state scan. Plain C++, shared by the host (sizes,
// validation) and the kernels (addresses).
//
// One record per (chunk slot, value head), chunk slots as the workspace's (chunk_geometry.hpp),
// bf16 rounded to nearest:
//   S [K][V]  the chunk's incoming state (the state after the previous chunk; the initial state,
//             or zero, for a sequence's first chunk)
//   U [C][V]  U = A^-1 diag(beta) (V^ - diag(e^G) K^ S) = T R of the WY scan (paper App. B, WY
//             form in the normalised-key form), rows past the sequence's end zero
// which is exactly what the backward's own state scan writes to its record's bf16 S and U tiles
// (bwd/bwd_layout.hpp, BwdRecord::b_s, b_u: the same [K][V], [C][V] pitch-V tiles, S then U), so
// the input gradients read either with the same copies.
#pragma once

#include <cstdint>

#include "layout/chunk_geometry.hpp"

namespace kla::layout {

/// Head dims at which a forward can save (the backward's bf16 kernels', kBwdCompiledHeadDim) and
/// the [token][column] WY scan's value slice that writes them (the transposed scan writes them at
/// its own 64 columns).
constexpr int kSavedHeadDim = 128, kSavedValueSlice = 32;
/// bf16 elements of one record.
constexpr int64_t saved_record_elems(int64_t K, int64_t V) {
  return K * V + kChunk * V;
}

}  // namespace kla::layout
