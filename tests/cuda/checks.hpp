// Comparisons of kernel outputs with the reference under the per-path tolerances of
// tolerance.hpp, and the ledger of how close each path came to them (printed at exit; the table in
// docs/accuracy.md is made from it).
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "harness.hpp"
#include "tolerance.hpp"

namespace kla::test {

/// Worst measured / tolerance per path key, over every comparison of a test binary.
struct ToleranceLedger {
  struct Row {
    long cases = 0;
    double o = 0, state = 0, o_arith = 0, state_elem = 0;
    std::string o_case, state_case, o_arith_case, state_elem_case;
  };
  std::mutex m;
  std::map<std::string, Row> rows;
  void add(const std::string& key, double o_ratio, double s_ratio, double arith_ratio,
           double s_elem_ratio, const std::string& what) {
    std::lock_guard<std::mutex> lk(m);
    Row& r = rows[key];
    ++r.cases;
    if (o_ratio > r.o) r.o = o_ratio, r.o_case = what;
    if (s_ratio > r.state) r.state = s_ratio, r.state_case = what;
    if (arith_ratio > r.o_arith) r.o_arith = arith_ratio, r.o_arith_case = what;
    if (s_elem_ratio > r.state_elem) r.state_elem = s_elem_ratio, r.state_elem_case = what;
  }
};
inline ToleranceLedger& tolerance_ledger() {
  static ToleranceLedger l;
  return l;
}

/// Prints the ledger (one line per path key) at the end of a GPU test binary.
class ToleranceLedgerReport : public ::testing::Environment {
 public:
  void TearDown() override {
    ToleranceLedger& l = tolerance_ledger();
    for (const auto& [key, r] : l.rows)
      std::printf(
          "kla tolerance %s: %ld comparisons; worst o/tol %.3f, o arithmetic/allowance %.3f, "
          "state/tol %.3f (state worst at %s), state element/allowance %.3f (at %s)\n",
          key.c_str(), r.cases, r.o, r.o_arith, r.state, r.state_case.c_str(), r.state_elem,
          r.state_elem_case.c_str());
  }
};
inline const bool kToleranceLedgerRegistered =
    (::testing::AddGlobalTestEnvironment(new ToleranceLedgerReport), true);

struct Comparison {
  double o_rms = 0, state_rms = 0, o_max = 0, state_max = 0;
  std::string o_worst;      // where o_max was reached: [b, t, hv, v], reference, kernel
  std::string state_worst;  // where state_max was reached: [n, hv, k, v], reference, kernel
  double tol_o = 0, tol_state = 0, rd = 0, sigma = 0;
  bool ok = true;
  std::string report;
};

/// Compares device outputs with reference outputs under the tolerances of the path that produced
/// `got` (got.ran), for problem `d`. `pair` = true compares two kernel results (consistency
/// properties): each may err by its own tolerance, and neither is the reference, so the final
/// rounding is charged at its bound u_d per result instead of the sample's exact cost.
inline Comparison compare(const Outputs& got, const Outputs& ref, const Data& d,
                          bool pair = false) {
  Comparison c;
  const Config& cfg = d.cfg;
  const kla_dtype dt = cfg.dtype;
  const PathArithmetic a = path_arithmetic(got.ran, dt, cfg.K);
  double sigma = model_sigma(a, cfg.longest(), cfg.has_g ? cfg.decay_max : 0.0);
  if (pair) {  // the other result's own arithmetic (the same model, its path)
    const PathArithmetic b = path_arithmetic(ref.ran, dt, cfg.K);
    sigma += model_sigma(b, cfg.longest(), cfg.has_g ? cfg.decay_max : 0.0);
  }
  c.sigma = sigma;
  // Outputs: the final rounding's cost, then twice the unrounded result's allowance, relative to
  // the magnitudes the read-out sums (harness.hpp, magnitudes).
  const Magnitudes mags = magnitudes(d);
  const std::vector<double>& mag = mags.o;
  double num_rd = 0, den = 0, num_m = 0;
  for_each_compared(ref.o.size(), d, true, [&](std::size_t i) {
    const double e = rounded_ref(dt, ref.o[i]) - ref.o[i];
    num_rd += e * e;
    den += ref.o[i] * ref.o[i];
    num_m += mag[i] * mag[i];
  });
  const double ud = unit_roundoff(dt);
  const double den_s = den > 0 ? den : 1.0;
  c.rd = pair ? 2 * ud : std::sqrt(num_rd / den_s);
  c.tol_o = c.rd + 2 * (2 * sigma) * std::sqrt(num_m / den_s);
  c.o_rms = rel_rms(got.o, ref.o, d, true);
  // A pair's final roundings: each result errs by half a spacing of the stored dtype at its value,
  // at most u |r| for a normal value, half the subnormal spacing below the smallest normal.
  const double sub = subnormal_spacing(dt);
  for_each_compared(got.o.size(), d, true, [&](std::size_t i) {
    const double r = ref.o[i];
    const double allow =
        (pair ? std::max(2 * ud * std::abs(r), sub) : std::abs(rounded_ref(dt, r) - r)) +
        2 * 6 * sigma * std::max(mag[i], std::abs(r)) + 1e-300;
    const double x = std::isfinite(got.o[i]) ? std::abs(got.o[i] - r) / allow : INFINITY;
    if (x > c.o_max) {
      c.o_max = x;
      const auto s0 = std::size_t(d.os[0]), s1 = std::size_t(d.os[1]), s2 = std::size_t(d.os[2]);
      std::ostringstream w;
      w << "[" << i / s0 << ", " << i % s0 / s1 << ", " << i % s1 / s2 << ", " << i % s2 << "] ref "
        << r << " got " << got.o[i] << " magnitude " << mag[i];
      c.o_worst = w.str();
    }
  });
  bool ok = c.o_rms <= c.tol_o && c.o_max <= 1.0;
  c.tol_state = 2 * sigma;
  if (!got.state.empty() && !ref.state.empty()) {
    c.state_rms = rel_rms(got.state, ref.state, d, false);
    // The scale of an element's error is its own head's state (one [K, V] matrix per sequence and
    // value head), not the RMS over all of them: heads of one call differ in magnitude (a copied
    // initial state beside a processed one, read-outs of other norms), and an element of a large
    // head near a zero crossing errs by that head's scale. Of that head, the largest state it
    // passed through (magnitudes, state_peak, which includes the final one), decayed to the end:
    // the hand-offs sum terms that size even where later tokens cancel most of it.
    const std::size_t block = std::size_t(cfg.K) * std::size_t(cfg.V);
    for (std::size_t i = 0; i < ref.state.size(); ++i) {
      const double r = ref.state[i];
      const double allow = 6 * sigma * std::max(mags.state_peak[i / block], std::abs(r)) + 1e-300;
      const double x = std::isfinite(got.state[i]) ? std::abs(got.state[i] - r) / allow : INFINITY;
      // An exact state (a zero-length sequence's copy) passes with sigma = 0.
      if (got.state[i] != r && x > c.state_max) {
        c.state_max = x;
        const std::size_t e = i % block, nh = i / block;
        std::ostringstream w;
        w << "[" << nh / std::size_t(cfg.HV) << ", " << nh % std::size_t(cfg.HV) << ", "
          << e / std::size_t(cfg.V) << ", " << e % std::size_t(cfg.V) << "] ref " << r << " got "
          << got.state[i] << " head peak " << mags.state_peak[nh];
        c.state_worst = w.str();
      }
    }
    ok = ok && (c.state_rms <= c.tol_state || c.state_rms == 0.0) && c.state_max <= 1.0;
  }
  c.ok = ok;
  std::ostringstream os;
  os << cfg.describe() << " [" << a.key << (pair ? " pair" : "") << "]: o rel-rms " << c.o_rms
     << " (tol " << c.tol_o << " = rounding " << c.rd << " + 4 sigma " << 4 * sigma
     << " x read-out magnitude " << std::sqrt(num_m / den_s) << "), o max/allowance " << c.o_max
     << (c.o_worst.empty() ? "" : " at " + c.o_worst) << ", state rel-rms " << c.state_rms
     << " (tol " << c.tol_state << "), state max/allowance " << c.state_max
     << (c.state_worst.empty() ? "" : " at " + c.state_worst);
  c.report = os.str();
  if (!pair) {
    // How much of the arithmetic allowance the outputs used: (o_rms - rounding) / (4 sigma).
    const double arith = c.tol_o > c.rd ? std::max(0.0, c.o_rms - c.rd) / (c.tol_o - c.rd) : 0.0;
    tolerance_ledger().add(a.key, c.tol_o > 0 ? c.o_rms / c.tol_o : 0.0,
                           c.tol_state > 0 ? c.state_rms / c.tol_state : 0.0, arith, c.state_max,
                           cfg.describe());
  }
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
