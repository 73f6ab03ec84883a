// The thread-local error message of the C ABI (kla_last_error_message): set by validation, the plan
// and the entry points, each through fail(), its text put together by cat().
#pragma once

#include <sstream>
#include <string>

#include "kla/kla.h"

namespace kla::detail {

/// Records `message` (prefixed "kla: ") as this thread's last error and returns `s`.
kla_status fail(kla_status s, const std::string& message);
/// Empties this thread's last error message.
void clear_error();

/// The arguments streamed into one string: fail()'s messages and the plan's reasons.
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

}  // namespace kla::detail
