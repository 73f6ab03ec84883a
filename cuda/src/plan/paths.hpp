// One predicate per kernel path, CUTLASS's can_implement: each returns "" when the path can run
// the problem on the device, else one clause saying why not ("compute capability 8.0: the WY
// kernels are sm_90a code"). They share the layouts' arithmetic with the kernels (layout/), so a
// path the plan accepts is one whose launch fits.
#pragma once

#include <string>

#include "layout/generic_layout.hpp"
#include "plan/plan.hpp"

namespace kla::plan {

/// Grid limits of a launch: x < 2^31, y and z <= 65535.
constexpr int64_t kGridXMax = 2147483647, kGridYZMax = 65535;

/// The WY paths' common conditions (sm_90a build and device, the workspace, K, the prep's grid and
/// shared memory, the tensor maps of K / Q (bf16) and V).
std::string wy_can_implement(const Problem& pb, const DeviceInfo& dev, const BuildInfo& build);
/// The [token][column] WY scan with VS-column slices (on top of wy_can_implement).
std::string wy_slice_can_implement(const Problem& pb, const DeviceInfo& dev, int VS);
/// The transposed WY scan (on top of wy_can_implement): bf16 / fp16, K a multiple of 64, V of 64.
std::string wy_transposed_can_implement(const Problem& pb, const DeviceInfo& dev);
/// The TF32 path: workspace, the prep's grid and shared memory.
std::string tf32_can_implement(const Problem& pb, const DeviceInfo& dev);
/// The TF32 scan with VS-column slices and `stages` copy stages.
std::string tf32_slice_can_implement(const Problem& pb, const DeviceInfo& dev, int VS, int stages);
/// The generic kernel with tiling t.
std::string generic_can_implement(const Problem& pb, const DeviceInfo& dev,
                                  layout::GenericTiling t);
/// Whether the driver can encode the tile map of a [B, T, heads, cols] tensor with element
/// strides st (the documented limits of cuTensorMapEncodeTiled; strides of extent-1 dimensions
/// are replaced by the launcher and not checked).
std::string tensor_map_can_encode(const char* name, const int64_t (&st)[3], int64_t B, int64_t T,
                                  int64_t heads, int esize);

}  // namespace kla::plan
