// The launchers: they carry out a plan (plan/plan.hpp) and decide nothing. One explicit
// instantiation per dtype (and, for the WY kernels, head dim) in instantiations/, so the kernels
// compile in parallel. Each returns the launch's CUDA error; `what` names the step that failed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/kernel_params.hpp"
#include "plan/plan.hpp"

namespace kla::kernels {

/// WY paths (WY, WY_TRANSPOSED) at head dim KD: the prep, then the plan's scan.
template <class E, int KD>
cudaError_t launch_wy(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                      const char*& what);
/// The TF32 path: the prep, then the scan at the plan's slice and stages.
template <class E>
cudaError_t launch_tf32(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                        const char*& what);
/// The generic kernel at the plan's chunk length and slice.
template <class E>
cudaError_t launch_generic(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                           const char*& what);
/// The tokenwise kernel in the plan's register family.
template <class E>
cudaError_t launch_tokenwise(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                             const char*& what);

/// Dispatch on the plan's path, the dtype and the head dim to one of the above.
cudaError_t launch(const KernelParams& p, const plan::Plan& plan, kla_dtype dtype,
                   cudaStream_t stream, const char*& what);

/// The explicit instantiation of one launcher (instantiations/*.cu; variadic: template arguments
/// hold commas).
#define KLA_INSTANTIATE(...)                                                             \
  template cudaError_t __VA_ARGS__(const KernelParams&, const plan::Plan&, cudaStream_t, \
                                   const char*&)

// Defined in instantiations/*.cu.
#define KLA_DECLARE_DTYPE(E)                   \
  extern KLA_INSTANTIATE(launch_tf32<E>);      \
  extern KLA_INSTANTIATE(launch_generic<E>);   \
  extern KLA_INSTANTIATE(launch_tokenwise<E>); \
  extern KLA_INSTANTIATE(launch_wy<E, 64>);    \
  extern KLA_INSTANTIATE(launch_wy<E, 96>);    \
  extern KLA_INSTANTIATE(launch_wy<E, 128>)
KLA_DECLARE_DTYPE(float);
KLA_DECLARE_DTYPE(__nv_bfloat16);
KLA_DECLARE_DTYPE(__half);
#undef KLA_DECLARE_DTYPE

}  // namespace kla::kernels
