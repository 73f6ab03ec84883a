// Chunkwise kernel for bf16 (generic head dims, runtime chunk length and value slice).
#include "chunk.cuh"
#include "chunk_fast.cuh"

namespace kla::kernels {
template cudaError_t launch_chunk<__nv_bfloat16>(const KernelParams&, cudaStream_t, int, int64_t);
template cudaError_t launch_chunk_fast<__nv_bfloat16>(const KernelParams&, cudaStream_t, int,
                                                      int64_t, bool&);
}  // namespace kla::kernels
