// The devices as the plan sees them: queried once per device and cached (the attributes do not
// change while a process runs), so a call costs one cudaGetDevice.
#pragma once

#include "kla/kla.h"
#include "plan/plan.hpp"

namespace kla::detail {

/// The current device's facts; KLA_ERROR_NO_DEVICE (with the message set) when there is none.
kla_status current_device(plan::DeviceInfo& out);
/// Device `id`'s facts (cached).
kla_status device_info(int id, plan::DeviceInfo& out);

}  // namespace kla::detail
