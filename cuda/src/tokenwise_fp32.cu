// Tokenwise kernels for fp32 (head-dim families K <= 64, <= 128, <= 256).
#include "tokenwise.cuh"

namespace kla::kernels {
template cudaError_t launch_tokenwise<float>(const KernelParams&, cudaStream_t);
}
