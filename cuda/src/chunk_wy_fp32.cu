// WY chunkwise path (fp32): prep + scan kernels for K in {64, 128} (the K / Q tiles split in place
// into bf16 hi + lo by whole 64-column panels).
#include "chunk_wy.cuh"

namespace kla::kernels {
template cudaError_t launch_chunk_wy<float>(const KernelParams&, cudaStream_t, int, int, int64_t,
                                            int, bool&);
}  // namespace kla::kernels
