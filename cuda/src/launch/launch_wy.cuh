// Launcher of the WY paths at head dim KD (launch/launchers.hpp): the tensor maps the plan's scan
// reads, the prep over (chunk, value head, sequence), then the [token][column] scan at the plan's
// slice or the transposed scan (in the plan's arithmetic). Decides nothing: the plan
// (plan/plan.cpp) has checked that every piece fits; a tensor map the driver still refuses is an
// error, not a fallback.
#pragma once

#include <type_traits>

#include "arch/profile.cuh"
#include "arch/tensor_map.hpp"
#include "launch/launchers.hpp"
#include "prep/wy_prep.cuh"
#include "scan/wy_scan.cuh"
#include "scan/wy_scan_transposed.cuh"

namespace kla::kernels {

template <class E, int KD, int VS, bool kSave = false>
cudaError_t launch_wy_scan(const KernelParams& p, cudaStream_t stream, const CUtensorMap& kmap,
                           const CUtensorMap& qmap, const CUtensorMap& vmap, const char*& what) {
  constexpr int64_t bytes = wy_scan_smem_bytes(elem_of<E>(), KD, VS);
  const auto kern = chunk_wy_scan_kernel<E, KD, VS, kSave>;
  what = "the WY scan";
  const cudaError_t e =
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / VS);
  kern<<<dim3(unsigned(blocks)), wy_scan_threads(elem_of<E>()), size_t(bytes), stream>>>(
      p, reinterpret_cast<const char*>(p.ws), kmap, qmap, vmap);
#ifdef KLA_WY_PROFILE
  wy_profile_print_kernel<<<1, 1, 0, stream>>>(0);
#endif
  return cudaGetLastError();
}

template <class E, int KD, bool kFast, bool kSave = false>
cudaError_t launch_wy_scan_transposed(const KernelParams& p, cudaStream_t stream,
                                      const CUtensorMap& kmap, const CUtensorMap& qmap,
                                      const CUtensorMap& vmap, const char*& what) {
  constexpr int64_t bytes = kSave ? wy_t_saving_smem_bytes(KD) : wy_t_smem_bytes(KD);
  const auto kern = chunk_wy_scan_transposed_kernel<E, KD, kFast, kSave>;
  what = "the transposed WY scan";
  const cudaError_t e =
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const int64_t blocks = int64_t(p.N) * p.HV * (p.V / kWyTColumns);
  kern<<<dim3(unsigned(blocks)), kWyTThreads, size_t(bytes), stream>>>(
      p, reinterpret_cast<const char*>(p.ws), kmap, qmap, vmap);
#ifdef KLA_WY_PROFILE
  wy_profile_print_kernel<<<1, 1, 0, stream>>>(1);
#endif
  return cudaGetLastError();
}

template <class E, int KD>
cudaError_t launch_wy(const KernelParams& p, const plan::Plan& plan, cudaStream_t stream,
                      const char*& what) {
  KLA_SYNC_KERNEL_MUTANT(stream, what);  // a no-op outside the mutant build
  constexpr bool kTransposable = !std::is_same_v<E, float> && KD % 64 == 0;
  const bool transposed = plan.path == KLA_PATH_WY_TRANSPOSED;
  const int VS = plan.value_slice;
  // Every tensor map first, so that a map the driver refuses leaves nothing launched. K and Q by
  // tensor copies: bf16 / fp16 (raw boxes, both scans); the fp32 [token][column] scan reads the
  // prep's images instead. V: the transposed scan's 64-column swizzled boxes, or the scan's slice
  // where it goes through the stages (wy_v_in_smem).
  CUtensorMap kmap{}, qmap{}, vmap{};
  if (!wy_kq_images(elem_of<E>())) {
    if (!make_tile_map<E>(kmap, p.k, p.ks, p, KD, p.H, 64, true) ||
        !make_tile_map<E>(qmap, p.q, p.qs, p, KD, p.H, 64, true)) {
      what = "the driver refused the tensor map of k or q";
      return cudaErrorInvalidValue;
    }
  }
  const bool v_map = transposed || wy_v_in_smem(elem_of<E>(), KD, VS);
  if (v_map &&
      !make_tile_map<E>(vmap, p.v, p.vs, p, p.V, p.HV, transposed ? kWyTColumns : VS, transposed)) {
    what = "the driver refused the tensor map of v";
    return cudaErrorInvalidValue;
  }
  what = "the WY prep";
  constexpr int64_t prep_bytes = wy_prep_layout(elem_of<E>(), KD).bytes;
  cudaError_t e = cudaFuncSetAttribute(
      chunk_wy_prep_kernel<E, KD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prep_bytes));
  if (e != cudaSuccess) return e;
  chunk_wy_prep_kernel<E, KD>
      <<<dim3(unsigned(p.max_chunks), unsigned(p.HV), unsigned(p.N)), kWyPrepThreads,
         size_t(prep_bytes), stream>>>(p, reinterpret_cast<char*>(p.ws));
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  // Saved states (p.saved): the scan compiled to write them; the entry point planned the
  // transposed scan in FAST or WY at 32 columns for this dtype and head dim
  // (kla_chunk_forward_saving).
  if (p.saved != nullptr) {
    if constexpr (std::is_same_v<E, __nv_bfloat16> && KD == kSavedHeadDim)
      if (plan::scan_saves(plan))
        return transposed
                   ? launch_wy_scan_transposed<E, KD, true, true>(p, stream, kmap, qmap, vmap, what)
                   : launch_wy_scan<E, KD, kSavedValueSlice, true>(p, stream, kmap, qmap, vmap,
                                                                   what);
    what = "the WY launcher (no saving scan for the plan's dtype, head dim or tiling)";
    return cudaErrorInvalidConfiguration;
  }
  if constexpr (kTransposable)
    if (transposed)
      return KLA_HOST_MUTANT(fast_in_accurate) || plan.arithmetic == KLA_ARITHMETIC_FAST
                 ? launch_wy_scan_transposed<E, KD, true>(p, stream, kmap, qmap, vmap, what)
                 : launch_wy_scan_transposed<E, KD, false>(p, stream, kmap, qmap, vmap, what);
  switch (VS) {
    case 8:
      if constexpr (KD >= 96) return launch_wy_scan<E, KD, 8>(p, stream, kmap, qmap, vmap, what);
      break;
    case 16: return launch_wy_scan<E, KD, 16>(p, stream, kmap, qmap, vmap, what);
    case 32: return launch_wy_scan<E, KD, 32>(p, stream, kmap, qmap, vmap, what);
  }
  what = "the WY launcher (no kernel for the plan's tiling)";
  return cudaErrorInvalidConfiguration;
}

}  // namespace kla::kernels
