// kla.hpp — thin C++ layer over the C ABI of kla.h: a params type with defaults, an exception
// carrying the status, and throwing / non-throwing calls. Holds no resources (no RAII needed):
// every pointer stays the caller's.
#pragma once

#include <stdexcept>
#include <string>

#include "kla/kla.h"

namespace kla::cuda {

/// kla_params with kla_params_init's defaults.
struct Params : kla_params {
  Params() noexcept { kla_params_init(this); }
};

/// Thrown by the throwing calls: status() is the C status, what() the thread's last message.
class Error : public std::runtime_error {
 public:
  explicit Error(kla_status s)
      : std::runtime_error(std::string(kla_status_string(s)) + ": " + kla_last_error_message()),
        status_(s) {}
  kla_status status() const noexcept { return status_; }

 private:
  kla_status status_;
};

inline void check(kla_status s) {
  if (s != KLA_SUCCESS) throw Error(s);
}

/// Host-side validation; returns the status (no throw).
inline kla_status validate(const kla_params& p) noexcept {
  return kla_validate(&p);
}

/// Chunkwise forward (prefill) on `stream`; throws kla::cuda::Error on failure. Set
/// p.workspace / p.workspace_size (kla_workspace_size(&p) bytes of device memory) for the fast
/// path; without a workspace the slower workspace-free kernel runs.
inline void chunk_forward(const kla_params& p, kla_stream_t stream = nullptr) {
  check(kla_chunk_forward(&p, stream));
}
/// Tokenwise forward (decode) on `stream`; throws kla::cuda::Error on failure.
inline void tokenwise_forward(const kla_params& p, kla_stream_t stream = nullptr) {
  check(kla_tokenwise_forward(&p, stream));
}

/// Non-throwing variants.
inline kla_status try_chunk_forward(const kla_params& p, kla_stream_t stream = nullptr) noexcept {
  return kla_chunk_forward(&p, stream);
}
inline kla_status try_tokenwise_forward(const kla_params& p,
                                        kla_stream_t stream = nullptr) noexcept {
  return kla_tokenwise_forward(&p, stream);
}

inline std::string version() {
  return kla_version_string();
}

}  // namespace kla::cuda
