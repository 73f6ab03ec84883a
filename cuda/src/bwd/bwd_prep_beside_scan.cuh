// Backward, pass 1 of kla_chunk_backward_saved where its state-gradient scan is one wave
// (bwd_saved_prep_beside_scan, bwd/bwd_layout.hpp): bwd_prep_bf16_beside_scan_kernel, the saved
// prep's records (bwd_prep_bf16_tile<E, true>, bitwise those of bwd_prep_bf16_kernel) formed
// while the scan (bwd/bwd_state_backward_bf16.cuh) already consumes them, instead of before it.
//
// Schedule. The grid is resident at once (kBwdPrepBf16Blocks[1] blocks a multiprocessor, nothing
// else of this call beside them), and each block takes the (chunk, value head) items in turn from
// a counter, in the order the scan reads them (bwd_beside_item). Every block works on the first
// BwdParams::beside_first items; after them, the first block to arrive on each multiprocessor
// stays and takes the rest from a second counter, and the others leave. The scan, launched
// programmatically after this grid (bwd_launch_beside) and started once every block of it runs
// (griddepcontrol.launch_dependents, first thing here), takes the multiprocessors' room as the
// leaving blocks free it, one scan block beside one prep block (bwd_layout.hpp has the budget).
// The leavers make the first items at the prep's full rate; each stayer, sharing its
// multiprocessor with a scan block, makes the rest at about half of it, and the two slow each
// other (docs/prefill_notes.md, round 2 session 40 has the measured spans).
//
// Hand-off. After a record's last write and a block barrier, thread 0 sets the record's ready flag
// (in its u slot, which the saved configuration leaves free: kBwdReadyFlagBytes) with release
// semantics at gpu scope; the scan's copying thread reads flags relaxed and, once they are set,
// fences (acquire, then the async proxy: its bulk copies) before it copies (bwd_take_ready_chunks).
// The host zeroes the flags and counters on the call's stream first (bwd_launch.cuh).
//
// Termination. No prep block waits for anything (only for the counters' atomics), and every prep
// block is resident before any scan block starts, so each flag the scan waits for is set by a
// running block: the waits end. Which block forms a record does not change its bits (a record is
// formed by one block, in bwd_prep_bf16_tile's fixed order), so the gradients are bitwise those of
// the prep run before the scan.
#pragma once

#include <type_traits>

#include "bwd/bwd_prep_bf16.cuh"

namespace kla::kernels {

/// The tile of item i (bwd_layout.hpp bwd_beside_item: the scan's order; L = 0 past the first
/// chunk of its sequence).
__device__ __forceinline__ PrepTile bwd_beside_tile(const KernelParams& p, int i) {
  const BwdBesideItem it = bwd_beside_item(i, p.N, p.HV);
  const int64_t len = seq_range(p, it.n).len;
  const int c = int((len + kChunk - 1) / kChunk) - 1 - it.step;
  PrepTile t = prep_tile_at(p, c < 0 ? 0 : c, it.hv, it.n);
  if (c < 0) t.L = 0;
  return t;
}

/// The ready flag of a record (its u slot's first int; bwd_layout.hpp kBwdReadyFlagBytes).
__device__ __forceinline__ int* bwd_ready_flag(const float* rec) {
  constexpr BwdRecord R(bwd_bf16::K, bwd_bf16::V);
  return reinterpret_cast<int*>(const_cast<float*>(rec) + R.u);
}
/// The schedule's counters after record 0's flag: [0] the next item of every block, [1] the next
/// item after beside_first (the stayers'), [2 + m] the blocks that arrived on multiprocessor m.
__device__ __forceinline__ int* bwd_beside_counters(const BwdParams& bp) {
  return bwd_ready_flag(bp.ws) + kBwdReadyFlagBytes / 4;
}

template <class E>
__global__ void __launch_bounds__(kBwdPrepBf16Threads, kBwdPrepBf16Blocks[1])
    bwd_prep_bf16_beside_scan_kernel(const BwdParams bp) {
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  __builtin_assume(blockDim.x == kBwdPrepBf16Threads);  // the launcher's (bwd_launch.cuh)
  grid_launch_dependents();  // the scan may start once every block here has
  const KernelParams& p = bp.f;
  // Thread 0 schedules; nothing of it stays in registers across a tile (the parameters are
  // re-read, the block's state is in shared memory), which keeps the tile's registers its own.
  __shared__ int item_s, stays_s;
  if (threadIdx.x == 0) {
    const unsigned sm = sm_id();
    stays_s =
        sm >= unsigned(kBwdBesideMaxSms) || atomicAdd(bwd_beside_counters(bp) + 2 + sm, 1) == 0;
  }
  for (;;) {
    if (threadIdx.x == 0) {
      int* const counters = bwd_beside_counters(bp);
      const int items = p.max_chunks * p.N * p.HV;
      int i = atomicAdd(counters, 1);
      if (i >= bp.beside_first) i = stays_s ? bp.beside_first + atomicAdd(counters + 1, 1) : items;
      item_s = i;
    }
    __syncthreads();
    if (item_s >= p.max_chunks * p.N * p.HV) return;
    {
      const PrepTile pt = bwd_beside_tile(p, item_s);
      if (pt.L > 0) bwd_prep_bf16_tile<E, true, false>(bp, pt, pt.hv % bp.group);
    }
    // The record's writes done, seen by thread 0; the shared memory free for the next item.
    __syncthreads();
    if (threadIdx.x == 0) {
      const PrepTile pt = bwd_beside_tile(p, item_s);
      if (pt.L > 0) {
        __threadfence();
        flag_release(bwd_ready_flag(bwd_record(bp, pt.n, pt.sr, pt.c, pt.hv)), 1);
      }
    }
  }
}

}  // namespace kla::kernels
