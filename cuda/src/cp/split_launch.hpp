// launch_split (cp/segments.cu): the sequence split's launches, for api/entry.cu.
#pragma once

#include <cuda_runtime.h>

#include "kla/kla.h"
#include "plan/plan.hpp"

namespace kla::cp {

/// Enqueues a validated call split into n segments a sequence (its plan has segments = n) on
/// `stream`: setup, maps pass, fold, second pass, final states. On an error `what` names the step.
cudaError_t launch_split(const kla_params& p, int n, const plan::DeviceInfo& dev,
                         cudaStream_t stream, const char*& what);

}  // namespace kla::cp
