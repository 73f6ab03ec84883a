// The thread-local error message of the C ABI (kla_last_error_message): set by validation, the plan
// and the entry points, each through fail().
#pragma once

#include <string>

#include "kla/kla.h"

namespace kla::detail {

/// Records `message` (prefixed "kla: ") as this thread's last error and returns `s`.
kla_status fail(kla_status s, const std::string& message);
/// Empties this thread's last error message.
void clear_error();

}  // namespace kla::detail
