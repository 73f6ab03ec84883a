// The CUDA entry points of the C ABI (kla.h): validate on the host, check for a device,
// translate kla_params into the kernels' plain KernelParams, dispatch on dtype, launch on the
// caller's stream. No host synchronisation, no allocation: capturable in a CUDA graph.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "dispatch.hpp"
#include "internal.hpp"
#include "workspace.hpp"
#include "kla/kla.h"

namespace {

using kla::detail::fail;
using kla::kernels::KernelParams;

kla::kernels::KernelParams translate(const kla_params& p) {
  KernelParams k{};
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.o = p.o;
  for (int d = 0; d < 3; ++d) {
    k.qs[d] = p.q_strides[d];
    k.ks[d] = p.k_strides[d];
    k.vs[d] = p.v_strides[d];
    k.os[d] = p.o_strides[d];
  }
  k.g = p.g;
  k.eta = p.eta;
  for (int d = 0; d < 2; ++d) {
    k.gs[d] = p.g_strides[d];
    k.es[d] = p.eta_strides[d];
  }
  k.eta_value = p.eta_value;
  k.eps = p.eps;
  k.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(p.head_dim_k));
  k.kaczmarz = p.coefficient == KLA_COEFF_KACZMARZ;
  k.l2norm = p.readout == KLA_READOUT_Q_L2NORM;
  k.s_in = p.initial_state;
  k.s_out = p.final_state;
  k.pool = p.state_pool;
  k.indices = p.state_pool ? p.state_indices : nullptr;
  k.cu_seqlens = p.cu_seqlens;
  k.N = int(p.cu_seqlens ? p.num_seqs : p.batch);
  k.T = int(p.seq_len);
  k.H = int(p.num_heads);
  k.HV = int(p.num_v_heads);
  k.K = int(p.head_dim_k);
  k.V = int(p.head_dim_v);
  k.ws = static_cast<float*>(p.workspace);
  k.ws_record_floats = kla::detail::ws_record_bytes(p.head_dim_k, p.head_dim_v) / 4;
  int64_t longest = p.seq_len;
  if (p.cu_seqlens_host) {
    longest = 0;
    for (int64_t n = 0; n < p.num_seqs; ++n)
      longest = std::max<int64_t>(longest, p.cu_seqlens_host[n + 1] - p.cu_seqlens_host[n]);
  }
  k.max_chunks = int((longest + kla::detail::kFastChunk - 1) / kla::detail::kFastChunk);
  // Where the records end (kla_workspace_size lays the images out after them).
  const bool packed = p.cu_seqlens != nullptr;
  const int64_t image =
      kla::detail::wy_image_bytes(p.head_dim_k, kla::detail::wy_needs_images(p.dtype, p.fp32_math));
  k.ws_images =
      p.workspace && image > 0
          ? static_cast<char*>(p.workspace) +
                kla::detail::ws_records_bytes(k.N, k.T, packed, k.HV, p.head_dim_k, p.head_dim_v)
          : nullptr;
  return k;
}

struct Device {
  int id = 0, sms = 0, max_smem = 0, cc_major = 0;
};

kla_status current_device(Device& d) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the runtime's sticky error for this thread
    return fail(KLA_ERROR_NO_DEVICE,
                std::string("no CUDA device: ") +
                    (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount = 0"));
  }
  if ((e = cudaGetDevice(&d.id)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, d.id)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, d.id)) !=
          cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, d.id)) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return fail(KLA_ERROR_NO_DEVICE,
                std::string("CUDA device query failed: ") + cudaGetErrorString(e));
  }
  return KLA_SUCCESS;
}

kla_status launched(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return KLA_SUCCESS;
  (void)cudaGetLastError();
  return fail(KLA_ERROR_CUDA, std::string(what) + ": " + cudaGetErrorString(e));
}

// fp32_fast: kla_params.fp32_math == FAST; fp32 takes the WY path only then (its products keep
// 16 bits of K / Q; the TF32 path keeps ~21).
template <class E>
cudaError_t run_chunk(const KernelParams& kp, cudaStream_t stream, const Device& dev,
                      bool fp32_fast, bool& ran) {
  cudaError_t e = cudaSuccess;
  // KLA_CHUNK_PATH (diagnostics and tests, docs/api.md): "portable" skips the sm_90 WY path, so
  // the sm_80-level TF32 path can be tested and compared on a Hopper GPU; "wy8" / "wy16" / "wy32"
  // pin the WY scan's value slice (8 needs K >= 96); "wy64" takes the transposed scan (bf16 /
  // fp16, K 64 or 128, V a multiple of 64) where it applies.
  const char* path = std::getenv("KLA_CHUNK_PATH");
  const bool portable = path && std::strcmp(path, "portable") == 0;
  const int force_vs = !path                            ? 0
                       : std::strcmp(path, "wy8") == 0  ? 8
                       : std::strcmp(path, "wy16") == 0 ? 16
                       : std::strcmp(path, "wy32") == 0 ? 32
                       : std::strcmp(path, "wy64") == 0 ? 64
                                                        : 0;
  if (!portable && (!std::is_same_v<E, float> || fp32_fast))
    e = kla::kernels::launch_chunk_wy<E>(kp, stream, dev.cc_major, dev.sms, dev.max_smem, force_vs,
                                         ran);
  if (e == cudaSuccess && !ran)
    e = kla::kernels::launch_chunk_fast<E>(kp, stream, dev.sms, dev.max_smem, ran);
  if (e == cudaSuccess && !ran)
    e = kla::kernels::launch_chunk<E>(kp, stream, dev.sms, dev.max_smem);
  return e;
}

}  // namespace

extern "C" {

kla_status kla_chunk_forward(const kla_params* p, kla_stream_t stream) {
  if (kla_status s = kla_validate(p)) return s;
  Device dev;
  if (kla_status s = current_device(dev)) return s;
  const KernelParams kp = translate(*p);
  cudaError_t e = cudaSuccess;
  // Paths in order of preference, each declining (ran = false) where it does not apply: the WY
  // path (bf16 / fp16 and fp32 with fp32_math FAST, sm_90), the TF32 path (any dtype, needs the
  // workspace), the generic one.
  bool ran = false;
  const bool fast = p->fp32_math == KLA_FP32_MATH_FAST;
  switch (p->dtype) {
    case KLA_DTYPE_FP32: e = run_chunk<float>(kp, stream, dev, fast, ran); break;
    case KLA_DTYPE_BF16: e = run_chunk<__nv_bfloat16>(kp, stream, dev, fast, ran); break;
    case KLA_DTYPE_FP16: e = run_chunk<__half>(kp, stream, dev, fast, ran); break;
  }
  return launched(e, "kla_chunk_forward launch");
}

kla_status kla_tokenwise_forward(const kla_params* p, kla_stream_t stream) {
  if (kla_status s = kla_validate(p)) return s;
  Device dev;
  if (kla_status s = current_device(dev)) return s;
  const KernelParams kp = translate(*p);
  cudaError_t e = cudaSuccess;
  switch (p->dtype) {
    case KLA_DTYPE_FP32: e = kla::kernels::launch_tokenwise<float>(kp, stream); break;
    case KLA_DTYPE_BF16: e = kla::kernels::launch_tokenwise<__nv_bfloat16>(kp, stream); break;
    case KLA_DTYPE_FP16: e = kla::kernels::launch_tokenwise<__half>(kp, stream); break;
  }
  return launched(e, "kla_tokenwise_forward launch");
}

}  // extern "C"
