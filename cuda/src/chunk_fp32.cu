// Chunkwise kernel for fp32 (generic head dims, runtime chunk length and value slice).
#include "chunk.cuh"
#include "chunk_fast.cuh"

namespace kla::kernels {
template cudaError_t launch_chunk<float>(const KernelParams&, cudaStream_t, int, int64_t);
template cudaError_t launch_chunk_fast<float>(const KernelParams&, cudaStream_t, int, int64_t,
                                              bool&);
}  // namespace kla::kernels
