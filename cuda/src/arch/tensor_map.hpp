// Host side of the sm_90 tensor copies: the driver's tensor-map encoder (through the runtime, no
// libcuda link) and the tile maps of the [B, T, heads, cols] tensors the WY scans read.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include "common/kernel_params.hpp"
#include "layout/chunk_geometry.hpp"

namespace kla::kernels {

/// The driver's tensor-map encoder (through the runtime: no libcuda link), or null.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

/// Tensor map of a raw [B, T, heads, cols] tensor (element strides st) whose box is box_cols
/// columns of one 64-token tile of one head: dims (element, token, head, batch), box (box_cols,
/// 64, 1, 1); elements past the tensor's end arrive as zeros. K / Q (bf16): 64-column boxes,
/// 128-byte swizzled; V (when its slice goes through shared memory, wy_v_in_smem): the scan's
/// value slice, unswizzled. The stride of a dimension of extent 1 is never used (validation does
/// not check it): the previous dimension's stride stands in for it, which the driver accepts.
/// False when the driver refuses the map (plan/paths.cpp predicts its documented limits).
template <class E>
bool make_tile_map(CUtensorMap& m, const void* base, const int64_t (&st)[3], const KernelParams& p,
                   int cols, int heads, int box_cols, bool swizzle) {
  const auto encode = tensor_map_encoder();
  if (!encode) return false;
  const int64_t B = p.cu_seqlens ? 1 : p.N;
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(p.T), cuuint64_t(heads), cuuint64_t(B)};
  constexpr cuuint64_t es = sizeof(E);
  const cuuint64_t s_t = p.T > 1 ? cuuint64_t(st[1]) * es : cuuint64_t(cols) * es;
  const cuuint64_t s_h = heads > 1 ? cuuint64_t(st[2]) * es : s_t;
  const cuuint64_t strides[3] = {s_t, s_h, B > 1 ? cuuint64_t(st[0]) * es : s_h};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(layout::kChunk), 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = std::is_same_v<E, float>    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                 : std::is_same_v<E, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(&m, dt, 4, const_cast<void*>(base), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace kla::kernels
