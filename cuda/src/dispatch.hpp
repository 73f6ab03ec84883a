// Launchers, one explicit instantiation per dtype in its own translation unit
// (tokenwise_<dtype>.cu, chunk_<dtype>.cu, chunk_wy_<dtype>.cu) so the kernels compile in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernel_common.cuh"

namespace kla::kernels {

template <class E>
cudaError_t launch_tokenwise(const KernelParams& p, cudaStream_t stream);
template <class E>
cudaError_t launch_chunk(const KernelParams& p, cudaStream_t stream, int sms, int64_t max_smem);
template <class E>
cudaError_t launch_chunk_fast(const KernelParams& p, cudaStream_t stream, int sms, int64_t max_smem,
                              bool& ran);

template <class E>
cudaError_t launch_chunk_wy(const KernelParams& p, cudaStream_t stream, int cc_major, int sms,
                            int64_t max_smem, int force_vs, bool& ran);

extern template cudaError_t launch_tokenwise<float>(const KernelParams&, cudaStream_t);
extern template cudaError_t launch_tokenwise<__nv_bfloat16>(const KernelParams&, cudaStream_t);
extern template cudaError_t launch_tokenwise<__half>(const KernelParams&, cudaStream_t);
extern template cudaError_t launch_chunk<float>(const KernelParams&, cudaStream_t, int, int64_t);
extern template cudaError_t launch_chunk<__nv_bfloat16>(const KernelParams&, cudaStream_t, int,
                                                        int64_t);
extern template cudaError_t launch_chunk<__half>(const KernelParams&, cudaStream_t, int, int64_t);
extern template cudaError_t launch_chunk_fast<float>(const KernelParams&, cudaStream_t, int,
                                                     int64_t, bool&);
extern template cudaError_t launch_chunk_fast<__nv_bfloat16>(const KernelParams&, cudaStream_t, int,
                                                             int64_t, bool&);
extern template cudaError_t launch_chunk_fast<__half>(const KernelParams&, cudaStream_t, int,
                                                      int64_t, bool&);
extern template cudaError_t launch_chunk_wy<__nv_bfloat16>(const KernelParams&, cudaStream_t, int,
                                                           int, int64_t, int, bool&);
extern template cudaError_t launch_chunk_wy<__half>(const KernelParams&, cudaStream_t, int, int,
                                                    int64_t, int, bool&);
extern template cudaError_t launch_chunk_wy<float>(const KernelParams&, cudaStream_t, int, int,
                                                   int64_t, int, bool&);

}  // namespace kla::kernels
