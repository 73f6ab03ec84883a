// §4 of the report: the error against sequence length, per decay setting.
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "report/problems.hpp"
#include "report/runs.hpp"
#include "report/sections/sections.hpp"

namespace kla::report {

namespace {

/// Section 4's settings: decay range and eta range.
struct Decay {
  std::string name;
  double lo, hi, eta_lo, eta_hi;
};
const std::vector<Decay> kDecays = {{"none", 1.0, 1.0, 0.1, 1.0},
                                    {"alpha~0.99", 0.98, 1.0, 0.1, 1.0},
                                    {"strong (alpha in [0.5,0.9])", 0.5, 0.9, 0.1, 1.0},
                                    {"none, small eta (in [1e-3,1e-2])", 1.0, 1.0, 1e-3, 1e-2}};

}  // namespace

Section section_length(const Config& cfg, const Backends& bk, const std::string& dir) {
  std::vector<int> lengths;
  for (long T = 64; T < cfg.max_len; T *= 4) lengths.push_back(int(T));
  lengths.push_back(cfg.max_len);
  const std::vector<Algo> algos = {Algo{false, 64, false}, Algo{true, 64, false}};
  const double eps = 1e-6;
  Batch<std::string> batch(bk, algos);
  for (size_t di = 0; di < kDecays.size(); ++di) {
    Draw d;
    d.T = cfg.max_len;
    d.dk = d.dv = cfg.long_dim;
    d.knorm_lo = 0.5;
    d.knorm_hi = 2;
    d.alpha_lo = kDecays[di].lo;
    d.alpha_hi = kDecays[di].hi;
    d.eta_lo = kDecays[di].eta_lo;
    d.eta_hi = kDecays[di].eta_hi;
    batch.add(draw(d, mix_seed(cfg.seed, 4, di)), eps, kDecays[di].name);
  }
  batch.run("§4 error vs sequence length", cfg.threads);

  // A causal run's first T outputs are those of a run of length T (chunk boundaries at multiples
  // of 64 align too), so one long run per column gives every length as a prefix.
  Csv csv(dir + "/sec4_length.csv", {"variant", "algo", "decay", "T", "rel_err",
                                     "rel_err_incl_input_rounding", "nonfinite", "unit_roundoff"});
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<double>> curves;
  for (const auto& sp : batch.runs())
    for (int T : lengths) {
      const auto& s = *sp;
      const size_t n = size_t(T) * s.c->raw.dv;
      const ErrorStat e = rel_rms(s.r.o, s.c->truth.at(s.b->storage()).o, n);
      const double incl = rel_rms(s.r.o, s.c->truth_unrounded.o, n).rel;
      csv.row({s.b->id(), s.a.label(), s.tag, std::to_string(T), num(e.rel), num(incl),
               std::to_string(e.nonfinite), num(s.b->unit_roundoff())});
      curves[{s.b->id(), s.a.label(), s.tag}].push_back(e.rel);
    }
  // Growth exponent: least-squares slope of log(error) against log(T).
  auto slope = [&](const std::vector<double>& e) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n = 0;
    for (size_t i = 0; i < e.size(); ++i) {
      if (!(e[i] > 0) || !std::isfinite(e[i])) continue;
      const double x = std::log(double(lengths[i])), y = std::log(e[i]);
      sx += x, sy += y, sxx += x * x, sxy += x * y, ++n;
    }
    return n < 2 ? NAN : (n * sxy - sx * sy) / (n * sxx - sx * sx);
  };
  std::vector<std::vector<std::string>> rows;
  std::map<std::string, std::vector<double>> slopes_by_decay;
  for (const auto& b : bk)
    for (const Algo& a : algos) {
      if (!b->supports(a)) continue;
      std::vector<std::string> r{b->id(), b->algo_name(a)};
      for (const auto& dec : kDecays) {
        const auto& e = curves.at({b->id(), a.label(), dec.name});
        const double s = slope(e);
        r.push_back("T^" + fmt(s) + ", " + fmt(e.back()) +
                    " at T=" + std::to_string(lengths.back()));
        slopes_by_decay[dec.name].push_back(s);
      }
      rows.push_back(r);
    }
  const auto& f32 = curves.at({"fp32", algos[0].label(), kDecays[0].name});
  Section sec;
  sec.title = "4. Error against sequence length";
  std::vector<std::string> per_decay;
  for (const auto& dec : kDecays)
    per_decay.push_back(dec.name + " T^" + fmt(median(slopes_by_decay[dec.name])));
  double max_slope = -1;
  for (const auto& [name, v] : slopes_by_decay) max_slope = std::max(max_slope, median(v));
  sec.finding =
      (max_slope < 0.2 ? std::string("The error does not accumulate with length: median growth "
                                     "exponents over the columns "
                                     "are ")
                       : std::string("Median growth exponents of the error with length are ")) +
      join(per_decay, ", ") + " (sqrt(T) u would be T^0.5, T u T^1)" +
      (max_slope < 0.2
           ? ", because every Kaczmarz step removes the accumulated error along its key "
             "(factor 1 - eta) just as decay shrinks all of it"
           : std::string("")) +
      "; tokenwise fp32 without decay has " + fmt(f32.front()) + " at T=64 and " + fmt(f32.back()) +
      " at T=" + std::to_string(lengths.back()) + ".";
  std::ostringstream os;
  os << "One sequence per setting (decay, and eta in [0.1, 1] unless named), dk = dv = "
     << cfg.long_dim << ", |k| log-uniform in [0.5, 2], eps = 1e-6, lengths "
     << join(
            [&] {
              std::vector<std::string> v;
              for (int T : lengths) v.push_back(std::to_string(T));
              return v;
            }(),
            ", ")
     << " (prefixes of one run; `--max-len`, `--long-dim` change them). Columns: growth exponent "
        "of "
        "the relative RMS output error over the lengths (least-squares slope on log-log axes) and "
        "the "
        "error at the longest length. `sec4_length.csv` also has the error including input "
        "rounding.\n\n";
  os << image("sec4_length.png",
              "error against sequence length, log-log, with sqrt(T)u and Tu guides");
  std::vector<std::string> head{"column", "algorithm"};
  for (const auto& dec : kDecays) head.push_back("decay " + dec.name);
  os << md_table(head, rows) << "\n";
  sec.body = os.str();
  return sec;
}

}  // namespace kla::report
