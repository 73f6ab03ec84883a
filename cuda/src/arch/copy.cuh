// Data movement and synchronisation: 16-byte cp.async copies (sm_80), named barriers, sm_90 bulk
// and tensor copies completing on an mbarrier, L2 prefetch.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kla::kernels {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return unsigned(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copies global -> shared (zero fill when !valid; src must still be a
// valid address).
__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- named barriers (id 0 is __syncthreads; threads a multiple of 32) -----------------------
/// Waits until `threads` threads have reached barrier id; orders their earlier shared-memory
/// accesses before everyone's later ones.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Counts the calling warp's arrival at barrier id without waiting (the producer side of a
/// producer / consumer hand-off: the consumers call named_bar_sync).
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- programmatic dependent launch (sm_90; no-ops before) ------------------------------------
/// Lets the grid launched after this one with programmatic stream serialization start (once every
/// block of this grid has called it or exited).
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
/// Waits until the grids this one was launched programmatically after have completed and their
/// memory is visible.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---- flags between the blocks of concurrent grids (global memory, gpu scope) -----------------
/// The multiprocessor the calling thread runs on (PTX %smid: below %nsmid, not necessarily
/// contiguous; constant for a block's lifetime).
__device__ __forceinline__ unsigned sm_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(r));
  return r;
}
/// Sets *flag to v with release semantics at gpu scope: every write the calling thread has made,
/// or has observed (after a block barrier: the block's), is visible to a thread that reads v by
/// flag_acquired / flag_relaxed + acquire_fence.
__device__ __forceinline__ void flag_release(int* flag, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}
/// A relaxed read of a flag (no ordering: cheap to issue ahead of its use); acquire_fence after
/// reading it set makes what its writer released visible.
__device__ __forceinline__ int flag_relaxed(const int* flag) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
/// Completes the acquire pattern of earlier relaxed reads (fence.acq_rel at gpu scope), then
/// orders it before this thread's later bulk copies (the async proxy reads global memory apart
/// from the generic proxy the flags' writers used).
__device__ __forceinline__ void acquire_fence_for_bulk_copies() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// ---- sm_90 bulk copies (global -> shared) completing on an mbarrier --------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
/// One box of a 4-d tensor map at coordinates (k0, t, h, b) into shared memory (aligned as the
/// map's swizzle requires).
__device__ __forceinline__ void tile_load(void* dst, const void* map, int k0, int t, int h, int b,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(k0), "r"(t), "r"(h), "r"(b), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

#endif

/// L2 prefetch of one value slice's share of `lines` 128-byte lines from base: lines slice,
/// slice + nslices, ... spread over the warp's lanes (each slice of a head asks for its own).
__device__ __forceinline__ void prefetch_share_l2(const char* base, int lines, int slice,
                                                  int nslices, int lane) {
  for (int l = slice + nslices * lane; l < lines; l += nslices * 32)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + l * 128));
}

}  // namespace kla::kernels
