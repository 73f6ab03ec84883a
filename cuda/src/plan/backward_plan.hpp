// The saved backward's plan (kla.h kla_state_grad): which state-gradient schedule a call of
// kla_chunk_backward_saved(_as) runs, decided on the host before anything is launched, each
// schedule saying whether it can run and why not (CUTLASS's can_implement), AUTO's heuristic
// overridable by the caller (FlashAttention-3's). api/backward.cu launches what it decides.
#pragma once

#include <cstdint>
#include <string>

#include "kla/kla.h"
#include "plan/plan.hpp"

namespace kla::plan {

/// The saved backward's state-gradient schedule.
struct StateGradPlan {
  int state_grad = KLA_STATE_GRAD_SCAN;  // SCAN or CHAIN, never AUTO
  int chain_seg = 0;                     // BwdParams::chain_seg: CHAIN's segment in chunks
  int prep_beside = 0;                   // BwdParams::prep_beside: SCAN's prep beside the scan
  std::string reason;
};

/// Whether the backward's kernels on `dev` launch programmatically (griddepcontrol: 9.0 and
/// later), which the prep beside the scan needs (BwdParams::programmatic).
inline bool backward_programmatic(const DeviceInfo& dev) {
  return dev.cc_major >= 9;
}

/// Why a block of the backward's largest kernel does not fit `dev`'s shared memory ("" where it
/// does), the message prefixed with `entry`.
std::string backward_smem_refusal(const kla_backward_params& p, bool use_saved,
                                  const DeviceInfo& dev, const char* entry);

/// Why the segmented chain (bwd/bwd_state_grad_segments.cuh) cannot run on `dev` with `build`, or
/// "" where it can (the call's own conditions, saved states and the bf16 kernels, are the
/// caller's).
std::string chain_can_implement(const DeviceInfo& dev, const BuildInfo& build);

/// A request's values, host only and before any device query: `request` a kla_state_grad's bits,
/// `segment` 0 or a chain segment, nonzero only with CHAIN. INVALID_VALUE naming the value.
kla_status check_state_grad_request(int request, int32_t segment, const char* entry);

/// Plans the saved backward of validated p (whose forward can save) on `dev` for a checked
/// request (`segment` 0: AUTO's model picks), on a device whose shared memory the caller has
/// checked (backward_smem_refusal). Refuses, saying why, a CHAIN that cannot run there
/// (UNSUPPORTED_PATH).
kla_status plan_state_grad(const kla_backward_params& p, const DeviceInfo& dev,
                           const BuildInfo& build, int request, int32_t segment, StateGradPlan& out,
                           const char* entry);

/// The host checks of a saved backward's plan call (kla_plan_chunk_backward_saved(_for)): the
/// backward's params, the saving's conditions, the request's values and the plan pointer.
kla_status check_saved_plan_call(const kla_backward_params* p, int32_t state_grad,
                                 int32_t chain_segment, const kla_backward_plan* plan,
                                 const char* entry);

/// Checks the device's shared memory, plans, then writes *plan (untouched on a refusal): both plan
/// entry points' common part.
kla_status plan_saved_backward(const kla_backward_params& p, const DeviceInfo& dev,
                               int32_t state_grad, int32_t chain_segment, kla_backward_plan* plan,
                               const char* entry);

}  // namespace kla::plan
