// The CUDA entry points of the C ABI (kla.h): validate on the host, look up the device (cached,
// api/device.hpp), plan (plan/), translate kla_params into the kernels' KernelParams, launch
// (launch/; a split plan through cp/segments.cu) on the caller's stream. No host synchronisation,
// no allocation, no environment: capturable in a CUDA graph, and the same params always give the
// same plan on a device.
#include <string>

#include "api/device.hpp"
#include "api/errors.hpp"
#include "api/translate.hpp"
#include "cp/split_launch.hpp"
#include "kla/kla.h"
#include "launch/launchers.hpp"
#include "layout/saved_states.hpp"
#include "plan/plan.hpp"

namespace {

using kla::detail::fail;

// Plans already validated params on the current device (described in `dev`).
kla_status plan_validated(const kla_params* p, bool chunk, kla::plan::Plan& plan,
                          kla::plan::DeviceInfo& dev) {
  if (kla_status s = kla::detail::current_device(dev)) return s;
  return chunk ? kla::plan::plan_chunk(*p, dev, kla::plan::this_build(), plan)
               : kla::plan::plan_tokenwise(*p, dev, plan);
}

// kla_chunk_forward_saving's buffer (kla.h "Saved states").
struct SavedStates {
  void* ptr;
  size_t size;
};

// The saving forward's plan: one pass (saved states come from one) on a path with a saving scan,
// the plan's own where it is the transposed scan in FAST or WY at 32 columns, otherwise WY at 32
// columns (what the call requested of path, slice and split allows either: validate_saved_states).
// q: the params as planned.
kla_status plan_saving(kla_params& q, kla::plan::Plan& plan, kla::plan::DeviceInfo& dev,
                       const char* entry) {
  q.segments = 1;
  if (kla_status s = plan_validated(&q, true, plan, dev)) return s;
  if (kla::plan::scan_saves(plan)) return KLA_SUCCESS;
  q.path = KLA_PATH_WY;
  q.value_slice = kla::layout::kSavedValueSlice;
  if (kla_status s = plan_validated(&q, true, plan, dev))
    return fail(s, std::string(entry) + ": the saving scan (path WY, 32 columns) cannot run: " +
                       kla_last_error_message());
  return KLA_SUCCESS;
}

// save: kla_chunk_forward_saving's buffer, or nullptr for the other forwards.
kla_status run(const kla_params* p, bool chunk, kla_stream_t stream, const char* entry,
               const SavedStates* save = nullptr) {
  if (kla_status s = kla_validate(p)) return s;
  if (save)
    if (kla_status s = kla::detail::validate_saved_states(*p, save->ptr, save->size, entry))
      return s;
  kla_params q = *p;
  kla::plan::DeviceInfo dev;
  kla::plan::Plan plan;
  if (kla_status s = save ? plan_saving(q, plan, dev, entry) : plan_validated(p, chunk, plan, dev))
    return s;
  const char* what = "the launch";
  const auto st = static_cast<cudaStream_t>(stream);
  cudaError_t e;
  if (plan.segments > 1) {
    e = kla::cp::launch_split(q, plan.segments, dev, st, what);
  } else {
    kla::kernels::KernelParams k = kla::detail::translate(q, plan);
    if (save) k.saved = save->ptr;
    e = kla::kernels::launch(k, plan, q.dtype, st, what);
  }
  if (e == cudaSuccess) return KLA_SUCCESS;
  (void)cudaGetLastError();  // clear the runtime's sticky error for this thread
  return fail(KLA_ERROR_CUDA, std::string(entry) + ": " + what + " (path " +
                                  kla_path_name(plan.path) + "): " + cudaGetErrorString(e));
}

kla_status plan_entry(const kla_params* p, bool chunk, kla_plan* out) {
  if (kla_status s = kla_validate(p)) return s;
  if (!out) return fail(KLA_ERROR_NULL_POINTER, "plan is NULL");
  kla::plan::DeviceInfo dev;
  kla::plan::Plan plan;
  if (kla_status s = plan_validated(p, chunk, plan, dev)) return s;
  kla::plan::to_c(plan, *out);
  return KLA_SUCCESS;
}

}  // namespace

extern "C" {

kla_status kla_chunk_forward(const kla_params* p, kla_stream_t stream) {
  return run(p, true, stream, "kla_chunk_forward");
}

kla_status kla_chunk_forward_saving(const kla_params* p, void* saved, size_t saved_size,
                                    kla_stream_t stream) {
  const SavedStates save{saved, saved_size};
  return run(p, true, stream, "kla_chunk_forward_saving", &save);
}

kla_status kla_tokenwise_forward(const kla_params* p, kla_stream_t stream) {
  return run(p, false, stream, "kla_tokenwise_forward");
}

kla_status kla_plan_chunk_forward(const kla_params* p, kla_plan* plan) {
  return plan_entry(p, true, plan);
}

kla_status kla_plan_tokenwise_forward(const kla_params* p, kla_plan* plan) {
  return plan_entry(p, false, plan);
}

kla_status kla_device_info_get(int device, kla_device_info* info) {
  kla::detail::clear_error();
  if (!info) return fail(KLA_ERROR_NULL_POINTER, "info is NULL");
  kla::plan::DeviceInfo d;
  if (kla_status s = kla::detail::device_info(device, d)) return s;
  info->compute_major = d.cc_major;
  info->compute_minor = d.cc_minor;
  info->multiprocessors = d.sms;
  info->max_smem_per_block = d.max_smem;
  info->tensor_maps = d.tensor_maps ? 1 : 0;
  return KLA_SUCCESS;
}

}  // extern "C"
