// The sm_90a diagnostics' device check (bench/wgmma_latency.cu, bench/fused_backward_floor.cu):
// they run only on a compute capability 9.0 GPU, and elsewhere say so and exit 0.
#pragma once

#include <cstdio>

#include <cuda_runtime.h>

/// The current device if it has compute capability 9.0, else -1 after printing why `program`
/// does not run here.
inline int sm90_device_or_explain(const char* program) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
      major != 9 || minor != 0) {
    std::printf("%s: needs a compute capability 9.0 GPU (sm_90a); none here\n", program);
    return -1;
  }
  return dev;
}
