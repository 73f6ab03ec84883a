// Internal helpers shared by the host-side validation (validate.cpp) and the CUDA entry points.
#pragma once

#include <string>

#include "kla/kla.h"

namespace kla::detail {

/// Records `message` (prefixed "kla: ") as this thread's last error and returns `s`.
kla_status fail(kla_status s, const std::string& message);
/// Empties this thread's last error message.
void clear_error();

}  // namespace kla::detail
