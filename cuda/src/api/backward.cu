// kla_chunk_backward (kla.h): validate on the host, check the device's shared memory, plan the
// saved backward's state-gradient schedule (plan/backward_plan.hpp), fill the backward's flat
// BwdParams and launch bwd/ on the caller's stream; and kla_plan_chunk_backward_saved, that plan on
// the current device. No host synchronisation, no
// allocation: capturable in a CUDA graph.
#include <string>

#include "api/device.hpp"
#include "api/errors.hpp"
#include "api/translate.hpp"
#include "plan/backward_plan.hpp"
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
  b.programmatic = kla::plan::backward_programmatic(dev) ? 1 : 0;
  b.grads_chunks = kla::layout::bwd_block_chunks(pb.max_chunks, p.forward.num_heads, pb.N, dev.sms);
  b.sms = dev.sms;
  return b;
}

/// kla_chunk_backward, or with `saved` (validated: kla_chunk_backward_saved) reading each chunk's
/// S and U from the forward's saved states instead of running the state scan, on the state-gradient
/// schedule `request` / `segment` (plan_state_grad).
kla_status run_backward(const kla_backward_params* p, bool use_saved, const void* saved,
                        size_t saved_size, int request, int32_t segment, kla_stream_t stream,
                        const char* entry) {
  if (kla_status s = kla_validate_backward(p)) return s;
  if (use_saved) {
    if (kla_status s = kla::detail::validate_saved_states(p->forward, saved, saved_size, entry))
      return s;
    if (kla_status s = kla::plan::check_state_grad_request(request, segment, entry)) return s;
  }
  kla::plan::DeviceInfo dev;
  if (kla_status s = kla::detail::current_device(dev)) return s;
  if (const std::string why = kla::plan::backward_smem_refusal(*p, use_saved, dev, entry);
      !why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH, why);
  kla::kernels::BwdParams b = translate_backward(*p, dev);
  b.f.saved = const_cast<void*>(saved);  // read only (the input gradients, bwd_bf16_states)
  b.beside_first =
      int(kla::layout::bwd_beside_first_items(b.f.max_chunks * b.f.N * p->forward.num_v_heads));
  if (use_saved) {
    kla::plan::StateGradPlan sg;
    if (kla_status s = kla::plan::plan_state_grad(*p, dev, kla::plan::this_build(), request,
                                                  segment, sg, entry))
      return s;
    b.chain_seg = sg.chain_seg;
    b.prep_beside = sg.prep_beside;
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
  return run_backward(p, false, nullptr, 0, KLA_STATE_GRAD_AUTO, 0, stream, "kla_chunk_backward");
}

extern "C" kla_status kla_chunk_backward_saved(const kla_backward_params* p, const void* saved,
                                               size_t saved_size, kla_stream_t stream) {
  return run_backward(p, true, saved, saved_size, KLA_STATE_GRAD_AUTO, 0, stream,
                      "kla_chunk_backward_saved");
}

extern "C" kla_status kla_chunk_backward_saved_as(const kla_backward_params* p, const void* saved,
                                                  size_t saved_size, int32_t state_grad,
                                                  int32_t chain_segment, kla_stream_t stream) {
  return run_backward(p, true, saved, saved_size, state_grad, chain_segment, stream,
                      "kla_chunk_backward_saved_as");
}

extern "C" kla_status kla_plan_chunk_backward_saved(const kla_backward_params* p,
                                                    int32_t state_grad, int32_t chain_segment,
                                                    kla_backward_plan* plan) {
  const char* entry = "kla_plan_chunk_backward_saved";
  if (kla_status s = kla::plan::check_saved_plan_call(p, state_grad, chain_segment, plan, entry))
    return s;
  kla::plan::DeviceInfo dev;
  if (kla_status s = kla::detail::current_device(dev)) return s;
  return kla::plan::plan_saved_backward(*p, dev, state_grad, chain_segment, plan, entry);
}
