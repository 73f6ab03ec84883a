// WY chunkwise path (fp16): prep + scan kernels for K in {64, 96, 128}.
#include "chunk_wy.cuh"

namespace kla::kernels {
template cudaError_t launch_chunk_wy<__half>(const KernelParams&, cudaStream_t, int, int, int64_t,
                                             int, bool&);
}  // namespace kla::kernels
