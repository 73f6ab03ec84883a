// Tolerances and reference comparisons shared by the GPU tests.
//
// Stated tolerances (u_d = unit roundoff of the call's dtype: fp32 2^-24, bf16 2^-8, fp16 2^-11;
// u32 = 2^-24 for the kernels' fp32 arithmetic):
//   outputs o:     relative RMS <= u_d + 512 u32, and elementwise
//                  |o - ref| <= 2 u_d |ref| + 4096 u32 rms(ref)
//   final state:   relative RMS <= 512 u32 (the state is fp32 for every dtype), and elementwise
//                  |S - ref| <= 4096 u32 rms(ref)
// The u_d terms are the final rounding of o to the dtype (relative RMS of that rounding alone
// is about 0.4 u_d); the u32 terms allow the fp32 arithmetic a growth of a few hundred units
// over the sequence.
#pragma once

#include <sstream>
#include <string>

#include "harness.hpp"

namespace kla::test {

constexpr double kU32 = 1.0 / 16777216.0;

inline double tol_o_rms(kla_dtype d) {
  return unit_roundoff(d) + 512 * kU32;
}
inline double tol_state_rms() {
  return 512 * kU32;
}

struct Comparison {
  double o_rms = 0, state_rms = 0, o_max = 0, state_max = 0;
  bool ok = true;
  std::string report;
};

/// Compares device outputs with reference outputs under the stated tolerances, scaled by
/// `factor` (1 for kernel vs reference; 2 for kernel vs kernel).
inline Comparison compare(const Outputs& got, const Outputs& ref, const Data& d,
                          double factor = 1.0) {
  Comparison c;
  const kla_dtype dt = d.cfg.dtype;
  const double ud = unit_roundoff(dt);
  c.o_rms = rel_rms(got.o, ref.o, d, true);
  c.o_max = max_scaled_err(got.o, ref.o, d, true, 2 * ud * factor,
                           4096 * kU32 * factor * rms(ref.o) + 1e-30);
  bool ok = c.o_rms <= factor * tol_o_rms(dt) && c.o_max <= 1.0;
  if (!got.state.empty() && !ref.state.empty()) {
    c.state_rms = rel_rms(got.state, ref.state, d, false);
    c.state_max = max_scaled_err(got.state, ref.state, d, false, 0.0,
                                 4096 * kU32 * factor * rms(ref.state) + 1e-30);
    ok = ok && c.state_rms <= factor * tol_state_rms() && c.state_max <= 1.0;
  }
  c.ok = ok;
  std::ostringstream os;
  os << d.cfg.describe() << ": o rel-rms " << c.o_rms << " (tol " << factor * tol_o_rms(dt)
     << "), o max-scaled " << c.o_max << ", state rel-rms " << c.state_rms << " (tol "
     << factor * tol_state_rms() << "), state max-scaled " << c.state_max;
  c.report = os.str();
  return c;
}

/// Padding elements of o (between heads) must still hold the poison: nothing wrote there.
inline bool padding_untouched(const std::vector<double>& o, const Data& d) {
  const Config& c = d.cfg;
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int hv = 0; hv < c.HV; ++hv)
        for (int i = c.V; i < d.os[2]; ++i)
          if (!std::isnan(o[b * d.os[0] + t * d.os[1] + hv * d.os[2] + i])) return false;
  return true;
}

}  // namespace kla::test
