// kla.hpp — thin C++ layer over the C ABI of kla.h: a params type with defaults, an exception
// carrying the status, and throwing / non-throwing calls. Holds no resources (no RAII needed):
// every pointer stays the caller's.
#pragma once

#include <cstdint>
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
/// paths; without a workspace the plan can only take the slower workspace-free GENERIC kernel.
inline void chunk_forward(const kla_params& p, kla_stream_t stream = nullptr) {
  check(kla_chunk_forward(&p, stream));
}
/// Tokenwise forward (decode) on `stream`; throws kla::cuda::Error on failure.
inline void tokenwise_forward(const kla_params& p, kla_stream_t stream = nullptr) {
  check(kla_tokenwise_forward(&p, stream));
}

/// The plan kla_chunk_forward would run for `p` on the current device (path, tiling, workspace
/// bytes and the reason), without launching; throws kla::cuda::Error, with
/// KLA_ERROR_UNSUPPORTED_PATH when the requested path (or, with AUTO, every path) cannot run.
inline kla_plan plan_chunk_forward(const kla_params& p) {
  kla_plan plan{};
  check(kla_plan_chunk_forward(&p, &plan));
  return plan;
}
/// The same for a described device (no GPU needed).
inline kla_plan plan_chunk_forward_for(const kla_params& p, const kla_device_info& device) {
  kla_plan plan{};
  check(kla_plan_chunk_forward_for(&p, &device, &plan));
  return plan;
}
/// The plan of kla_tokenwise_forward; throws kla::cuda::Error.
inline kla_plan plan_tokenwise_forward(const kla_params& p) {
  kla_plan plan{};
  check(kla_plan_tokenwise_forward(&p, &plan));
  return plan;
}
/// The facts the plan uses about CUDA device `device`; throws kla::cuda::Error.
inline kla_device_info device_info(int device) {
  kla_device_info info{};
  check(kla_device_info_get(device, &info));
  return info;
}

/// Non-throwing variants.
inline kla_status try_chunk_forward(const kla_params& p, kla_stream_t stream = nullptr) noexcept {
  return kla_chunk_forward(&p, stream);
}
inline kla_status try_tokenwise_forward(const kla_params& p,
                                        kla_stream_t stream = nullptr) noexcept {
  return kla_tokenwise_forward(&p, stream);
}
/// `plan` is written only on success.
inline kla_status try_plan_chunk_forward(const kla_params& p, kla_plan& plan) noexcept {
  return kla_plan_chunk_forward(&p, &plan);
}
inline kla_status try_plan_chunk_forward_for(const kla_params& p, const kla_device_info& device,
                                             kla_plan& plan) noexcept {
  return kla_plan_chunk_forward_for(&p, &device, &plan);
}
inline kla_status try_plan_tokenwise_forward(const kla_params& p, kla_plan& plan) noexcept {
  return kla_plan_tokenwise_forward(&p, &plan);
}

inline std::string version() {
  return kla_version_string();
}
/// The library's KLA_ABI_VERSION; a binding checks it equals the header's once at load (the
/// SONAME carries it too: libkla_cuda.so.<KLA_ABI_VERSION>).
inline std::uint32_t abi_version() noexcept {
  return kla_abi_version();
}
/// "auto", "wy", "wy_transposed", "tf32", "generic", "tokenwise" ("unknown" for other values).
inline const char* path_name(kla_path path) noexcept {
  return kla_path_name(path);
}

}  // namespace kla::cuda
