// The backward's kernels for fp32 storage (one translation unit per dtype).
#include "bwd/bwd_launch.cuh"

namespace kla::kernels {
cudaError_t launch_backward_fp32(const BwdParams& bp, cudaStream_t stream, const char*& what) {
  return launch_backward<float>(bp, stream, what);
}
}  // namespace kla::kernels
