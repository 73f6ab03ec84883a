// Device facts for the plan (api/device.hpp), cached per device id.
#include "api/device.hpp"

#include <mutex>
#include <string>

#include <cuda_runtime.h>

#include "api/errors.hpp"
#include "arch/tensor_map.hpp"

namespace kla::detail {
namespace {

constexpr int kMaxDevices = 64;

struct Cached {
  std::once_flag once;
  cudaError_t error = cudaSuccess;
  plan::DeviceInfo info;
};
Cached g_devices[kMaxDevices];

cudaError_t query(int id, plan::DeviceInfo& d) {
  int smem = 0;
  cudaError_t e;
  if ((e = cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, id)) ||
      (e = cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, id)) ||
      (e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, id)) ||
      (e = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, id)))
    return e;
  d.max_smem = smem;
  d.tensor_maps = kernels::tensor_map_encoder() != nullptr;
  return cudaSuccess;
}

}  // namespace

kla_status device_info(int id, plan::DeviceInfo& out) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the runtime's sticky error for this thread
    return fail(KLA_ERROR_NO_DEVICE,
                std::string("no CUDA device: ") +
                    (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount = 0"));
  }
  if (id < 0 || id >= count || id >= kMaxDevices)
    return fail(KLA_ERROR_NO_DEVICE, "device " + std::to_string(id) + " does not exist (" +
                                         std::to_string(count) + " devices)");
  Cached& c = g_devices[id];
  std::call_once(c.once, [&] { c.error = query(id, c.info); });
  if (c.error != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(KLA_ERROR_NO_DEVICE,
                std::string("CUDA device query failed: ") + cudaGetErrorString(c.error));
  }
  out = c.info;
  return KLA_SUCCESS;
}

kla_status current_device(plan::DeviceInfo& out) {
  int id = 0;
  const cudaError_t e = cudaGetDevice(&id);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(KLA_ERROR_NO_DEVICE, std::string("no CUDA device: ") + cudaGetErrorString(e));
  }
  return device_info(id, out);
}

}  // namespace kla::detail
