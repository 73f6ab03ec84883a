// Launchers of the single-kernel paths (launch/launchers.hpp): the generic chunkwise kernel at the
// plan's chunk length and slice, and the tokenwise kernel in the plan's register family.
#pragma once

#include "launch/launchers.hpp"
#include "scan/generic_chunk.cuh"
#include "scan/tokenwise.cuh"

namespace kla::kernels {

template <class E>
cudaError_t launch_generic(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                           const char*& what) {
  KLA_SYNC_KERNEL_MUTANT(stream, what);  // a no-op outside the mutant build
  what = "the generic chunkwise kernel";
  const GenericTiling t{plan.chunk, plan.value_slice};
  const int64_t bytes = generic_smem_floats(p.K, t) * int64_t(sizeof(float));
  cudaError_t e = cudaFuncSetAttribute(chunk_generic_kernel<E>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / t.VS);
  chunk_generic_kernel<E><<<dim3(unsigned(blocks)), kGenericThreads, size_t(bytes), stream>>>(p, t);
  return cudaGetLastError();
}

template <class E, int KMAX>
cudaError_t launch_tokenwise_k(const KernelParams& p, cudaStream_t stream) {
  const int64_t blocks = tokenwise_blocks(p.N, p.HV, p.V);
  tokenwise_kernel<E, KMAX><<<dim3(unsigned(blocks)), kTokWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class E>
cudaError_t launch_tokenwise(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                             const char*& what) {
  KLA_SYNC_KERNEL_MUTANT(stream, what);  // a no-op outside the mutant build
  what = "the tokenwise kernel";
  switch (plan.kmax) {
    case 64: return launch_tokenwise_k<E, 64>(p, stream);
    case 128: return launch_tokenwise_k<E, 128>(p, stream);
    case 256: return launch_tokenwise_k<E, 256>(p, stream);
  }
  what = "the tokenwise launcher (no kernel for the plan's register family)";
  return cudaErrorInvalidConfiguration;
}

}  // namespace kla::kernels
