// The paths' predicates (plan/paths.hpp). Each clause names the fact that rules a path out, with
// the numbers, so a caller reading kla_plan.reason can act on it.
#include "plan/paths.hpp"

#include "api/errors.hpp"
#include "layout/tf32_layout.hpp"
#include "layout/wy_layout.hpp"

namespace kla::plan {
namespace {

using detail::cat;

std::string smem_clause(const char* what, int64_t need, const DeviceInfo& dev) {
  if (need <= dev.max_smem) return "";
  return cat(what, " needs ", need, " bytes of shared memory a block, the device allows ",
             dev.max_smem);
}

/// The prep grid (chunks, value heads, sequences) of the two-pass paths.
std::string prep_grid_clause(const Problem& pb) {
  if (pb.HV > kGridYZMax) return cat("num_v_heads = ", pb.HV, " exceeds the prep grid's 65535");
  if (pb.N > kGridYZMax) return cat(pb.N, " sequences exceed the prep grid's 65535");
  return "";
}

/// Scan blocks of a slice width VS.
int64_t scan_blocks(const Problem& pb, int VS) {
  return pb.N * pb.HV * (pb.V / VS);
}

std::string scan_grid_clause(const Problem& pb, int VS) {
  if (scan_blocks(pb, VS) > kGridXMax)
    return cat(scan_blocks(pb, VS), " scan blocks exceed the grid's 2^31-1");
  return "";
}

}  // namespace

std::string tensor_map_can_encode(const char* name, const int64_t (&st)[3], int64_t B, int64_t T,
                                  int64_t heads, int esize) {
  constexpr int64_t kMaxDim = int64_t(1) << 32, kMaxStride = int64_t(1) << 40;
  const int64_t ext[3] = {B, T, heads};
  static const char* dims[3] = {"B", "T", "head"};
  for (int d = 0; d < 3; ++d) {
    if (ext[d] > kMaxDim)
      return cat(name, "'s ", dims[d], " extent ", ext[d], " exceeds a tensor map's 2^32");
    if (ext[d] > 1 && st[d] >= kMaxStride / esize)
      return cat(name, "_strides[", d, "] = ", st[d], " elements is 2^40 bytes or more (a ",
                 "tensor map's limit)");
  }
  return "";
}

std::string wy_can_implement(const Problem& pb, const DeviceInfo& dev, const BuildInfo& build) {
  if (!build.sm90a) return "the library was built without sm_90a kernels (CUDA architecture 90a)";
  if (dev.cc_major != 9 || dev.cc_minor != 0)
    return cat("compute capability ", dev.cc_major, ".", dev.cc_minor,
               ": the WY kernels are sm_90a code (9.0 only)");
  if (pb.elem == layout::Elem::F32 && !pb.fast)
    return "fp32 with arithmetic ACCURATE (the WY products keep 16 bits of fp32 K / Q; FAST "
           "allows that)";
  if (!pb.workspace) return "no workspace (kla_params.workspace is NULL)";
  if (pb.max_chunks <= 0) return "no tokens (every sequence is empty)";
  if (pb.K != 64 && pb.K != 96 && pb.K != 128)
    return cat("head_dim_k = ", pb.K, " (the WY kernels are built for 64, 96 and 128)");
  if (pb.V % 16 != 0) return cat("head_dim_v = ", pb.V, " is not a multiple of 16");
  if (auto s = prep_grid_clause(pb); !s.empty()) return s;
  const int K = int(pb.K);
  if (auto s = smem_clause("the WY prep", layout::wy_prep_layout(pb.elem, K).bytes, dev);
      !s.empty())
    return s;
  if (!dev.tensor_maps) return "the driver cannot encode tensor maps";
  const kla_params& p = *pb.p;
  const int es = layout::elem_bytes(pb.elem);
  const int64_t B = pb.packed ? 1 : pb.N;
  if (auto s = tensor_map_can_encode("v", p.v_strides, B, pb.T, pb.HV, es); !s.empty()) return s;
  if (!layout::wy_kq_images(pb.elem)) {  // K and Q by tensor copies
    if (auto s = tensor_map_can_encode("k", p.k_strides, B, pb.T, pb.H, es); !s.empty()) return s;
    if (auto s = tensor_map_can_encode("q", p.q_strides, B, pb.T, pb.H, es); !s.empty()) return s;
  }
  return "";
}

std::string wy_slice_can_implement(const Problem& pb, const DeviceInfo& dev, int VS) {
  if (VS != 8 && VS != 16 && VS != 32)
    return cat("value_slice = ", VS, " (the WY scan takes 8, 16 or 32 columns)");
  if (VS == 8 && pb.K < 96)
    return cat("8-column slices need head_dim_k >= 96 (two warps would share a key-row block at ",
               pb.K, ")");
  if (pb.V % VS != 0) return cat("head_dim_v = ", pb.V, " is not a multiple of ", VS);
  if (auto s = smem_clause("the WY scan", layout::wy_scan_smem_bytes(pb.elem, int(pb.K), VS), dev);
      !s.empty())
    return s;
  return scan_grid_clause(pb, VS);
}

std::string wy_transposed_can_implement(const Problem& pb, const DeviceInfo& dev) {
  if (pb.elem == layout::Elem::F32) return "fp32 storage (the transposed scan is bf16 / fp16)";
  if (pb.K % 64 != 0) return cat("head_dim_k = ", pb.K, " is not a multiple of 64");
  if (pb.V % 64 != 0) return cat("head_dim_v = ", pb.V, " is not a multiple of 64");
  if (auto s = smem_clause("the transposed scan", layout::wy_t_smem_bytes(int(pb.K)), dev);
      !s.empty())
    return s;
  // The transposed scan reads K and Q by tensor copies for fp16 too (no images).
  const kla_params& p = *pb.p;
  const int64_t B = pb.packed ? 1 : pb.N;
  if (auto s = tensor_map_can_encode("k", p.k_strides, B, pb.T, pb.H, 2); !s.empty()) return s;
  if (auto s = tensor_map_can_encode("q", p.q_strides, B, pb.T, pb.H, 2); !s.empty()) return s;
  return scan_grid_clause(pb, layout::kWyTColumns);
}

std::string tf32_can_implement(const Problem& pb, const DeviceInfo& dev) {
  if (dev.cc_major < 8)
    return cat("compute capability ", dev.cc_major, ".", dev.cc_minor,
               ": the TF32 kernels need 8.0 or later");
  if (!pb.workspace) return "no workspace (kla_params.workspace is NULL)";
  if (pb.max_chunks <= 0) return "no tokens (every sequence is empty)";
  if (auto s = prep_grid_clause(pb); !s.empty()) return s;
  return smem_clause("the TF32 prep",
                     layout::tf32_prep_smem_bytes(int(pb.K), layout::elem_bytes(pb.elem)), dev);
}

std::string tf32_slice_can_implement(const Problem& pb, const DeviceInfo& dev, int VS, int stages) {
  if (VS != 8 && VS != 16 && VS != 32)
    return cat("value_slice = ", VS, " (the TF32 scan takes 8, 16 or 32 columns)");
  if (pb.V % VS != 0) return cat("head_dim_v = ", pb.V, " is not a multiple of ", VS);
  if (auto s = smem_clause(
          "the TF32 scan",
          layout::tf32_scan_smem_bytes(int(pb.K), VS, layout::elem_bytes(pb.elem), stages), dev);
      !s.empty())
    return s;
  return scan_grid_clause(pb, VS);
}

std::string generic_can_implement(const Problem& pb, const DeviceInfo& dev,
                                  layout::GenericTiling t) {
  if (t.VS != 16 && t.VS != 32)
    return cat("value_slice = ", t.VS, " (the generic kernel takes 16 or 32 columns)");
  if (pb.V % t.VS != 0) return cat("head_dim_v = ", pb.V, " is not a multiple of ", t.VS);
  if (auto s =
          smem_clause("the generic kernel", layout::generic_smem_floats(int(pb.K), t) * 4, dev);
      !s.empty())
    return s;
  return scan_grid_clause(pb, t.VS);
}

}  // namespace kla::plan
