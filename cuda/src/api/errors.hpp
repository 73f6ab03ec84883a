// The thread-local error message of the C ABI (kla_last_error_message): set by validation, the plan
// and the entry points, each through fail(), its text put together by cat(); and enum_bits, the
// one way host code reads a caller's enum field.
#pragma once

#include <cstring>
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

// A C caller may store any int in an enum field; loading an out-of-range value as a C++ enum
// without a fixed underlying type is undefined, so enum fields are read as their bytes
// (validation, kla_workspace_size and the split's sizes, which see params before validation).
template <class E>
int enum_bits(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized on supported ABIs");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

/// Saved states (kla.h "Saved states"; api/validate.cpp): why the call of validated-shape params p
/// cannot save ("" where it can): dtype, arithmetic, head dims, state pool, or a path, slice or
/// split request other than the WY path's one pass at 32 columns.
std::string saved_states_refusal(const kla_params& p);
/// Validates a saved-states buffer for the call p (already validated): p can save, `saved` is not
/// NULL, 16-byte aligned and at least kla_saved_states_size(p) bytes. `who` prefixes the message.
kla_status validate_saved_states(const kla_params& p, const void* saved, size_t saved_size,
                                 const char* who);

}  // namespace kla::detail
