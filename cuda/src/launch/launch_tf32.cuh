// Launcher of the TF32 path (launch/launchers.hpp): the prep over (chunk, value head, sequence),
// then the scan at the plan's slice and copy stages. Decides nothing.
#pragma once

#include "launch/launchers.hpp"
#include "prep/tf32_prep.cuh"
#include "scan/tf32_scan.cuh"

namespace kla::kernels {

template <class E, int VS, int kStages>
cudaError_t launch_tf32_scan(const KernelParams& p, cudaStream_t stream) {
  const int64_t bytes = tf32_scan_smem_bytes(p.K, VS, int(sizeof(E)), kStages);
  cudaError_t e = cudaFuncSetAttribute(chunk_tf32_scan_kernel<E, VS, kStages>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / VS);
  chunk_tf32_scan_kernel<E, VS, kStages>
      <<<dim3(unsigned(blocks)), kTf32ScanThreads, size_t(bytes), stream>>>(p, p.ws);
  return cudaGetLastError();
}

template <class E, int VS>
cudaError_t launch_tf32_scan(const KernelParams& p, cudaStream_t stream, int stages) {
  return stages == 2 ? launch_tf32_scan<E, VS, 2>(p, stream)
                     : launch_tf32_scan<E, VS, 1>(p, stream);
}

template <class E>
cudaError_t launch_tf32(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                        const char*& what) {
  KLA_SYNC_KERNEL_MUTANT(stream, what);  // a no-op outside the mutant build
  what = "the TF32 prep";
  const int64_t prep_bytes = tf32_prep_smem_bytes(p.K, int(sizeof(E)));
  cudaError_t e = cudaFuncSetAttribute(
      chunk_tf32_prep_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prep_bytes));
  if (e != cudaSuccess) return e;
  chunk_tf32_prep_kernel<E><<<dim3(unsigned(p.max_chunks), unsigned(p.HV), unsigned(p.N)),
                              kTf32PrepThreads, size_t(prep_bytes), stream>>>(p, p.ws);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  what = "the TF32 scan";
  switch (plan.value_slice) {
    case 32: return launch_tf32_scan<E, 32>(p, stream, plan.stages);
    case 16: return launch_tf32_scan<E, 16>(p, stream, plan.stages);
    case 8: return launch_tf32_scan<E, 8>(p, stream, plan.stages);
  }
  what = "the TF32 launcher (no kernel for the plan's tiling)";
  return cudaErrorInvalidConfiguration;
}

}  // namespace kla::kernels
