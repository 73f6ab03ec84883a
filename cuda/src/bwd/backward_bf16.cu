// The backward's entry for bf16 storage, and its kernels at every head dim but the compiled one
// (bwd/backward_bf16_k128.cu; one translation unit per dtype and head dim).
#include "bwd/bwd_launch.cuh"

namespace kla::kernels {
cudaError_t launch_backward_bf16(const BwdParams& bp, cudaStream_t stream, const char*& what) {
  return bwd_runs_compiled_head_dim(bp)
             ? launch_backward_bf16_k128(bp, stream, what)
             : launch_backward_head_dim<__nv_bfloat16, 0>(bp, stream, what);
}
}  // namespace kla::kernels
