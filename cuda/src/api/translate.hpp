// kla_params (the ABI struct) -> KernelParams (the kernels' flat block), once per call on the host.
#pragma once

#include "common/kernel_params.hpp"
#include "kla/kla.h"
#include "plan/plan.hpp"

namespace kla::detail {

/// Resolves defaults (scale K^-1/2), the sequence count, the longest sequence's chunks and where
/// the workspace's regions lie for `plan` (the K / Q images only where its prep writes them).
/// p must be validated.
kernels::KernelParams translate(const kla_params& p, const plan::Plan& plan);

}  // namespace kla::detail
