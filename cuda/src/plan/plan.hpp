// The plan layer: which kernel path runs a call, with which tiling, and why. Pure host code (no
// CUDA): it sees the validated kla_params, a description of the device (DeviceInfo, cached per
// device by api/device.cu) and of the build (BuildInfo), and decides everything the launchers
// (launch/) then only carry out. Each path has one predicate that says yes or why not
// (plan/paths.hpp, CUTLASS's can_implement); plan_chunk orders them and picks the tiling
// (FlashAttention-3's heuristics, overridable through kla_params.path / value_slice).
#pragma once

#include <cstdint>
#include <string>

#include "kla/kla.h"
#include "layout/chunk_geometry.hpp"
#include "layout/saved_states.hpp"

namespace kla::plan {

/// What the plan knows of the device (kla_device_info in C++ form).
struct DeviceInfo {
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  int64_t max_smem = 0;  // opt-in dynamic shared memory per block
  bool tensor_maps = false;
};

/// What the plan knows of the library build: whether the sm_90a kernels (WY paths) exist.
struct BuildInfo {
  bool sm90a = false;
};
/// This library's build (KLA_HAVE_SM90A).
BuildInfo this_build();

/// The decision: path, tiling and the numbers the launchers use. Mirrors kla_plan.
struct Plan {
  kla_path path = KLA_PATH_GENERIC;
  int chunk = 0;        // tokens per chunk (0: tokenwise)
  int value_slice = 0;  // value columns per scan block
  int stages = 1;       // copy stages of the scan
  int threads = 0;      // threads per scan / tokenwise block
  int64_t blocks = 0;   // scan / tokenwise blocks
  int64_t prep_blocks = 0;
  int64_t smem_bytes = 0, prep_smem_bytes = 0;
  int64_t workspace_bytes = 0;                          // of kla_params.workspace this plan uses
  kla_arithmetic arithmetic = KLA_ARITHMETIC_ACCURATE;  // what the kernels run
  bool prep_images = false;  // the WY prep writes the K / Q images (the [token][column] scan)
  int kmax = 0;              // tokenwise register family (64, 128, 256)
  int64_t num_seqs = 0;      // N: batch, or num_seqs with cu_seqlens
  int64_t max_chunks = 0;    // 64-token chunks of the longest sequence
  int segments = 1;          // > 1: the sequence split (cp/segments.hpp); the fields above are
                             // then its second pass's, workspace_bytes the whole call's
  std::string reason;
};

/// The facts of a call the predicates look at, derived once from validated kla_params.
struct Problem {
  const kla_params* p = nullptr;
  layout::Elem elem = layout::Elem::F32;
  int64_t N = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  bool packed = false;     // cu_seqlens
  int64_t max_chunks = 0;  // 64-token chunks of the longest sequence
  bool workspace = false;
  bool fast = false;  // arithmetic FAST asked for (kla_arithmetic)
};
Problem describe(const kla_params& p);

/// Plans kla_chunk_forward for validated params. KLA_SUCCESS with `out` filled, or
/// KLA_ERROR_UNSUPPORTED_PATH (the message, set through kla::detail::fail, says why).
kla_status plan_chunk(const kla_params& p, const DeviceInfo& dev, const BuildInfo& build,
                      Plan& out);
/// Plans kla_tokenwise_forward for validated params.
kla_status plan_tokenwise(const kla_params& p, const DeviceInfo& dev, Plan& out);

/// Copies a Plan into the C struct (reason truncated to fit).
void to_c(const Plan& in, kla_plan& out);

/// Whether a one-pass plan's scan has a saving form (kla_chunk_forward_saving, kla.h "Saved
/// states"): the transposed scan in FAST, or the [token][column] WY scan at kSavedValueSlice
/// columns. The saving forward keeps such a plan and replans any other as WY at that slice; the
/// WY launcher picks the saving kernel by the same test.
inline bool scan_saves(const Plan& plan) {
  return (plan.path == KLA_PATH_WY_TRANSPOSED && plan.arithmetic == KLA_ARITHMETIC_FAST) ||
         (plan.path == KLA_PATH_WY && plan.value_slice == layout::kSavedValueSlice);
}
DeviceInfo from_c(const kla_device_info& d);
/// A described device (the _for plan entry points) that a device could be: NULL, a multiprocessor
/// count outside [1, 2^20], shared memory outside [0, 2^32] or a negative compute capability is
/// refused (NULL_POINTER / INVALID_VALUE, the message prefixed with `entry` where given).
kla_status check_device_description(const kla_device_info* device, const char* entry);

}  // namespace kla::plan
