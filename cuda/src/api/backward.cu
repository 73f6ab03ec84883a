// kla_chunk_backward (kla.h): validate on the host, check the device's shared memory, fill the
// backward's flat BwdParams and launch bwd/ on the caller's stream. No host synchronisation, no
// allocation: capturable in a CUDA graph.
#include <algorithm>
#include <cstdio>
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

/// The shared memory a block of the backward's largest kernel needs, or "" where `dev` offers it.
std::string smem_refusal(const kla_backward_params& p, bool use_saved,
                         const kla::plan::DeviceInfo& dev, const char* entry) {
  const int K = int(p.forward.head_dim_k), V = int(p.forward.head_dim_v);
  const bool bf16_grads = kla::layout::bwd_runs_bf16_input_grads(
      p.forward.arithmetic == KLA_ARITHMETIC_FAST, p.forward.dtype == KLA_DTYPE_BF16, K, V);
  const int64_t need = std::max(
      {bf16_grads ? kla::layout::bwd_prep_bf16_smem(use_saved) : kla::layout::bwd_prep_smem(K, V),
       kla::layout::bwd_scan_smem(K, kla::layout::bwd_scan_slice(V)),
       bf16_grads ? kla::layout::bwd_input_grads_bf16_smem() : kla::layout::bwd_grads_smem(K),
       bf16_grads ? kla::layout::bwd_state_forward_bf16_smem() : 0});
  if (need <= dev.max_smem) return "";
  return cat(entry, ": the backward needs ", need, " bytes of shared memory per block at K = ", K,
             ", V = ", V, "; this device offers ", dev.max_smem);
}

/// The saved backward's state-gradient schedule (kla.h kla_state_grad).
struct StateGradPlan {
  int state_grad = KLA_STATE_GRAD_SCAN;
  int chain_seg = 0;    // BwdParams::chain_seg
  int prep_beside = 0;  // BwdParams::prep_beside
  std::string reason;
};

bool chain_segment_ok(int32_t seg) {
  for (int s = kla::layout::kBwdChainMinSegment; s <= kla::layout::kBwdChainMaxSegment; s *= 2)
    if (seg == s) return true;
  return false;
}

/// A state-gradient request's values (host only, before any device query): `request` a
/// kla_state_grad's bits, `segment` 0 or a chain segment, and nonzero only with CHAIN.
kla_status check_request(int request, int32_t segment, const char* entry) {
  if (request != KLA_STATE_GRAD_AUTO && request != KLA_STATE_GRAD_SCAN &&
      request != KLA_STATE_GRAD_CHAIN)
    return fail(KLA_ERROR_INVALID_VALUE,
                cat(entry, ": state_grad = ", request, " is not a kla_state_grad"));
  if (segment != 0 && !chain_segment_ok(segment))
    return fail(KLA_ERROR_INVALID_VALUE,
                cat(entry, ": chain_segment = ", segment, " is not 0 or a power of two from ",
                    kla::layout::kBwdChainMinSegment, " to ", kla::layout::kBwdChainMaxSegment));
  if (segment != 0 && request != KLA_STATE_GRAD_CHAIN)
    return fail(KLA_ERROR_INVALID_VALUE,
                cat(entry, ": chain_segment = ", segment, " needs state_grad CHAIN"));
  return KLA_SUCCESS;
}

/// Plans the saved backward of validated p (whose forward can save) on `dev`, for a checked
/// request (check_request; `segment` 0: the model's pick). Refuses a CHAIN that cannot run here
/// (UNSUPPORTED_PATH), saying why.
kla_status plan_state_grad(const kla_backward_params& p, const kla::plan::DeviceInfo& dev,
                           int request, int32_t segment, StateGradPlan& out, const char* entry) {
  if (const std::string why = smem_refusal(p, true, dev, entry); !why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH, why);
  const int64_t N = kla::plan::describe(p.forward).N, HV = p.forward.num_v_heads;
  constexpr int64_t kChunk = kla::layout::kChunk;
  std::vector<int64_t> chunks(size_t(N), (p.forward.seq_len + kChunk - 1) / kChunk);
  if (p.forward.cu_seqlens_host)
    for (int64_t n = 0; n < N; ++n)
      chunks[size_t(n)] =
          (p.forward.cu_seqlens_host[n + 1] - p.forward.cu_seqlens_host[n] + kChunk - 1) / kChunk;
  const std::string chain_why = chain_can_implement(dev);
  if (request == KLA_STATE_GRAD_CHAIN && !chain_why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH,
                cat(entry, ": state_grad CHAIN cannot run: ", chain_why));
  out = StateGradPlan{};
  if (request != KLA_STATE_GRAD_SCAN && chain_why.empty()) {
    out.state_grad = KLA_STATE_GRAD_CHAIN;
    out.chain_seg =
        segment != 0 ? segment : kla::layout::bwd_chain_segment(chunks.data(), N, HV, dev.sms);
    out.reason = cat(
        "chain: segments of ", out.chain_seg, " chunks (",
        segment != 0 ? std::string("requested")
                     : cat("the model of its time picks, from ", kla::layout::kBwdChainMinSegment,
                           " to ", kla::layout::kBwdChainMaxSegment),
        "), heads without a certified warm-up left to the scan");
    return KLA_SUCCESS;
  }
  const int64_t max_chunks = *std::max_element(chunks.begin(), chunks.end());
  out.prep_beside =
      kla::layout::bwd_saved_prep_beside_scan(true, true, dev.cc_major >= 9, max_chunks, N, HV,
                                              p.forward.head_dim_v, dev.sms)
          ? 1
          : 0;
  out.reason = cat("scan, the prep ", out.prep_beside ? "beside" : "before", " it (",
                   N * HV * (p.forward.head_dim_v / kla::layout::kBwdBf16Slice), " scan blocks on ",
                   dev.sms, " multiprocessors)",
                   request == KLA_STATE_GRAD_SCAN ? " (requested)" : "; the chain declined: ",
                   request == KLA_STATE_GRAD_SCAN ? "" : chain_why);
  return KLA_SUCCESS;
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
    if (kla_status s = check_request(request, segment, entry)) return s;
  }
  kla::plan::DeviceInfo dev;
  if (kla_status s = kla::detail::current_device(dev)) return s;
  if (const std::string why = smem_refusal(*p, use_saved, dev, entry); !why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH, why);
  kla::kernels::BwdParams b = translate_backward(*p, dev);
  b.f.saved = const_cast<void*>(saved);  // read only (the input gradients, bwd_bf16_states)
  b.beside_first =
      int(kla::layout::bwd_beside_first_items(b.f.max_chunks * b.f.N * p->forward.num_v_heads));
  if (use_saved) {
    StateGradPlan sg;
    if (kla_status s = plan_state_grad(*p, dev, request, segment, sg, entry)) return s;
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

/// kla_plan_chunk_backward_saved(_for): validated p whose forward can save, on `dev`.
kla_status plan_saved(const kla_backward_params* p, const kla::plan::DeviceInfo& dev,
                      kla_state_grad state_grad, int32_t chain_segment, kla_backward_plan* plan,
                      const char* entry) {
  StateGradPlan sg;
  if (kla_status s =
          plan_state_grad(*p, dev, kla::detail::enum_bits(state_grad), chain_segment, sg, entry))
    return s;
  *plan = kla_backward_plan{};
  plan->state_grad = kla_state_grad(sg.state_grad);
  plan->chain_segment = sg.chain_seg;
  plan->prep_beside = sg.prep_beside;
  std::snprintf(plan->reason, sizeof plan->reason, "%s", sg.reason.c_str());
  return KLA_SUCCESS;
}

/// Host checks of a saved backward's plan call: the backward's params, the saving's conditions,
/// the request's values and the plan pointer.
kla_status validate_saved_call(const kla_backward_params* p, kla_state_grad state_grad,
                               int32_t chain_segment, const kla_backward_plan* plan,
                               const char* entry) {
  if (kla_status s = kla_validate_backward(p)) return s;
  if (const std::string why = kla::detail::saved_states_refusal(p->forward); !why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH,
                cat(entry, ": this call cannot use saved states: ", why));
  if (kla_status s = check_request(kla::detail::enum_bits(state_grad), chain_segment, entry))
    return s;
  if (!plan) return fail(KLA_ERROR_NULL_POINTER, cat(entry, ": plan is NULL"));
  return KLA_SUCCESS;
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
                                                  size_t saved_size, kla_state_grad state_grad,
                                                  int32_t chain_segment, kla_stream_t stream) {
  return run_backward(p, true, saved, saved_size, kla::detail::enum_bits(state_grad), chain_segment,
                      stream, "kla_chunk_backward_saved_as");
}

extern "C" kla_status kla_plan_chunk_backward_saved(const kla_backward_params* p,
                                                    kla_state_grad state_grad,
                                                    int32_t chain_segment,
                                                    kla_backward_plan* plan) {
  const char* entry = "kla_plan_chunk_backward_saved";
  if (kla_status s = validate_saved_call(p, state_grad, chain_segment, plan, entry)) return s;
  kla::plan::DeviceInfo dev;
  if (kla_status s = kla::detail::current_device(dev)) return s;
  return plan_saved(p, dev, state_grad, chain_segment, plan, entry);
}

extern "C" kla_status kla_plan_chunk_backward_saved_for(const kla_backward_params* p,
                                                        const kla_device_info* device,
                                                        kla_state_grad state_grad,
                                                        int32_t chain_segment,
                                                        kla_backward_plan* plan) {
  const char* entry = "kla_plan_chunk_backward_saved_for";
  if (kla_status s = validate_saved_call(p, state_grad, chain_segment, plan, entry)) return s;
  if (!device) return fail(KLA_ERROR_NULL_POINTER, cat(entry, ": device is NULL"));
  return plan_saved(p, kla::plan::from_c(*device), state_grad, chain_segment, plan, entry);
}
