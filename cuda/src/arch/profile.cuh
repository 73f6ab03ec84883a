// Profiling hooks of the WY scans, compiled only in a development build (-DKLA_WY_PROFILE): block 0
// of the scan records the cycles per chunk that warp 0 (recurrence) and warp 8 (read-out; the
// transposed scan: warp 0 only) spend in each phase, and a kernel launched after it prints them.
// Not printf in the scan itself: a kernel that calls printf has every wgmma serialised by ptxas
// (a wait after each), which overstates the products (docs/prefill_notes.md, 'Design decisions').
// Without the define KLA_WY_MARK is empty and nothing here is compiled.
#pragma once

#ifdef KLA_WY_PROFILE
#include <cstdio>
#endif

#include <cuda_runtime.h>

namespace kla::kernels {

#ifdef KLA_WY_PROFILE
#define KLA_WY_MARK(k) \
  if (prof_on) prof[k] += clock64() - prof_t, prof_t = clock64()
/// [row: warp 0, warp 8][phase 0-6 (7 unused), then the chunk count].
static __device__ long long g_wy_profile[2][9];  // one per translation unit
static __global__ void wy_profile_print_kernel(int transposed) {
  for (int row = 0; row < (transposed ? 1 : 2); ++row) {
    const long long* v = g_wy_profile[row];
    const long long n = v[8] > 0 ? v[8] : 1;
    if (transposed)
      printf(
          "wy64 scan block 0 warp 0, cycles per chunk (%lld chunks): wait %lld, barrier0 %lld, "
          "KS|QS %lld, R %lld, X|O %lld, update issue %lld, O tile + update wait %lld\n",
          v[8], v[0] / n, v[1] / n, v[2] / n, v[3] / n, v[4] / n, v[5] / n, v[6] / n);
    else
      printf(
          "wy scan block 0 warp %d, cycles per chunk (%lld chunks): wait %lld, barrier0 %lld, "
          "stepA %lld, barrierA %lld, stepB %lld, barrierB %lld, stepC %lld\n",
          row ? 8 : 0, v[8], v[0] / n, v[1] / n, v[2] / n, v[3] / n, v[4] / n, v[5] / n, v[6] / n);
  }
}
/// Block 0's phases into g_wy_profile (the thread that measured).
__device__ __forceinline__ void wy_profile_store(int row, const long long* prof, int phases,
                                                 int nch) {
  for (int k = 0; k < 8; ++k) g_wy_profile[row][k] = k < phases ? prof[k] : 0;
  g_wy_profile[row][8] = nch;
}
#else
#define KLA_WY_MARK(k)
#endif

}  // namespace kla::kernels
