// The sections of report.md, one file each: every section runs its sweep, writes its CSV files
// to `dir` and returns its Markdown, opening with a finding computed from the numbers.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "report/cli.hpp"
#include "report/columns.hpp"
#include "report/common.hpp"
#include "report/markdown.hpp"
#include "report/util.hpp"

namespace kla::report {

/// One run of §2's sweep, which §5 and §8 read again.
struct SweepCell {
  ErrorStat err;
  double incl = 0, state = 0;
  double floor = 0;  ///< error of the exact output rounded to the column's storage dtype
};
/// variant, algo, eps, |k|
using SweepKey = std::tuple<std::string, std::string, double, double>;

/// §2's sweep: its algorithms (the first one is that of its tables) and every run.
struct Sweep {
  std::vector<Algo> algos;
  std::map<SweepKey, SweepCell> cells;
};

/// §5's choice of form for the kernels, which §8 repeats.
struct FormsResult {
  std::string chosen_form, why;
};

/// One check of §1: the report's MPFR truth against an instantiation of the reference library.
struct CrossCheck {
  std::string name;
  double diff;
};

/// A table over §2's grid, rows cfg.eps_list and columns cfg.knorms, cell(eps, |k|) giving each
/// entry (§2 and §3).
std::string eps_knorm_table(const Config& cfg,
                            const std::function<std::string(double eps, double kn)>& cell);

/// §1: the MPFR truth against the reference library (writes groundtruth_check.csv).
std::vector<CrossCheck> cross_check(const Config& cfg, const std::string& dir);
/// §1: where, how and from what the report was computed; `seconds` is the run time so far.
Section section_provenance(const Config& cfg, const Backends& bk, const CudaStatus& cuda,
                           const std::vector<CrossCheck>& cc, double seconds);
/// §2: eps x key norm x dtype; fills `sw` for §5 and §8.
Section section_eps_knorm(const Config& cfg, const Backends& bk, const std::string& dir, Sweep& sw);
/// §3: the exact interpolation defect, per token.
Section section_defect(const Config& cfg, const Backends& bk, const std::string& dir);
/// §4: error against sequence length.
Section section_length(const Config& cfg, const Backends& bk, const std::string& dir);
/// §5: raw vs normalised-key form, tokenwise vs chunkwise; chooses the kernels' form in `fr`.
Section section_forms(const Config& cfg, const Backends& bk, const std::string& dir,
                      const Sweep& sw, FormsResult& fr);
/// §6: stress inputs.
Section section_stress(const Config& cfg, const Backends& bk, const std::string& dir);
/// §7: contraction (Prop. 2) in finite precision, per token.
Section section_contraction(const Config& cfg, const Backends& bk, const std::string& dir);
/// §8: recommended eps per column, from §2's sweep and §5's choice.
Section section_recommendations(const Config& cfg, const Backends& bk, const Sweep& sw,
                                const FormsResult& fr);

}  // namespace kla::report
