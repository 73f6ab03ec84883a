// The backward's kernels for fp16 storage (one translation unit per dtype).
#include "bwd/bwd_launch.cuh"

namespace kla::kernels {
cudaError_t launch_backward_fp16(const BwdParams& bp, cudaStream_t stream, const char*& what) {
  return launch_backward<__half>(bp, stream, what);
}
}  // namespace kla::kernels
