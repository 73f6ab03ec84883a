// §8 of the report: the recommended eps per column, from §2's sweep, and where to expect trouble.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "report/sections/sections.hpp"

namespace kla::report {

Section section_recommendations(const Config& cfg, const Backends& bk, const Sweep& sw,
                                const FormsResult& fr) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> recs;
  for (const auto& b : bk) {
    // Tolerance: 10x the column's median error at moderate key norms (0.1 <= |k| <= 10).
    std::vector<double> typical;
    for (const auto& [key, c] : sw.cells)
      if (std::get<0>(key) == b->id() && std::get<3>(key) >= 0.1 && std::get<3>(key) <= 10 &&
          !c.err.nonfinite)
        typical.push_back(c.err.rel);
    const double tol = 10 * median(typical);
    double best_eps = NAN;
    int best_bad = 1 << 30;
    bool zero_ok = false;
    std::vector<std::string> row{b->id(), fmt(tol)};
    for (double eps : cfg.eps_list) {
      int nan = 0, big = 0;
      double nan_kn = 0, big_kn = 0;
      for (const auto& [key, c] : sw.cells) {
        if (std::get<0>(key) != b->id() || std::get<2>(key) != eps) continue;
        if (c.err.nonfinite)
          ++nan, nan_kn = std::max(nan_kn, std::get<3>(key));
        else if (c.err.rel > tol)
          ++big, big_kn = std::max(big_kn, std::get<3>(key));
      }
      std::string cell;
      if (nan) cell = "NaN/Inf (|k| <= " + eps_str(nan_kn) + ")";
      if (big)
        cell +=
            (cell.empty() ? "" : "; ") + std::string("err > tol (|k| <= ") + eps_str(big_kn) + ")";
      if (cell.empty()) cell = "ok";
      row.push_back(cell);
      if (eps == 0) {
        zero_ok = nan + big == 0;
        continue;  // eps = 0 leans on the k = 0 convention (beta = 0), see below
      }
      if (nan + big < best_bad) best_bad = nan + big, best_eps = eps;  // smallest eps wins ties
    }
    row.push_back(eps_str(best_eps));
    rows.push_back(row);
    recs.push_back(b->id() + " " + eps_str(best_eps) +
                   (best_bad ? " (still " + std::to_string(best_bad) + " troubled runs)" : "") +
                   (zero_ok ? " (0 passes too)" : ""));
  }
  Section sec;
  sec.title = "8. Recommendations";
  sec.finding =
      "Recommended eps (smallest positive eps with no NaN/Inf and no error above 10x the column's "
      "typical error at any key norm in the sweep): " +
      join(recs, "; ") + "; kernels should use the " + fr.chosen_form + " form (section 5).";
  std::ostringstream os;
  os << "Criterion (computed over section 2's runs, all three algorithms): for each column, the "
        "smallest eps "
        "for which no key norm from "
     << eps_str(cfg.knorms.front()) << " to " << eps_str(cfg.knorms.back())
     << " gives NaN/Inf or an error above tol = 10x the column's median error at 0.1 <= |k| <= 10. "
        "Cells name the failure and the largest key norm where it occurs. eps = 0 is listed but "
        "not "
        "recommended even where it passes: it is safe only because the reference sets beta = 0 "
        "when "
        "|k|^2 + eps = 0, and any kernel or input path without that convention divides by "
        "zero.\n\n";
  std::vector<std::string> head{"column", "tol"};
  for (double eps : cfg.eps_list) head.push_back("eps=" + eps_str(eps));
  head.push_back("recommended");
  os << md_table(head, rows) << "\n";
  os << "Where to expect trouble:\n\n"
        "- eps is not free: by section 3 it shrinks every write by eps/(|k|^2+eps); with eps = "
        "1e-6 keys "
        "shorter than 1e-2 are written at least 1% short, with eps = 1e-3 keys shorter than 0.3.\n"
        "- fp16 cannot hold small eps (section 2's storage table: 1e-9 and below flush to 0, 1e-6 "
        "is "
        "subnormal) and cannot hold |k|^2 of short keys (per-component squares below 6e-8 flush), "
        "so "
        "beta = eta/(|k|^2+eps) overflows or hits the k = 0 convention; keep eps >= 1e-4 (a normal "
        "fp16 number) if beta is ever formed in fp16, or form beta in fp32 as the kernels do.\n"
        "- bf16 has fp32's exponent range, so eps never underflows; its 8 significant bits cost "
        "about 1e-2 "
        "relative error when every operation is rounded (bf16-emul), at every length; section 4 "
        "shows "
        "whether that error grows with T (it does when eta is small and nothing is forgotten).\n"
        "- Emulated columns round every operation and are pessimistic; the *-store columns (inputs "
        "in "
        "bf16/fp16, fp32 arithmetic) are the model of the kernels' behaviour.\n";
  if (has_kernels(bk))
    os << "- The cuda-* columns are the kernels themselves (section 2's two kernel runs per cell, "
          "token and chunk kernel); their tolerance is 10x their own typical error, which for "
          "bf16/fp16 is set by writing o in that dtype (section 2).\n";
  sec.body = os.str();
  return sec;
}

}  // namespace kla::report
