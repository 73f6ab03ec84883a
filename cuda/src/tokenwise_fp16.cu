// Tokenwise kernels for fp16 (head-dim families K <= 64, <= 128, <= 256).
#include "tokenwise.cuh"

namespace kla::kernels {
template cudaError_t launch_tokenwise<__half>(const KernelParams&, cudaStream_t);
}
