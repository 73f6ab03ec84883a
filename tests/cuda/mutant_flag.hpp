// `--kla_mutant=NAME` on a GPU test's command line: activates one planted kernel fault
// (cuda/src/common/kernel_mutants.hpp) through kla_testing_set_kernel_mutant, which only the
// test-only mutant build of libkla_cuda exports (preset gpu-mutants). Looked up with dlsym, so the
// same binaries run against the release library, where the flag is refused (exit 2): a mutant run
// that silently tested the release kernels would prove nothing.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kla::test {

/// Removes --kla_mutant=NAME from argv and activates it; exits 2 when the library has no mutants
/// or does not know the name.
inline void parse_mutant_flag(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--kla_mutant=", 13) != 0) {
      argv[out++] = argv[i];
      continue;
    }
    using SetFn = int (*)(const char*);
    const auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "kla_testing_set_kernel_mutant"));
    if (!set) {
      std::fprintf(stderr,
                   "--kla_mutant: this libkla_cuda has no planted faults (build the preset "
                   "gpu-mutants and put its library first on LD_LIBRARY_PATH)\n");
      std::exit(2);
    }
    if (set(a + 13) != 0) {
      std::fprintf(stderr, "--kla_mutant: unknown mutant '%s'\n", a + 13);
      std::exit(2);
    }
    std::printf("kla kernel mutant active: %s\n", a + 13);
  }
  argc = out;
  argv[argc] = nullptr;
}

}  // namespace kla::test
