// The host-only entry point of the plan: kla_plan_chunk_forward_for (a described device, no GPU),
// and the check of a described device that every such entry point makes.
// The current-device entry points (kla_plan_chunk_forward, kla_plan_tokenwise_forward) live in
// api/entry.cu, beside the device query.
#include <string>

#include "api/errors.hpp"
#include "kla/kla.h"
#include "plan/plan.hpp"

namespace kla::plan {

kla_status check_device_description(const kla_device_info* device, const char* entry) {
  const std::string who = entry ? std::string(entry) + ": " : std::string();
  if (!device) return kla::detail::fail(KLA_ERROR_NULL_POINTER, who + "device is NULL");
  // The description must be one a device could have: the plans divide by the multiprocessor
  // count and add to the shared-memory size.
  if (device->multiprocessors < 1 || device->multiprocessors > (1 << 20))
    return kla::detail::fail(KLA_ERROR_INVALID_VALUE, who + "device->multiprocessors = " +
                                                          std::to_string(device->multiprocessors) +
                                                          " is not in [1, 2^20]");
  if (device->max_smem_per_block < 0 || device->max_smem_per_block > (int64_t(1) << 32))
    return kla::detail::fail(
        KLA_ERROR_INVALID_VALUE,
        who + "device->max_smem_per_block = " + std::to_string(device->max_smem_per_block) +
            " is not in [0, 2^32]");
  if (device->compute_major < 0 || device->compute_minor < 0)
    return kla::detail::fail(KLA_ERROR_INVALID_VALUE,
                             who + "device compute capability is negative");
  return KLA_SUCCESS;
}

}  // namespace kla::plan

extern "C" {

kla_status kla_plan_chunk_forward_for(const kla_params* p, const kla_device_info* device,
                                      kla_plan* plan) {
  if (kla_status s = kla_validate(p)) return s;
  if (kla_status s = kla::plan::check_device_description(device, nullptr)) return s;
  if (!plan) return kla::detail::fail(KLA_ERROR_NULL_POINTER, "plan is NULL");
  kla::plan::Plan out;
  if (kla_status s =
          kla::plan::plan_chunk(*p, kla::plan::from_c(*device), kla::plan::this_build(), out))
    return s;
  kla::plan::to_c(out, *plan);
  return KLA_SUCCESS;
}

}  // extern "C"
