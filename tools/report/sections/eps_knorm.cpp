// §2 of the report: the error of every column over eps x key norm, with how each storage dtype
// holds eps; its sweep (Sweep) serves §5 and §8 too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "report/problems.hpp"
#include "report/runs.hpp"
#include "report/sections/sections.hpp"

namespace kla::report {

namespace {

/// How each storage dtype holds each eps of the sweep (also written to eps_storage.csv).
std::string eps_storage_table(const Config& cfg, const std::string& dir) {
  Csv csv(dir + "/eps_storage.csv", {"eps", "dtype", "stored", "class", "rel_change"});
  std::vector<std::vector<std::string>> rows;
  for (double eps : cfg.eps_list) {
    std::vector<std::string> row{eps_str(eps)};
    for (Storage s : kStorages) {
      const double st = round_to(s, double(float(eps)));
      const std::string cls = st == 0
                                  ? (eps == 0 ? "zero" : "**flushed to 0**")
                                  : (std::fabs(st) < min_normal(s) ? "**subnormal**" : "normal");
      const double rel = eps == 0 ? 0 : std::fabs(st - eps) / eps;
      csv.row({num(eps), storage_name(s), num(st),
               st == 0 ? "zero" : (std::fabs(st) < min_normal(s) ? "subnormal" : "normal"),
               num(rel)});
      row.push_back(
          eps == 0 ? "0"
                   : fmt(st, 4) + " (" + cls +
                         (rel > 1e-3 && st != 0 ? ", " + fmt(100 * rel, 2) + "% off" : "") + ")");
    }
    rows.push_back(row);
  }
  return md_table({"eps", "as fp32", "as bf16", "as fp16"}, rows);
}

/// §2's row tag: the stabiliser and the nominal key norm of a case.
struct EpsKnorm {
  double eps, kn;
};

}  // namespace

std::string eps_knorm_table(const Config& cfg,
                            const std::function<std::string(double eps, double kn)>& cell) {
  std::vector<std::string> head{"eps \\ |k|"};
  for (double kn : cfg.knorms) head.push_back(eps_str(kn));
  std::vector<std::vector<std::string>> rows;
  for (double eps : cfg.eps_list) {
    std::vector<std::string> r{eps_str(eps)};
    for (double kn : cfg.knorms) r.push_back(cell(eps, kn));
    rows.push_back(r);
  }
  return md_table(head, rows);
}

Section section_eps_knorm(const Config& cfg, const Backends& bk, const std::string& dir,
                          Sweep& sw) {
  sw.algos = {Algo{false, 64, false}, Algo{true, 64, false}, Algo{true, 64, true}};
  // The algorithm a column's single-algorithm tables show: tokenwise/raw, or the first one it
  // runs (the arithmetic models run chunk64/raw only).
  const auto shown_algo = [&](const Backend& b) -> const Algo& {
    for (const Algo& a : sw.algos)
      if (b.supports(a)) return a;
    return sw.algos[0];
  };
  Batch<EpsKnorm> batch(bk, sw.algos);
  for (double eps : cfg.eps_list)
    for (double kn : cfg.knorms)
      // Same inputs for every eps at one key norm: the heat map's rows differ only by eps.
      batch.add(draw(around(cfg.t_sweep, cfg.dk, cfg.dv, kn),
                     mix_seed(cfg.seed, 2, std::uint64_t(kn * 1e6))),
                eps, EpsKnorm{eps, kn});
  batch.run("§2 eps x key norm x dtype", cfg.threads);

  Csv csv(dir + "/sec2_eps_knorm.csv",
          {"variant", "algo", "eps", "knorm", "rel_err", "rel_err_incl_input_rounding",
           "state_rel_err", "nonfinite", "outputs"});
  for (const auto& sp : batch.runs()) {
    const auto& s = *sp;
    SweepCell cell;
    cell.err = rel_rms(s.r.o, s.c->truth.at(s.b->storage()).o);
    cell.incl = rel_rms(s.r.o, s.c->truth_unrounded.o).rel;
    cell.state = rel_rms(s.r.state, s.c->truth.at(s.b->storage()).state).rel;
    {
      std::vector<double> rounded = s.c->truth.at(s.b->storage()).o;
      for (double& x : rounded) x = round_to(s.b->storage(), x);
      cell.floor = rel_rms(rounded, s.c->truth.at(s.b->storage()).o).rel;
    }
    sw.cells[{s.b->id(), s.a.label(), s.tag.eps, s.tag.kn}] = cell;
    csv.row({s.b->id(), s.a.label(), num(s.tag.eps), num(s.tag.kn), num(cell.err.rel),
             num(cell.incl), num(cell.state), std::to_string(cell.err.nonfinite),
             std::to_string(s.r.o.size())});
  }

  // Finding: where NaN/Inf occur, and the errors at the typical point |k| = 1, eps = 1e-6.
  std::vector<std::string> bad;
  for (const auto& b : bk) {
    int n = 0, tot = 0;
    double max_eps = -1, max_kn = -1;
    std::set<std::string> algos;
    for (const auto& [key, cell] : sw.cells) {
      if (std::get<0>(key) != b->id()) continue;
      ++tot;
      if (cell.err.nonfinite) {
        ++n;
        max_eps = std::max(max_eps, std::get<2>(key));
        max_kn = std::max(max_kn, std::get<3>(key));
        algos.insert(std::get<1>(key));
      }
    }
    if (n)
      bad.push_back(b->id() + " (" + std::to_string(n) + " of " + std::to_string(tot) +
                    " runs, all with eps <= " + eps_str(max_eps) +
                    " and |k| <= " + eps_str(max_kn) + ", in " +
                    join(std::vector<std::string>(algos.begin(), algos.end()), ", ") + ")");
  }
  // Finite but useless results (relative error above 10%), e.g. beta = 0 after |k|^2 underflows.
  std::vector<std::string> big;
  for (const auto& b : bk) {
    int n = 0;
    double max_eps = -1, max_kn = -1;
    for (const auto& [key, cell] : sw.cells)
      if (std::get<0>(key) == b->id() && !cell.err.nonfinite && cell.err.rel > 0.1) {
        ++n;
        max_eps = std::max(max_eps, std::get<2>(key));
        max_kn = std::max(max_kn, std::get<3>(key));
      }
    if (n)
      big.push_back(b->id() + " (" + std::to_string(n) + " runs, eps <= " + eps_str(max_eps) +
                    ", |k| <= " + eps_str(max_kn) + ")");
  }
  std::vector<std::string> typical;
  const double eps_typ = 1e-6;
  for (const auto& b : bk) {
    auto it = sw.cells.find({b->id(), sw.algos[0].label(), eps_typ, 1.0});
    if (it != sw.cells.end()) typical.push_back(b->id() + " " + fmt(it->second.err.rel));
  }
  // The kernel columns against the CPU columns that model them (same storage, fp32 arithmetic):
  // the final state, which the kernels keep in fp32, isolates the arithmetic; their output is
  // written in the storage dtype, so it is set against the error of rounding the exact output.
  std::vector<std::string> kern, kern_out;
  for (const auto& b : bk) {
    const Backend* m = model_of(bk, *b);
    if (!m) continue;
    std::vector<std::string> per_algo;
    for (const Algo& a : sw.algos) {
      if (!b->supports(a) || !m->supports(a)) continue;
      std::vector<double> ratios;
      for (double eps : cfg.eps_list)
        for (double kn : cfg.knorms) {
          const auto x = sw.cells.find({b->id(), a.label(), eps, kn});
          const auto y = sw.cells.find({m->id(), a.label(), eps, kn});
          if (x == sw.cells.end() || y == sw.cells.end()) continue;
          const double rx = x->second.state, ry = y->second.state;
          if (rx > 0 && ry > 0 && std::isfinite(rx) && std::isfinite(ry)) ratios.push_back(rx / ry);
        }
      per_algo.push_back(b->algo_name(a) + " " + fmt(geomean(ratios)) + "x");
    }
    kern.push_back(b->id() + " vs " + m->id() + ": " + join(per_algo, ", "));
    auto it = sw.cells.find({b->id(), sw.algos[0].label(), eps_typ, 1.0});
    if (it != sw.cells.end())
      kern_out.push_back(b->id() + " " + fmt(it->second.err.rel) + " (rounding alone " +
                         fmt(it->second.floor) + ")");
  }
  Section sec;
  sec.title = "2. eps x key norm x dtype";
  sec.finding =
      (bad.empty() ? std::string("No combination of eps and key norm produced NaN/Inf")
                   : "NaN/Inf occur only in " + join(bad, "; ")) +
      (big.empty() ? std::string("; no finite result is off by more than 10%")
                   : "; finite results off by more than 10% occur in " + join(big, "; ")) +
      "; at |k| = 1 and eps = 1e-6 the tokenwise relative RMS output error is " +
      join(typical, ", ") + "." +
      (kern.empty()
           ? std::string()
           : " The CUDA kernels' final-state error, divided by that of the CPU column with the "
             "same inputs and fp32 arithmetic (geometric mean over the sweep's cells), is " +
                 join(kern, "; ") +
                 "; their outputs are written in the storage dtype, so their output error at "
                 "|k| = 1, eps = 1e-6 compares with that of rounding the exact output to it: " +
                 join(kern_out, ", ") + ".");
  std::ostringstream os;
  os << "Each cell runs " << cfg.t_sweep << " tokens, dk = " << cfg.dk << ", dv = " << cfg.dv
     << ", key norms log-uniform within a factor sqrt(2) of the nominal |k|, eta uniform in [0.1, "
        "1], "
        "alpha uniform in [0.98, 1]. Error = relative RMS of all outputs against the MPFR truth on "
        "the same rounded inputs (eps taken as the float value asked for; a dtype that stores eps "
        "differently pays for it as error). NaN/Inf = number of non-finite outputs. Full data, "
        "including chunkwise orders, the final-state error and the error including input rounding: "
        "`sec2_eps_knorm.csv`.\n\n";
  os << "How each dtype stores eps (the emulated columns compute beta in that dtype; the fp32 and "
        "*-store columns keep eps in fp32, as the kernels do):\n\n"
     << eps_storage_table(cfg, dir) << "\n";
  {
    // The two errors side by side at the typical point: the second one adds the input rounding.
    // With kernel columns, a last column: the exact output rounded to the storage dtype, the
    // floor of any column that writes o in that dtype (the CUDA columns do).
    const bool floor_col = has_kernels(bk);
    std::vector<std::vector<std::string>> rows;
    for (const auto& b : bk) {
      const Algo& a = shown_algo(*b);
      const SweepCell& c = sw.cells.at({b->id(), a.label(), eps_typ, 1.0});
      rows.push_back({b->id() + (a.label() == sw.algos[0].label() ? "" : " (" + a.label() + ")"),
                      fmt(c.err.rel), fmt(c.incl), fmt(c.state)});
      if (floor_col) rows.back().push_back(fmt(c.floor));
    }
    std::vector<std::string> head{"column", "arithmetic only (vs truth on rounded inputs)",
                                  "including input rounding (vs truth on fp64 inputs)",
                                  "final state"};
    if (floor_col) head.push_back("exact output rounded to the storage dtype");
    os << "Error with and without input rounding (tokenwise/raw, |k| = 1, eps = 1e-6):\n\n"
       << md_table(head, rows) << "\n";
  }
  os << image("sec2_heatmap.png",
              "relative error heat maps, eps x key norm, per column and algorithm");
  for (const auto& b : bk) {
    const Algo& a = shown_algo(*b);
    os << "**" << b->id() << "**, " << b->algo_name(a)
       << ", relative RMS error (rows eps, columns |k|):\n\n";
    os << eps_knorm_table(cfg, [&](double eps, double kn) {
      const SweepCell& c = sw.cells.at({b->id(), a.label(), eps, kn});
      return c.err.nonfinite ? "NaN/Inf x" + std::to_string(c.err.nonfinite) : fmt(c.err.rel);
    }) << "\n";
  }
  sec.body = os.str();
  return sec;
}

}  // namespace kla::report
