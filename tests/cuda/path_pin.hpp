// The chunkwise path the GPU tests pin, through kla_params.path / value_slice (never the
// environment): `--kla_path=NAME` on a GPU test's command line (gpu_test_main.cpp; the GPU suite
// passes one per step). Every chunkwise call of the harness (call(), run_device()) asks the plan
// first: where the pinned path applies, the call runs it and the plan is asserted to be it, so a
// fallback can never pass for the path under test; where it does not apply, the call must be
// refused with KLA_ERROR_UNSUPPORTED_PATH, and the case then runs on the plan's own choice and is
// counted as refused. At exit the ledger prints how many calls each path ran, and a pinned run in
// which the pinned path never ran fails.
#pragma once

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include <gtest/gtest.h>

#include "kla/kla.h"

namespace kla::test {

struct PathPin {
  std::string name = "auto";
  kla_path path = KLA_PATH_AUTO;
  int32_t value_slice = 0;
};

inline PathPin& pinned_path() {
  static PathPin p;
  return p;
}

/// The names --kla_path takes.
inline bool path_pin_from_name(const std::string& name, PathPin& out) {
  static const struct {
    const char* name;
    kla_path path;
    int32_t vs;
  } table[] = {{"auto", KLA_PATH_AUTO, 0}, {"wy", KLA_PATH_WY, 0},
               {"wy8", KLA_PATH_WY, 8},    {"wy16", KLA_PATH_WY, 16},
               {"wy32", KLA_PATH_WY, 32},  {"wy_transposed", KLA_PATH_WY_TRANSPOSED, 0},
               {"tf32", KLA_PATH_TF32, 0}, {"generic", KLA_PATH_GENERIC, 0}};
  for (const auto& t : table)
    if (name == t.name) {
      out = {t.name, t.path, t.vs};
      return true;
    }
  return false;
}

/// Calls per path name (the plans that ran) and calls refused under the pin.
struct PathLedger {
  std::mutex m;
  std::map<std::string, long> ran;
  long refused = 0;
  void add_ran(const kla_plan& plan) {
    std::lock_guard<std::mutex> lk(m);
    const std::string key = std::string(plan.path_name) + "/" + std::to_string(plan.value_slice);
    ++ran[key];
  }
  void add_refused() {
    std::lock_guard<std::mutex> lk(m);
    ++refused;
  }
};
inline PathLedger& path_ledger() {
  static PathLedger l;
  return l;
}

/// kla_chunk_forward through the pin: see the file comment. Statuses other than success and the
/// pin's refusal (validation errors the test provokes) pass through unchanged. `ran`, when given,
/// receives the plan of the call that ran.
inline kla_status chunk_forward_pinned(const kla_params& p, kla_stream_t s,
                                       kla_plan* ran = nullptr) {
  const PathPin& pin = pinned_path();
  kla_params q = p;
  if (pin.path != KLA_PATH_AUTO && p.path == KLA_PATH_AUTO) {
    q.path = pin.path;
    q.value_slice = pin.value_slice;
  }
  kla_plan plan{};
  const kla_status planned = kla_plan_chunk_forward(&q, &plan);
  if (planned == KLA_ERROR_UNSUPPORTED_PATH && q.path != p.path) {
    // The pinned path does not apply: the entry point must refuse it the same way.
    const kla_status st = kla_chunk_forward(&q, s);
    EXPECT_EQ(st, KLA_ERROR_UNSUPPORTED_PATH)
        << "the plan refused path " << pin.name << " but kla_chunk_forward returned "
        << kla_status_string(st);
    EXPECT_NE(std::strstr(kla_last_error_message(), kla_path_name(pin.path)), nullptr)
        << kla_last_error_message();
    path_ledger().add_refused();
    q = p;  // the case runs on the plan's own choice
    if (kla_plan_chunk_forward(&q, &plan) != KLA_SUCCESS) return kla_chunk_forward(&q, s);
  } else if (planned != KLA_SUCCESS) {
    return kla_chunk_forward(&q, s);  // a validation error the test provokes
  } else if (q.path != KLA_PATH_AUTO) {
    EXPECT_EQ(plan.path, q.path) << plan.reason;
    if (q.value_slice) {
      EXPECT_EQ(plan.value_slice, q.value_slice) << plan.reason;
    }
  }
  const kla_status st = kla_chunk_forward(&q, s);
  if (st == KLA_SUCCESS) path_ledger().add_ran(plan);
  if (ran) *ran = plan;
  return st;
}

/// Prints the ledger; fails a pinned run whose path never ran.
class PathLedgerReport : public ::testing::Environment {
 public:
  void TearDown() override {
    PathLedger& l = path_ledger();
    const PathPin& pin = pinned_path();
    std::string line = "kla paths (pin " + pin.name + "):";
    long pinned_runs = 0;
    for (const auto& [key, n] : l.ran) {
      line += " " + key + " x" + std::to_string(n);
      if (key.rfind(std::string(kla_path_name(pin.path)) + "/", 0) == 0 &&
          (pin.value_slice == 0 ||
           key.substr(key.find('/') + 1) == std::to_string(pin.value_slice)))
        pinned_runs += n;
    }
    line += "; refused " + std::to_string(l.refused);
    std::printf("%s\n", line.c_str());
    if (pin.path != KLA_PATH_AUTO && !l.ran.empty() && pinned_runs == 0)
      ADD_FAILURE() << "path " << pin.name << " was pinned but never ran";
  }
};

/// Removes --kla_path=NAME from argv and pins it; exits 2 on an unknown name.
inline void parse_path_flag(int& argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--kla_path=", 11) == 0) {
      if (!path_pin_from_name(a + 11, pinned_path())) {
        std::fprintf(stderr,
                     "unknown --kla_path=%s (auto, wy, wy8, wy16, wy32, wy_transposed, "
                     "tf32, generic)\n",
                     a + 11);
        std::exit(2);
      }
      continue;
    }
    argv[out++] = argv[i];
  }
  argc = out;
  argv[argc] = nullptr;
  ::testing::AddGlobalTestEnvironment(new PathLedgerReport);
}

}  // namespace kla::test
