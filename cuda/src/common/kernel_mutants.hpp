// Planted faults for the kernel mutant run (issue 23, tests/cuda/README.md): a test-only build
// (CMake option KLA_KERNEL_MUTANTS, preset gpu-mutants) compiles each fault behind a check of one
// per-translation-unit __constant__ id that the launchers set before every launch; the GPU suite
// then requires the GPU tests to reject every fault. In every other build KLA_MUTANT(m) is the
// constant false and no code changes (the kernels' SASS is the same with and without this header).
#pragma once

namespace kla::kernels {

/// One planted fault each, in the file named beside it.
enum class KernelMutant : int {
  none = 0,
  split_lo_dropped,           // scan/wy_scan.cuh: X = T R keeps only the hi hi part
  handoff_decay_off_by_one,   // prep/wy_prep.cuh: the chunk's carry decays by gamma_{L-1}
  beta_eps_zero,              // common/kernel_common.cuh: at eps = 0, beta uses |k|^2 + 2^-20
  transposed_rescale_missed,  // scan/wy_scan_transposed.cuh: fp16 state rows not rescaled
  tf32_fast_grade,            // scan/tf32_scan.cuh: K, Q and the state operand at 16 bits
  bwd_carry_no_gamma,         // bwd/bwd_state_*: the state gradient's carry not decayed
  fast_in_accurate,           // launch/launch_wy.cuh: the transposed scan's FAST kernel always
  wy_column_scale_missed,     // scan/wy_scan.cuh: fp16 X's column scale not undone in the state
  bwd_fast_in_accurate,       // bwd/bwd_launch.cuh: the backward's FAST products for every call
  bwd_fast_bf16_operands,     // bwd/block_gemm.cuh: FAST's operands rounded to bf16, not TF32
  bwd_bf16_truncated,         // bwd/bwd_tiles.cuh: the bf16 input gradients' tiles truncated
  bwd_prep_split_hi_only,     // bwd/bwd_warp_tile_bf16.cuh: bf16 split operands without lo
  bwd_sums_default_stream,    // bwd/bwd_launch.cuh: the key-head sums on the legacy stream
  bwd_running_sum_restarts,   // bwd/bwd_warp_tile_bf16.cuh: each value head's dq^, dk^ replace the
                              // sum
  bwd_prep_norm_pair_unsummed,  // bwd/bwd_prep_scalars.cuh: a key / query norm without its pair's
                                // half
  bwd_scan_x_rows_skipped,      // bwd/bwd_state_backward_bf16.cuh: X's rows 32-63 left zero
  bwd_scan_keys_own_record,  // bwd/bwd_state_*_bf16.cuh: raw keys, queries from the head's record
  bwd_grads_next_states_skipped,     // bwd/bwd_input_grads_bf16.cuh: the next head's S not fetched
  split_fold_transition_skipped,     // cp/segments.cu: the fold carries L alone (S_in = L)
  saved_u_update_scaled,             // scan/wy_scan.cuh: the saved U keeps step B's update scale
  saved_u_update_scaled_transposed,  // scan/wy_scan_transposed.cuh: the same, saved U^T
  bwd_scan_ready_ignored,  // bwd/bwd_state_backward_bf16.cuh: beside the prep, copies unready
                           // records
  bwd_chain_no_warmup,     // bwd/bwd_state_grad_segments.cuh: segments start at their end, from 0
  count
};

/// The mutants' names (kla_testing_set_kernel_mutant, --kla_mutant), index = enum value.
inline constexpr const char* kKernelMutantNames[] = {"none",
                                                     "split_lo_dropped",
                                                     "handoff_decay_off_by_one",
                                                     "beta_eps_zero",
                                                     "transposed_rescale_missed",
                                                     "tf32_fast_grade",
                                                     "bwd_carry_no_gamma",
                                                     "fast_in_accurate",
                                                     "wy_column_scale_missed",
                                                     "bwd_fast_in_accurate",
                                                     "bwd_fast_bf16_operands",
                                                     "bwd_bf16_truncated",
                                                     "bwd_prep_split_hi_only",
                                                     "bwd_sums_default_stream",
                                                     "bwd_running_sum_restarts",
                                                     "bwd_prep_norm_pair_unsummed",
                                                     "bwd_scan_x_rows_skipped",
                                                     "bwd_scan_keys_own_record",
                                                     "bwd_grads_next_states_skipped",
                                                     "split_fold_transition_skipped",
                                                     "saved_u_update_scaled",
                                                     "saved_u_update_scaled_transposed",
                                                     "bwd_scan_ready_ignored",
                                                     "bwd_chain_no_warmup"};
static_assert(sizeof(kKernelMutantNames) / sizeof(kKernelMutantNames[0]) ==
              int(KernelMutant::count));

#ifdef KLA_KERNEL_MUTANTS
/// The active mutant as the host last set it (api/testing.cpp).
int active_kernel_mutant();
#ifdef __CUDACC__
// One copy per translation unit (no relocatable device code): each launcher sets its own.
static __constant__ int kla_kernel_mutant_id;
#define KLA_MUTANT(m) (::kla::kernels::kla_kernel_mutant_id == int(::kla::kernels::KernelMutant::m))
// The same test in host code (a launcher's choice of kernel).
#define KLA_HOST_MUTANT(m) \
  (::kla::kernels::active_kernel_mutant() == int(::kla::kernels::KernelMutant::m))
// Sets this translation unit's id before a launch. Skipped while the stream is being captured (a
// copy from pageable memory cannot be captured): a replay runs with the id last set.
#define KLA_SYNC_KERNEL_MUTANT(stream, what)                                                       \
  do {                                                                                             \
    cudaStreamCaptureStatus cs_ = cudaStreamCaptureStatusNone;                                     \
    if (cudaStreamIsCapturing(stream, &cs_) == cudaSuccess && cs_ != cudaStreamCaptureStatusNone)  \
      break;                                                                                       \
    const int id_ = ::kla::kernels::active_kernel_mutant();                                        \
    what = "the kernel mutant switch";                                                             \
    const cudaError_t e_ = cudaMemcpyToSymbolAsync(::kla::kernels::kla_kernel_mutant_id, &id_,     \
                                                   sizeof id_, 0, cudaMemcpyHostToDevice, stream); \
    if (e_ != cudaSuccess) return e_;                                                              \
  } while (0)
#endif
#else
#define KLA_MUTANT(m) false
#define KLA_HOST_MUTANT(m) false
#define KLA_SYNC_KERNEL_MUTANT(stream, what) \
  do {                                       \
  } while (0)
#endif

}  // namespace kla::kernels
