// Launcher of the backward (kla_chunk_backward): prep, state scan, state-gradient scan, input
// gradients, and for grouped value heads the key heads' sums (but after the bf16 input gradients,
// which sum them themselves), on one stream, in the arithmetic the call asked for
// (BwdParams::fast: the products of bwd/block_gemm.cuh; under FAST in bf16 at K = V = 128 the
// prep, the state scan and the input gradients on bf16 tensor cores, bwd_runs_bf16_input_grads),
// by the kernels compiled for the call's head dims (bwd_head_dim: K = V = kBwdCompiledHeadDim, or
// any).
// Decides nothing else: the sizes and shared memory come from bwd/bwd_layout.hpp.
#pragma once

#include <cuda_runtime.h>

#include "bwd/bwd_chunk_grads.cuh"
#include "bwd/bwd_input_grads_bf16.cuh"
#include "bwd/bwd_prep_beside_scan.cuh"
#include "bwd/bwd_prep.cuh"
#include "bwd/bwd_prep_bf16.cuh"
#include "bwd/bwd_state_backward_bf16.cuh"
#include "bwd/bwd_state_forward_bf16.cuh"
#include "bwd/bwd_state_grad_segments.cuh"
#include "bwd/bwd_state_scans.cuh"
#include "common/kernel_mutants.hpp"

namespace kla::kernels {

/// Lets a kernel take `smem` bytes of dynamic shared memory (set before each launch).
template <class Kernel>
cudaError_t bwd_allow_smem(Kernel kernel, int64_t smem) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
}

template <class Kernel>
cudaError_t bwd_launch(Kernel kernel, dim3 grid, int64_t smem, const BwdParams& bp,
                       cudaStream_t stream, int threads = kBwdThreads) {
  if (cudaError_t e = bwd_allow_smem(kernel, smem)) return e;
  kernel<<<grid, threads, size_t(smem), stream>>>(bp);
  return cudaGetLastError();
}

/// Asks for the largest shared-memory carve-out for a kernel, so that a block of it and one of
/// the kernel launched beside it (bwd_launch_beside) fit one multiprocessor; set before either
/// is launched.
template <class Kernel>
cudaError_t bwd_prefer_max_shared(Kernel kernel) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                              int(cudaSharedmemCarveoutMaxShared));
}

/// bwd_launch for the second of two kernels that may run side by side on sm_90 and later (both
/// given bwd_prefer_max_shared; BwdParams::programmatic, from the entry point's device query):
/// programmatic dependent launch (the kernel may start once every block of the one before has
/// started; it waits for that grid at its end, griddepcontrol.wait). A stream being captured into
/// a CUDA graph records the launch as a programmatic edge (test
/// CudaBackward.GraphReplayMatchesDirectCall). Earlier GPUs (no such launch; 164 KB or less a
/// multiprocessor) run it after the first, as bwd_launch.
template <class Kernel>
cudaError_t bwd_launch_beside(Kernel kernel, dim3 grid, int64_t smem, const BwdParams& bp,
                              cudaStream_t stream) {
  if (!bp.programmatic) return bwd_launch(kernel, grid, smem, bp, stream);
  if (cudaError_t e = bwd_allow_smem(kernel, smem)) return e;
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(kBwdThreads));
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cfg.attrs = &pdl;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, bp);
}

/// The saved prep beside the state-gradient scan (bp.prep_beside; bwd/bwd_prep_beside_scan.cuh):
/// zeroes the records' ready flags (a 2-d memset, one row a record) and the schedule's counters
/// (bwd_layout.hpp), then launches the prep's resident grid; launch_backward_scans launches the
/// scan beside it.
template <class E>
cudaError_t launch_prep_beside_scan(const BwdParams& bp, cudaStream_t stream) {
  const KernelParams& p = bp.f;
  constexpr BwdRecord R(kBwdCompiledHeadDim, kBwdCompiledHeadDim);
  const int64_t records = chunk_slots(p.N, p.T, p.cu_seqlens != nullptr) * p.HV;
  char* const flags = reinterpret_cast<char*>(bp.ws + R.u);
  if (cudaError_t e = cudaMemset2DAsync(flags, size_t(bp.rec_floats) * 4, 0,
                                        size_t(kBwdReadyFlagBytes), size_t(records), stream))
    return e;
  if (cudaError_t e =
          cudaMemsetAsync(flags + kBwdReadyFlagBytes, 0, size_t(kBwdBesideCounterBytes), stream))
    return e;
  for (cudaError_t e : {bwd_prefer_max_shared(bwd_prep_bf16_beside_scan_kernel<E>),
                        bwd_prefer_max_shared(bwd_state_backward_bf16_kernel<E, true>)})
    if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(kBwdPrepBf16Blocks[1] * bp.sms));
  return bwd_launch(bwd_prep_bf16_beside_scan_kernel<E>, grid, bwd_prep_bf16_smem(true), bp, stream,
                    kBwdPrepBf16Threads);
}

template <class E, int VS, bool kFast, int kHD>
cudaError_t launch_backward_scans(const BwdParams& bp, cudaStream_t stream, const char*& what) {
  const KernelParams& p = bp.f;
  const dim3 scans(unsigned(int64_t(p.N) * p.HV * (p.V / VS)));
  const int64_t smem = bwd_scan_smem(p.K, VS);
  // Saved states (kla_chunk_backward_saved, bf16 kernels only): the forward wrote S and U, so no
  // state scan runs; the state-gradient scan then follows the prep, as with no chunks.
  const bool saved = p.saved != nullptr;
  if (p.max_chunks > 0 && !saved) {
    what = "the backward state scan";
    if constexpr (kBwdBf16Record<E, kFast, kHD>) {
      static_assert(VS == 32, "the bf16 state scan's slice");
      for (cudaError_t e : {bwd_prefer_max_shared(bwd_state_forward_bf16_kernel<E>),
                            bwd_prefer_max_shared(bwd_state_backward_bf16_kernel<E>)})
        if (e != cudaSuccess) return e;
      if (cudaError_t e = bwd_launch(bwd_state_forward_bf16_kernel<E>, scans,
                                     bwd_state_forward_bf16_smem(), bp, stream))
        return e;
    } else {
      if (cudaError_t e =
              bwd_launch(bwd_state_forward_kernel<E, VS, kFast, kHD>, scans, smem, bp, stream))
        return e;
    }
  }
  what = "the backward state-gradient scan";
  if constexpr (kBwdBf16Record<E, kFast, kHD>) {
    // Beside the state scan launched just above, or where the forward saved S and U beside the
    // prep (bp.prep_beside: launch_prep_beside_scan); with no chunks there is neither, and the
    // kernel before it in the stream is the caller's, whose writes (d_final_state) it reads at its
    // start.
    if (saved && bp.prep_beside)
      return bwd_launch_beside(bwd_state_backward_bf16_kernel<E, true>, scans,
                               bwd_state_backward_bf16_smem(), bp, stream);
    if (p.max_chunks == 0 || saved)
      return bwd_launch(bwd_state_backward_bf16_kernel<E>, scans, bwd_state_backward_bf16_smem(),
                        bp, stream);
    return bwd_launch_beside(bwd_state_backward_bf16_kernel<E>, scans,
                             bwd_state_backward_bf16_smem(), bp, stream);
  } else {
    return bwd_launch(bwd_state_backward_kernel<E, VS, kFast, kHD>, scans, smem, bp, stream);
  }
}

template <class E, bool kFast, int kHD>
cudaError_t launch_backward_arith(const BwdParams& bp, cudaStream_t stream, const char*& what) {
  const KernelParams& p = bp.f;
  const dim3 chunks(unsigned(p.max_chunks), unsigned(p.HV), unsigned(p.N));
  if (p.max_chunks > 0) {
    what = "the backward prep";
    if constexpr (kBwdBf16Record<E, kFast, kHD>) {
      // One block per chunk and value head, a key head's value heads side by side in x.
      const dim3 heads(unsigned(p.max_chunks * bp.group), unsigned(p.H), unsigned(p.N));
      // Saved states (bp.f.saved): the instantiation without U0 (the state scan's alone).
      const bool saved = p.saved != nullptr;
      if (saved && bp.prep_beside) {
        if (cudaError_t e = launch_prep_beside_scan<E>(bp, stream)) return e;
      } else if (cudaError_t e =
                     saved ? bwd_launch(bwd_prep_bf16_kernel<E, true>, heads,
                                        bwd_prep_bf16_smem(true), bp, stream, kBwdPrepBf16Threads)
                           : bwd_launch(bwd_prep_bf16_kernel<E>, heads, bwd_prep_bf16_smem(false),
                                        bp, stream, kBwdPrepBf16Threads))
        return e;
    } else {
      if (cudaError_t e = bwd_launch(bwd_prep_kernel<E, kFast, kHD>, chunks,
                                     bwd_prep_smem(p.K, p.V), bp, stream, kBwdChunkThreads))
        return e;
    }
  }
  if constexpr (kBwdBf16Record<E, kFast, kHD>) {
    // The segmented state-gradient chain (bp.chain_seg; saved states, sm_90a): the windows, then
    // the segments; the state-gradient scan below then runs the heads they leave.
    if (bp.chain_seg > 0 && p.max_chunks > 0) {
      what = "the backward chain's windows";
      if (cudaError_t e =
              bwd_launch(bwd_chain_windows_kernel<E>, dim3(unsigned(p.HV), unsigned(p.N)), 0, bp,
                         stream, kBwdChainThreads))
        return e;
      what = "the backward state-gradient chain";
      const dim3 segs(unsigned(p.HV), unsigned((p.max_chunks + bp.chain_seg - 1) / bp.chain_seg),
                      unsigned(p.N));
      if (cudaError_t e = bwd_launch(bwd_state_grad_segments_kernel<E>, segs, bwd_chain_smem(), bp,
                                     stream, kBwdChainThreads))
        return e;
    }
  }
  // The scans' slice: compiled in with the head dims (kHD), else the call's.
  if constexpr (kHD != 0) {
    if (cudaError_t e = launch_backward_scans<E, bwd_scan_slice(kHD), kFast, kHD>(bp, stream, what))
      return e;
  } else {
    if (cudaError_t e = bwd_scan_slice(p.V) == 32
                            ? launch_backward_scans<E, 32, kFast, kHD>(bp, stream, what)
                            : launch_backward_scans<E, 16, kFast, kHD>(bp, stream, what))
      return e;
  }
  if (p.max_chunks == 0) return cudaSuccess;
  what = "the backward input gradients";
  if constexpr (kBwdBf16Record<E, kFast, kHD>) {
    // One block per key head and bp.grads_chunks chunks, its value heads' dq, dk summed in the
    // kernel: no sum kernel.
    const dim3 groups(unsigned((p.max_chunks + bp.grads_chunks - 1) / bp.grads_chunks),
                      unsigned(p.H), unsigned(p.N));
    // Saved states (bp.f.saved): the instantiation that reads S and U from them.
    if (p.saved != nullptr)
      return bwd_launch(bwd_input_grads_bf16_kernel<E, true>, groups, bwd_input_grads_bf16_smem(),
                        bp, stream, kBwdChunkThreads);
    return bwd_launch(bwd_input_grads_bf16_kernel<E>, groups, bwd_input_grads_bf16_smem(), bp,
                      stream, kBwdChunkThreads);
  } else {
    if (cudaError_t e = bwd_launch(bwd_chunk_grads_kernel<E, kFast, kHD>, chunks,
                                   bwd_grads_smem(p.K), bp, stream, kBwdChunkThreads))
      return e;
    if (bp.group == 1) return cudaSuccess;
    what = "the backward key-head sums";
    const dim3 heads(unsigned(p.max_chunks), unsigned(p.H), unsigned(p.N));
    // The kernel mutant bwd_sums_default_stream launches them on the legacy default stream, not
    // the caller's: no difference for a call on stream 0, but a graph captured on another stream
    // misses them.
    const cudaStream_t sums_stream =
        KLA_HOST_MUTANT(bwd_sums_default_stream) ? cudaStream_t(nullptr) : stream;
    return bwd_launch(bwd_group_sum_kernel<E>, heads, 0, bp, sums_stream);
  }
}

/// The backward in the call's arithmetic, with the kernels compiled for head dims kHD
/// (bwd_head_dim; the kernel mutant bwd_fast_in_accurate runs FAST for every call).
template <class E, int kHD>
cudaError_t launch_backward_head_dim(const BwdParams& bp, cudaStream_t stream, const char*& what) {
  KLA_SYNC_KERNEL_MUTANT(stream, what);  // a no-op outside the mutant build
  return bp.fast != 0 || KLA_HOST_MUTANT(bwd_fast_in_accurate)
             ? launch_backward_arith<E, true, kHD>(bp, stream, what)
             : launch_backward_arith<E, false, kHD>(bp, stream, what);
}

/// Whether a call runs the kernels compiled for kBwdCompiledHeadDim.
inline bool bwd_runs_compiled_head_dim(const BwdParams& bp) {
  return bp.f.K == kBwdCompiledHeadDim && bp.f.V == kBwdCompiledHeadDim;
}

/// One translation unit per dtype and head dim: bwd/backward_{fp32,bf16,fp16}.cu define the entry
/// of each dtype (and hold its kHD = 0 kernels), bwd/backward_{fp32,bf16,fp16}_k128.cu the kernels
/// at K = V = kBwdCompiledHeadDim, which the entry calls where bwd_runs_compiled_head_dim.
cudaError_t launch_backward_fp32(const BwdParams& bp, cudaStream_t stream, const char*& what);
cudaError_t launch_backward_bf16(const BwdParams& bp, cudaStream_t stream, const char*& what);
cudaError_t launch_backward_fp16(const BwdParams& bp, cudaStream_t stream, const char*& what);
cudaError_t launch_backward_fp32_k128(const BwdParams& bp, cudaStream_t stream, const char*& what);
cudaError_t launch_backward_bf16_k128(const BwdParams& bp, cudaStream_t stream, const char*& what);
cudaError_t launch_backward_fp16_k128(const BwdParams& bp, cudaStream_t stream, const char*& what);

}  // namespace kla::kernels
