// kla_chunk_backward (kla.h): validate on the host, check the device's shared memory, fill the
// backward's flat BwdParams and launch bwd/ on the caller's stream. No host synchronisation, no
// allocation: capturable in a CUDA graph.
#include <algorithm>
#include <string>
#include <vector>

#include "api/device.hpp"
#include "api/errors.hpp"
#include "api/translate.hpp"
#include "bwd/bwd_launch.cuh"
#include "kla/kla.h"

namespace {

using kla::detail::cat;
using kla::detail::fail;

/// The kernels' flat params for a validated call on device `dev`.
kla::kernels::BwdParams translate_backward(const kla_backward_params& p,
                                           const kla::plan::DeviceInfo& dev) {
  const kla::plan::Problem pb = kla::plan::describe(p.forward);
  kla::plan::Plan plan;
  plan.num_seqs = pb.N;
  plan.max_chunks = pb.max_chunks;
  kla::kernels::BwdParams b{};
  b.f = kla::detail::translate(p.forward, plan);
  b.f.o = nullptr;
  b.f.s_out = nullptr;
  b.f.ws = nullptr;
  b.f.ws_images = nullptr;
  b.dO = p.d_o;
  b.dht = p.d_final_state;
  b.dq = p.dq;
  b.dk = p.dk;
  b.dv = p.dv;
  for (int d = 0; d < 3; ++d) {
    b.dos[d] = p.d_o_strides[d];
    b.dqs[d] = p.dq_strides[d];
    b.dks[d] = p.dk_strides[d];
    b.dvs[d] = p.dv_strides[d];
  }
  b.dg = p.dg;
  b.deta = p.deta;
  for (int d = 0; d < 2; ++d) {
    b.dgs[d] = p.dg_strides[d];
    b.des[d] = p.deta_strides[d];
  }
  b.dh0 = p.d_initial_state;
  b.ws = static_cast<float*>(p.workspace);
  b.rec_floats = kla::layout::BwdRecord(p.forward.head_dim_k, p.forward.head_dim_v).floats;
  b.group = int(p.forward.num_v_heads / p.forward.num_heads);
  b.fast = p.forward.arithmetic == KLA_ARITHMETIC_FAST ? 1 : 0;
  b.programmatic = dev.cc_major >= 9 ? 1 : 0;
  b.grads_chunks = kla::layout::bwd_block_chunks(pb.max_chunks, p.forward.num_heads, pb.N, dev.sms);
  b.sms = dev.sms;
  return b;
}

/// Why the segmented state-gradient chain (bwd/bwd_state_grad_segments.cuh) cannot run on `dev`
/// with this build, or "" where it can (the call's own conditions, saved states and the bf16
/// kernels, are the caller's).
std::string chain_can_implement(const kla::plan::DeviceInfo& dev) {
  if (!kla::plan::this_build().sm90a) return "the library was built without sm_90a kernels";
  if (dev.cc_major != 9 || dev.cc_minor != 0) return "the chain is sm_90a code (9.0 only)";
  if (dev.max_smem < kla::layout::bwd_chain_smem())
    return cat("it needs ", kla::layout::bwd_chain_smem(), " bytes of shared memory a block");
  return "";
}
bool chain_runs_here(const kla::plan::DeviceInfo& dev) {
  return chain_can_implement(dev).empty();
}

/// kla_chunk_backward, or with `saved` (validated: kla_chunk_backward_saved) reading each chunk's
/// S and U from the forward's saved states instead of running the state scan.
kla_status run_backward(const kla_backward_params* p, bool use_saved, const void* saved,
                        size_t saved_size, kla_stream_t stream, const char* entry) {
  if (kla_status s = kla_validate_backward(p)) return s;
  if (use_saved)
    if (kla_status s = kla::detail::validate_saved_states(p->forward, saved, saved_size, entry))
      return s;
  kla::plan::DeviceInfo dev;
  if (kla_status s = kla::detail::current_device(dev)) return s;
  const int K = int(p->forward.head_dim_k), V = int(p->forward.head_dim_v);
  const bool bf16_grads = kla::layout::bwd_runs_bf16_input_grads(
      p->forward.arithmetic == KLA_ARITHMETIC_FAST, p->forward.dtype == KLA_DTYPE_BF16, K, V);
  const int64_t need = std::max(
      {bf16_grads ? kla::layout::bwd_prep_bf16_smem(use_saved) : kla::layout::bwd_prep_smem(K, V),
       kla::layout::bwd_scan_smem(K, kla::layout::bwd_scan_slice(V)),
       bf16_grads ? kla::layout::bwd_input_grads_bf16_smem() : kla::layout::bwd_grads_smem(K),
       bf16_grads ? kla::layout::bwd_state_forward_bf16_smem() : 0});
  if (need > dev.max_smem)
    return fail(
        KLA_ERROR_UNSUPPORTED_PATH,
        cat(entry, ": the backward needs ", need, " bytes of shared memory per block at K = ", K,
            ", V = ", V, "; this device offers ", dev.max_smem));
  kla::kernels::BwdParams b = translate_backward(*p, dev);
  b.f.saved = const_cast<void*>(saved);  // read only (the input gradients, bwd_bf16_states)
  const int64_t N = b.f.N, HV = p->forward.num_v_heads;
  b.prep_beside = kla::layout::bwd_saved_prep_beside_scan(
                      use_saved, bf16_grads, b.programmatic != 0, b.f.max_chunks, N, HV, V, dev.sms)
                      ? 1
                      : 0;
  b.beside_first = int(kla::layout::bwd_beside_first_items(b.f.max_chunks * N * HV));
  // The state-gradient chain as segments (bwd/bwd_state_grad_segments.cuh) where it can run: saved
  // states, the bf16 kernels, an sm_90 device running this build's sm_90a image, its shared
  // memory. It replaces the prep beside the scan (whose scan it runs after, for the heads it
  // leaves).
  if (use_saved && bf16_grads && chain_runs_here(dev)) {
    constexpr int64_t kChunk = kla::layout::kChunk;
    std::vector<int64_t> chunks(size_t(N), (p->forward.seq_len + kChunk - 1) / kChunk);
    if (p->forward.cu_seqlens_host)
      for (int64_t n = 0; n < N; ++n)
        chunks[size_t(n)] =
            (p->forward.cu_seqlens_host[n + 1] - p->forward.cu_seqlens_host[n] + kChunk - 1) /
            kChunk;
    b.chain_seg = kla::layout::bwd_chain_segment(chunks.data(), N, HV, dev.sms);
    b.prep_beside = 0;
  }
  const char* what = "the launch";
  const auto st = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
  switch (p->forward.dtype) {
    case KLA_DTYPE_FP32: e = kla::kernels::launch_backward_fp32(b, st, what); break;
    case KLA_DTYPE_BF16: e = kla::kernels::launch_backward_bf16(b, st, what); break;
    case KLA_DTYPE_FP16: e = kla::kernels::launch_backward_fp16(b, st, what); break;
  }
  if (e == cudaSuccess) return KLA_SUCCESS;
  (void)cudaGetLastError();
  return fail(KLA_ERROR_CUDA, cat(entry, ": ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

extern "C" kla_status kla_chunk_backward(const kla_backward_params* p, kla_stream_t stream) {
  return run_backward(p, false, nullptr, 0, stream, "kla_chunk_backward");
}

extern "C" kla_status kla_chunk_backward_saved(const kla_backward_params* p, const void* saved,
                                               size_t saved_size, kla_stream_t stream) {
  return run_backward(p, true, saved, saved_size, stream, "kla_chunk_backward_saved");
}
