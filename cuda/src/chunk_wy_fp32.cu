// WY chunkwise path (fp32 with fp32_math FAST): prep + scan kernels for K in {64, 96, 128}; the
// prep writes the K / Q tiles' bf16 hi + lo images that the scan reads.
#include "chunk_wy.cuh"

namespace kla::kernels {
template cudaError_t launch_chunk_wy<float>(const KernelParams&, cudaStream_t, int, int, int64_t,
                                            int, bool&);
}  // namespace kla::kernels
