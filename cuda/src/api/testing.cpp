// The kernel mutant run's switch (common/kernel_mutants.hpp), compiled only into the test-only
// KLA_KERNEL_MUTANTS build. Tests find the entry point with dlsym, so the same test binaries run
// against the release library (no such symbol: they refuse --kla_mutant) and the mutant one.
#include <atomic>
#include <cstring>

#include "common/kernel_mutants.hpp"
#include "kla/kla.h"

namespace kla::kernels {
namespace {
std::atomic<int> g_mutant{0};
}
int active_kernel_mutant() {
  return g_mutant.load(std::memory_order_relaxed);
}
}  // namespace kla::kernels

/// Activates the planted fault `name` ("none" clears it) for every later launch; returns 0, or
/// -1 for an unknown name (nothing changes).
extern "C" KLA_API int kla_testing_set_kernel_mutant(const char* name) {
  using kla::kernels::KernelMutant;
  for (int i = 0; i < int(KernelMutant::count); ++i)
    if (name && std::strcmp(name, kla::kernels::kKernelMutantNames[i]) == 0) {
      kla::kernels::g_mutant.store(i, std::memory_order_relaxed);
      return 0;
    }
  return -1;
}
