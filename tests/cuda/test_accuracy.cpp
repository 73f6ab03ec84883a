// Accuracy targets of issue 3 (ctest label cuda_accuracy): relative RMS of outputs and final
// state against the MPFR reference (133 bits, tokenwise recurrence) on the same rounded inputs,
// T = 2048, K = V = 128, key norms spread log-uniformly over [1e-3, 1e1] inside every chunk,
// decays alpha in [e^-0.1, 1], eta in [0.5, 1], eps in {0, 1e-6, 1e-3}, two value heads.
// Targets: bf16 <= 2e-3, fp16 <= 3e-4, fp32 <= 1e-5 (outputs and state); the "fast" rows run the
// same inputs under arithmetic FAST (kla_arithmetic), targets in target() below. Every row must
// also meet its path's derived tolerances (tolerance.hpp; the "tol" columns, "path" the plan that
// ran), and the rows with "g <= 5" repeat eps = 1e-6 under strong decay (per-token log decays in
// [-5, 0]). With KLA_ACCURACY_OUT=path the table is also written there (markdown).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "checks.hpp"

namespace kla::test {
namespace {

/// ACCURATE: issue 3's targets. FAST (issue 26): bf16 / fp16 no worse than flash-linear-
/// attention's error in the side-by-side (4.0e-3, 5.1e-4; tests/python/test_gpu.py compares with
/// FLA itself on the same inputs where it is installed); fp32 FAST keeps 1e-5.
double target(kla_dtype d, kla_arithmetic a) {
  const bool fast = a == KLA_ARITHMETIC_FAST;
  return d == KLA_DTYPE_BF16   ? (fast ? 4.0e-3 : 2e-3)
         : d == KLA_DTYPE_FP16 ? (fast ? 5.1e-4 : 3e-4)
                               : 1e-5;
}

TEST(CudaAccuracy, RelativeRmsAtT2048D128) {
  KLA_REQUIRE_GPU();
  std::vector<Config> cfgs;
  for (kla_dtype dt : {KLA_DTYPE_BF16, KLA_DTYPE_FP16, KLA_DTYPE_FP32})
    for (float eps : {0.0f, 1e-6f, 1e-3f, -1.0f}) {  // -1: eps 1e-6 under strong decay
      const bool strong = eps < 0;
      if (strong) eps = 1e-6f;
      Config c;
      c.dtype = dt;
      c.B = 1, c.T = 2048, c.H = 2, c.HV = 2, c.K = 128, c.V = 128;
      c.eps = eps;
      c.knorm_lo = 1e-3, c.knorm_hi = 1e1;
      c.decay_max = strong ? 5.0 : 0.1;
      c.eta_lo = 0.5;
      c.has_init = false;
      c.seed = 2048;
      cfgs.push_back(c);
    }
  std::vector<Data> data;
  for (const auto& c : cfgs) data.push_back(make_data(c));
  std::vector<Outputs> refs(cfgs.size());
  parallel_for(int(cfgs.size()), [&](int i) { refs[i] = run_reference<kla::ref::Mpfr>(data[i]); });

  std::ostringstream table;
  table << "| dtype | eps | decay | entry | path | o rel-RMS | o tol | state rel-RMS | state tol | "
           "target |\n"
        << "|---|---|---|---|---|---|---|---|---|---|\n";
  auto row = [&](const char* dtn, std::size_t i, const char* entry, const Outputs& got,
                 const Data& d) {
    const double ro = rel_rms(got.o, refs[i].o, data[i], true);
    const double rs = rel_rms(got.state, refs[i].state, data[i], false);
    const Comparison cmp = compare(got, refs[i], d);
    char line[320];
    std::snprintf(line, sizeof line,
                  "| %s | %g | g <= %g | %s | %s%s | %.3e | %.3e | %.3e | %.3e | %.2g |\n", dtn,
                  double(cfgs[i].eps), cfgs[i].decay_max, entry, kla_path_name(got.ran.path),
                  got.ran.arithmetic == KLA_ARITHMETIC_FAST ? " (FAST)" : "", ro, cmp.tol_o, rs,
                  cmp.tol_state, target(cfgs[i].dtype, d.cfg.arithmetic));
    table << line;
    EXPECT_LE(ro, target(cfgs[i].dtype, d.cfg.arithmetic)) << line;
    EXPECT_LE(rs, target(cfgs[i].dtype, d.cfg.arithmetic)) << line;
    EXPECT_TRUE(cmp.ok) << cmp.report;
  };
  for (std::size_t i = 0; i < cfgs.size(); ++i) {
    DeviceProblem dp(data[i]);
    for (Entry e : {Entry::chunk, Entry::tokenwise})
      row(dtype_name(cfgs[i].dtype), i, entry_name(e), run_device(dp, e), data[i]);
    {  // the same inputs, arithmetic FAST
      Data fast = data[i];
      fast.cfg.arithmetic = KLA_ARITHMETIC_FAST;
      DeviceProblem fp(fast);
      const std::string name = std::string(dtype_name(cfgs[i].dtype)) + " fast";
      row(name.c_str(), i, "chunk", run_device(fp, Entry::chunk), fast);
    }
  }
  std::printf("%s", table.str().c_str());
  if (const char* path = std::getenv("KLA_ACCURACY_OUT")) std::ofstream(path) << table.str();
}

}  // namespace
}  // namespace kla::test
