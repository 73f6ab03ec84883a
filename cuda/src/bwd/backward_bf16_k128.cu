// The backward's kernels for bf16 storage at K = V = kBwdCompiledHeadDim (bwd/bwd_layout.hpp).
#include "bwd/bwd_launch.cuh"

namespace kla::kernels {
static_assert(kBwdCompiledHeadDim == 128, "the file's name says the head dim");
cudaError_t launch_backward_bf16_k128(const BwdParams& bp, cudaStream_t stream, const char*& what) {
  return launch_backward_head_dim<__nv_bfloat16, kBwdCompiledHeadDim>(bp, stream, what);
}
}  // namespace kla::kernels
