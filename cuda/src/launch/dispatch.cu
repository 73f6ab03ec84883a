// launch(): the plan's path, the dtype and the head dim select one instantiated launcher
// (launch/launchers.hpp). No decisions beyond the table.
#include "launch/launchers.hpp"

namespace kla::kernels {
namespace {

template <class E>
cudaError_t launch_dtype(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                         const char*& what) {
  switch (plan.path) {
    case KLA_PATH_WY:
    case KLA_PATH_WY_TRANSPOSED:
      switch (p.K) {
        case 64: return launch_wy<E, 64>(p, plan, stream, what);
        case 96: return launch_wy<E, 96>(p, plan, stream, what);
        case 128: return launch_wy<E, 128>(p, plan, stream, what);
      }
      break;
    case KLA_PATH_TF32: return launch_tf32<E>(p, plan, stream, what);
    case KLA_PATH_GENERIC: return launch_generic<E>(p, plan, stream, what);
    case KLA_PATH_TOKENWISE: return launch_tokenwise<E>(p, plan, stream, what);
    case KLA_PATH_AUTO: break;
  }
  what = "the dispatch (no launcher for the plan)";
  return cudaErrorInvalidConfiguration;
}

}  // namespace

cudaError_t launch(const KernelParams& p, const plan::Plan& plan, kla_dtype dtype,
                   cudaStream_t stream, const char*& what) {
  switch (dtype) {
    case KLA_DTYPE_FP32: return launch_dtype<float>(p, plan, stream, what);
    case KLA_DTYPE_BF16: return launch_dtype<__nv_bfloat16>(p, plan, stream, what);
    case KLA_DTYPE_FP16: return launch_dtype<__half>(p, plan, stream, what);
  }
  what = "the dispatch (unknown dtype)";
  return cudaErrorInvalidValue;
}

}  // namespace kla::kernels
