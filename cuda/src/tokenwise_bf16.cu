// Tokenwise kernels for bf16 (head-dim families K <= 64, <= 128, <= 256).
#include "tokenwise.cuh"

namespace kla::kernels {
template cudaError_t launch_tokenwise<__nv_bfloat16>(const KernelParams&, cudaStream_t);
}
