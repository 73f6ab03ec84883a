// The saved backward's plan (plan/backward_plan.hpp) and its host-only entry point,
// kla_plan_chunk_backward_saved_for (a described device, no GPU); kla_plan_chunk_backward_saved
// lives in api/backward.cu, beside the device query.
#include "plan/backward_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "api/errors.hpp"
#include "bwd/bwd_layout.hpp"

namespace kla::plan {

using detail::cat;
using detail::fail;

std::string backward_smem_refusal(const kla_backward_params& p, bool use_saved,
                                  const DeviceInfo& dev, const char* entry) {
  const int K = int(p.forward.head_dim_k), V = int(p.forward.head_dim_v);
  const bool bf16_grads = layout::bwd_runs_bf16_input_grads(
      p.forward.arithmetic == KLA_ARITHMETIC_FAST, p.forward.dtype == KLA_DTYPE_BF16, K, V);
  const int64_t need =
      std::max({bf16_grads ? layout::bwd_prep_bf16_smem(use_saved) : layout::bwd_prep_smem(K, V),
                layout::bwd_scan_smem(K, layout::bwd_scan_slice(V)),
                bf16_grads ? layout::bwd_input_grads_bf16_smem() : layout::bwd_grads_smem(K),
                bf16_grads ? layout::bwd_state_forward_bf16_smem() : 0});
  if (need <= dev.max_smem) return "";
  return cat(entry, ": the backward needs ", need, " bytes of shared memory per block at K = ", K,
             ", V = ", V, "; this device offers ", dev.max_smem);
}

std::string chain_can_implement(const DeviceInfo& dev, const BuildInfo& build) {
  if (!build.sm90a) return "the library was built without sm_90a kernels";
  if (dev.cc_major != 9 || dev.cc_minor != 0) return "the chain is sm_90a code (9.0 only)";
  if (dev.max_smem < layout::bwd_chain_smem())
    return cat("it needs ", layout::bwd_chain_smem(), " bytes of shared memory a block");
  return "";
}

namespace {
bool chain_segment_ok(int32_t seg) {
  for (int s = layout::kBwdChainMinSegment; s <= layout::kBwdChainMaxSegment; s *= 2)
    if (seg == s) return true;
  return false;
}
}  // namespace

kla_status check_state_grad_request(int request, int32_t segment, const char* entry) {
  if (request != KLA_STATE_GRAD_AUTO && request != KLA_STATE_GRAD_SCAN &&
      request != KLA_STATE_GRAD_CHAIN)
    return fail(KLA_ERROR_INVALID_VALUE,
                cat(entry, ": state_grad = ", request, " is not a kla_state_grad"));
  if (segment != 0 && !chain_segment_ok(segment))
    return fail(KLA_ERROR_INVALID_VALUE,
                cat(entry, ": chain_segment = ", segment, " is not 0 or a power of two from ",
                    layout::kBwdChainMinSegment, " to ", layout::kBwdChainMaxSegment));
  if (segment != 0 && request != KLA_STATE_GRAD_CHAIN)
    return fail(KLA_ERROR_INVALID_VALUE,
                cat(entry, ": chain_segment = ", segment, " needs state_grad CHAIN"));
  return KLA_SUCCESS;
}

kla_status plan_state_grad(const kla_backward_params& p, const DeviceInfo& dev,
                           const BuildInfo& build, int request, int32_t segment, StateGradPlan& out,
                           const char* entry) {
  const Problem pb = describe(p.forward);
  const int64_t N = pb.N, HV = p.forward.num_v_heads;
  const std::string chain_why = chain_can_implement(dev, build);
  if (request == KLA_STATE_GRAD_CHAIN && !chain_why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH,
                cat(entry, ": state_grad CHAIN cannot run: ", chain_why));
  out = StateGradPlan{};
  if (request != KLA_STATE_GRAD_SCAN && chain_why.empty()) {
    out.state_grad = KLA_STATE_GRAD_CHAIN;
    out.chain_seg = segment;
    if (segment == 0) {  // the model's pick, over each sequence's chunks
      constexpr int64_t kChunk = layout::kChunk;
      std::vector<int64_t> chunks(size_t(N), (p.forward.seq_len + kChunk - 1) / kChunk);
      if (p.forward.cu_seqlens_host)
        for (int64_t n = 0; n < N; ++n)
          chunks[size_t(n)] =
              (p.forward.cu_seqlens_host[n + 1] - p.forward.cu_seqlens_host[n] + kChunk - 1) /
              kChunk;
      out.chain_seg = layout::bwd_chain_segment(chunks.data(), N, HV, dev.sms);
    }
    out.reason =
        cat("chain: segments of ", out.chain_seg, " chunks (",
            segment != 0 ? std::string("requested")
                         : cat("the model of its time picks, from ", layout::kBwdChainMinSegment,
                               " to ", layout::kBwdChainMaxSegment),
            "), heads without a certified warm-up left to the scan");
    return KLA_SUCCESS;
  }
  // saved states run the bf16 kernels (p's forward can save: saved_states_refusal)
  out.prep_beside =
      layout::bwd_saved_prep_beside_scan(true, true, backward_programmatic(dev), pb.max_chunks, N,
                                         HV, p.forward.head_dim_v, dev.sms)
          ? 1
          : 0;
  out.reason = cat("scan, the prep ", out.prep_beside ? "beside" : "before", " it (",
                   layout::bwd_bf16_scan_blocks(N, HV, p.forward.head_dim_v), " scan blocks on ",
                   dev.sms, " multiprocessors)",
                   request == KLA_STATE_GRAD_SCAN ? " (requested)" : "; the chain declined: ",
                   request == KLA_STATE_GRAD_SCAN ? "" : chain_why);
  return KLA_SUCCESS;
}

kla_status check_saved_plan_call(const kla_backward_params* p, int32_t state_grad,
                                 int32_t chain_segment, const kla_backward_plan* plan,
                                 const char* entry) {
  if (kla_status s = kla_validate_backward(p)) return s;
  if (const std::string why = detail::saved_states_refusal(p->forward); !why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH,
                cat(entry, ": this call cannot use saved states: ", why));
  if (kla_status s = check_state_grad_request(state_grad, chain_segment, entry)) return s;
  if (!plan) return fail(KLA_ERROR_NULL_POINTER, cat(entry, ": plan is NULL"));
  return KLA_SUCCESS;
}

kla_status plan_saved_backward(const kla_backward_params& p, const DeviceInfo& dev,
                               int32_t state_grad, int32_t chain_segment, kla_backward_plan* plan,
                               const char* entry) {
  if (const std::string why = backward_smem_refusal(p, true, dev, entry); !why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH, why);
  StateGradPlan sg;
  if (kla_status s = plan_state_grad(p, dev, this_build(), state_grad, chain_segment, sg, entry))
    return s;
  *plan = kla_backward_plan{};
  plan->state_grad = kla_state_grad(sg.state_grad);
  plan->chain_segment = sg.chain_seg;
  plan->prep_beside = sg.prep_beside;
  std::snprintf(plan->reason, sizeof plan->reason, "%s", sg.reason.c_str());
  return KLA_SUCCESS;
}

}  // namespace kla::plan

extern "C" kla_status kla_plan_chunk_backward_saved_for(const kla_backward_params* p,
                                                        const kla_device_info* device,
                                                        int32_t state_grad, int32_t chain_segment,
                                                        kla_backward_plan* plan) {
  const char* entry = "kla_plan_chunk_backward_saved_for";
  if (kla_status s = kla::plan::check_saved_plan_call(p, state_grad, chain_segment, plan, entry))
    return s;
  if (kla_status s = kla::plan::check_device_description(device, entry)) return s;
  return kla::plan::plan_saved_backward(*p, kla::plan::from_c(*device), state_grad, chain_segment,
                                        plan, entry);
}
