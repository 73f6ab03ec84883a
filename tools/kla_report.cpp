// kla_report: the precision / eps sensitivity report (the project's main job, issue 4).
//
// Computes, for every column (backend x dtype variant), the error of KLA against a 134-bit MPFR
// ground truth run on the *same* storage-rounded inputs (so input rounding is excluded; the
// error including it is reported separately), and writes docs/report/: report.md, one CSV per
// section and PNG plots (tools/plot_report.py). Every section opens with a finding computed
// from the numbers. Exit status: 0 on success, 1 on a failure while computing, 2 on bad usage
// (nothing written).
#include <mpfr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <Eigen/Core>

#include "kla/version.hpp"
#include "report/cli.hpp"
#include "report/common.hpp"
#include "report/util.hpp"

namespace fs = std::filesystem;
using namespace kla::report;

namespace {

// ---- configuration ----------------------------------------------------------------------------

// ---- problems ---------------------------------------------------------------------------------

/// How a problem's inputs are drawn. Key directions are Gaussian (or correlated with one shared
/// direction), key norms log-uniform in [knorm_lo, knorm_hi], v ~ N(0,1), q a unit vector (the
/// read-out is o = Sᵀq with scale 1, i.e. the paper's l2-normalised query without the rounding
/// of 1/‖q‖), η uniform in [eta_lo, eta_hi], α uniform in [alpha_lo, alpha_hi] (none if
/// alpha_lo == 1 == alpha_hi).
struct Draw {
  int T = 256, dk = 16, dv = 16;
  double knorm_lo = 1, knorm_hi = 1;
  double eta_lo = 0.1, eta_hi = 1.0;
  double alpha_lo = 0.98, alpha_hi = 1.0;
  double correlation = 0;  ///< weight of the shared key direction (0 = independent keys)
};

/// Section 4's settings: decay range and eta range.
struct Decay {
  std::string name;
  double lo, hi, eta_lo, eta_hi;
};
const std::vector<Decay> kDecays = {{"none", 1.0, 1.0, 0.1, 1.0},
                                    {"alpha~0.99", 0.98, 1.0, 0.1, 1.0},
                                    {"strong (alpha in [0.5,0.9])", 0.5, 0.9, 0.1, 1.0},
                                    {"none, small eta (in [1e-3,1e-2])", 1.0, 1.0, 1e-3, 1e-2}};

Problem draw(const Draw& d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> N(0, 1);
  std::uniform_real_distribution<double> U(0, 1);
  Problem p;
  p.T = d.T;
  p.dk = d.dk;
  p.dv = d.dv;
  std::vector<double> shared(size_t(d.dk));
  for (double& x : shared) x = N(rng);
  auto unit = [&](std::vector<double>& x) {
    double n = 0;
    for (double y : x) n += y * y;
    n = std::sqrt(n);
    for (double& y : x) y /= n;
  };
  unit(shared);
  std::vector<double> dir(size_t(d.dk));
  for (int t = 0; t < d.T; ++t) {
    for (int i = 0; i < d.dk; ++i) dir[i] = N(rng) / std::sqrt(double(d.dk));
    for (int i = 0; i < d.dk; ++i) dir[i] += d.correlation * shared[i];
    unit(dir);
    const double norm =
        d.knorm_lo * std::exp(std::log(d.knorm_hi / d.knorm_lo) * U(rng));  // log-uniform
    for (int i = 0; i < d.dk; ++i) p.k.push_back(dir[i] * norm);
    for (int i = 0; i < d.dk; ++i) dir[i] = N(rng);
    unit(dir);
    for (int i = 0; i < d.dk; ++i) p.q.push_back(dir[i]);
    for (int j = 0; j < d.dv; ++j) p.v.push_back(N(rng));
    p.eta.push_back(d.eta_lo + (d.eta_hi - d.eta_lo) * U(rng));
    if (!(d.alpha_lo == 1.0 && d.alpha_hi == 1.0))
      p.alpha.push_back(d.alpha_lo + (d.alpha_hi - d.alpha_lo) * U(rng));
  }
  return p;
}

/// Draw around a nominal key norm: log-uniform within a factor sqrt(2) either side.
Draw around(int T, int dk, int dv, double knorm) {
  Draw d;
  d.T = T;
  d.dk = dk;
  d.dv = dv;
  d.knorm_lo = knorm / std::sqrt(2.0);
  d.knorm_hi = knorm * std::sqrt(2.0);
  return d;
}

// ---- runs -------------------------------------------------------------------------------------

using Backends = std::vector<std::unique_ptr<Backend>>;

/// The columns that expose a per-token trace (the per-token sections 3 and 7 use these).
std::vector<const Backend*> traced(const Backends& bk) {
  std::vector<const Backend*> out;
  for (const auto& b : bk)
    if (b->has_trace()) out.push_back(b.get());
  return out;
}

/// The CPU column that models kernel column `b` (Backend::model_id), or nullptr.
const Backend* model_of(const Backends& bk, const Backend& b) {
  if (b.model_id().empty()) return nullptr;
  for (const auto& c : bk)
    if (c->id() == b.model_id()) return c.get();
  return nullptr;
}

/// Whether any column is a kernel column (one with a CPU model): the CUDA columns.
bool has_kernels(const Backends& bk) {
  for (const auto& b : bk)
    if (!b->model_id().empty()) return true;
  return false;
}
const std::vector<Storage> kStorages = {Storage::fp32, Storage::bf16, Storage::fp16};

/// One problem in every storage dtype, with its ground truths: truth[s] on the inputs rounded
/// to s, and `exact_inputs` on the unrounded (fp64) inputs for the error including rounding.
struct Case {
  Problem raw;
  std::map<Storage, Problem> stored;
  std::map<Storage, RunResult> truth;
  RunResult truth_unrounded;
  double eps = 0;
};

/// A unit of work: a ground truth (backend == nullptr) or a backend run.
struct Job {
  Case* c;
  Storage s;  // which truth when backend == nullptr (fp64 = the unrounded inputs)
  const Backend* backend;
  Algo algo;
  RunResult* out;
  double cost;
};

double job_cost(const Problem& p, const Backend* b, const Algo& a) {
  const double base = double(p.T) * p.dk * p.dv;
  if (!b) return base * 12;  // MPFR ~12x the cost of an emulated op
  const double dtype = b->unit_roundoff() > 1e-5 ? 3.0 : 0.5;
  return base * dtype * (a.chunked ? 1.5 + a.chunk / 32.0 : 1.0);
}

void run_jobs(std::vector<Job>& jobs, const std::string& label, int threads) {
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const Job& a, const Job& b) { return a.cost > b.cost; });
  double total = 0;
  for (const Job& j : jobs) total += j.cost;
  Progress prog(label, total);
  parallel_for(jobs.size(), threads, [&](size_t i) {
    Job& j = jobs[i];
    if (!j.backend)
      *j.out = truth_forward(j.s == Storage::fp64 ? j.c->raw : j.c->stored.at(j.s), j.c->eps);
    else
      *j.out = j.backend->run(j.c->stored.at(j.backend->storage()), j.c->eps, j.algo);
    prog.add(j.cost);
  });
  prog.finish();
}

/// Prepares a case: rounds the inputs and queues its truths.
void add_case(Case& c, std::vector<Job>& jobs) {
  for (Storage s : kStorages) {
    c.stored[s] = c.raw.rounded(s);
    jobs.push_back({&c, s, nullptr, {}, &c.truth[s], job_cost(c.raw, nullptr, {})});
  }
  jobs.push_back(
      {&c, Storage::fp64, nullptr, {}, &c.truth_unrounded, job_cost(c.raw, nullptr, {})});
}

/// One column's run of one case: which case, backend and algorithm, a tag naming the case's row
/// in its section (decay, key family, ...), and the result.
template <class Tag>
struct Run {
  const Case* c;
  const Backend* b;
  Algo a;
  Tag tag;
  RunResult r;
};
/// Queues case c on every backend for every algorithm it supports, one Run each.
template <class Tag>
void queue_runs(Case& c, const Backends& bk, const std::vector<Algo>& algos, const Tag& tag,
                std::vector<std::unique_ptr<Run<Tag>>>& runs, std::vector<Job>& jobs) {
  for (const auto& b : bk)
    for (const Algo& a : algos) {
      if (!b->supports(a)) continue;
      runs.push_back(std::make_unique<Run<Tag>>(Run<Tag>{&c, b.get(), a, tag, {}}));
      jobs.push_back({&c, b->storage(), b.get(), a, &runs.back()->r, job_cost(c.raw, b.get(), a)});
    }
}

// ---- report assembly --------------------------------------------------------------------------

struct Section {
  std::string title, finding, body;
};

/// A Markdown table cell: a bare '|' (as in |k|) would end the cell, so it is escaped.
std::string md_cell(const std::string& c) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == '|' && (i == 0 || c[i - 1] != '\\')) out += '\\';
    out += c[i];
  }
  return out;
}

std::string md_table(const std::vector<std::string>& head,
                     const std::vector<std::vector<std::string>>& rows) {
  std::ostringstream os;
  os << "|";
  for (const auto& h : head) os << " " << md_cell(h) << " |";
  os << "\n|";
  for (size_t i = 0; i < head.size(); ++i) os << (i ? "---:|" : "---|");
  os << "\n";
  for (const auto& r : rows) {
    os << "|";
    for (const auto& c : r) os << " " << md_cell(c) << " |";
    os << "\n";
  }
  return os.str();
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

double geomean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / double(v.size()));
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string image(const std::string& png, const std::string& alt) {
  return "![" + alt + "](" + png + ")\n\n";
}

// ---- §2 eps x key norm x dtype ----------------------------------------------------------------

struct Cell {
  ErrorStat err;
  double incl = 0, state = 0;
  double floor = 0;  ///< error of the exact output rounded to the column's storage dtype
};
using SweepKey = std::tuple<std::string, std::string, double, double>;  // variant, algo, eps, |k|

struct Sweep {
  std::vector<Algo> algos;
  std::map<SweepKey, Cell> cells;
};

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

Section section2(const Config& cfg, const Backends& bk, const std::string& dir, Sweep& sw) {
  sw.algos = {Algo{false, 64, false}, Algo{true, 64, false}, Algo{true, 64, true}};
  std::vector<std::unique_ptr<Case>> cases;
  std::vector<Job> jobs;
  std::vector<std::unique_ptr<Run<EpsKnorm>>> slots;
  for (double eps : cfg.eps_list)
    for (double kn : cfg.knorms) {
      auto c = std::make_unique<Case>();
      // Same inputs for every eps at one key norm: the heat map's rows differ only by eps.
      c->raw = draw(around(cfg.t_sweep, cfg.dk, cfg.dv, kn),
                    mix_seed(cfg.seed, 2, std::uint64_t(kn * 1e6)));
      c->eps = eps;
      add_case(*c, jobs);
      queue_runs(*c, bk, sw.algos, EpsKnorm{eps, kn}, slots, jobs);
      cases.push_back(std::move(c));
    }
  run_jobs(jobs, "§2 eps x key norm x dtype", cfg.threads);

  Csv csv(dir + "/sec2_eps_knorm.csv",
          {"variant", "algo", "eps", "knorm", "rel_err", "rel_err_incl_input_rounding",
           "state_rel_err", "nonfinite", "outputs"});
  for (const auto& sp : slots) {
    const auto& s = *sp;
    Cell cell;
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
      const Cell& c = sw.cells.at({b->id(), sw.algos[0].label(), eps_typ, 1.0});
      rows.push_back({b->id(), fmt(c.err.rel), fmt(c.incl), fmt(c.state)});
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
    os << "**" << b->id() << "**, " << b->algo_name(sw.algos[0])
       << ", relative RMS error (rows eps, columns |k|):\n\n";
    std::vector<std::string> head{"eps \\ |k|"};
    for (double kn : cfg.knorms) head.push_back(eps_str(kn));
    std::vector<std::vector<std::string>> rows;
    for (double eps : cfg.eps_list) {
      std::vector<std::string> r{eps_str(eps)};
      for (double kn : cfg.knorms) {
        const Cell& c = sw.cells.at({b->id(), sw.algos[0].label(), eps, kn});
        r.push_back(c.err.nonfinite ? "NaN/Inf x" + std::to_string(c.err.nonfinite)
                                    : fmt(c.err.rel));
      }
      rows.push_back(r);
    }
    os << md_table(head, rows) << "\n";
  }
  sec.body = os.str();
  return sec;
}

/// The columns' notes on how their per-token traces are obtained (once each), and which columns
/// the per-token sections leave out for want of one.
std::string trace_notes(const Backends& bk) {
  std::string out;
  std::set<std::string> seen;
  std::vector<std::string> none;
  for (const auto& b : bk) {
    if (!b->has_trace()) none.push_back(b->id());
    const std::string n = b->has_trace() ? b->trace_note() : "";
    if (!n.empty() && seen.insert(n).second) out += n + "\n\n";
  }
  if (!none.empty()) out += "Left out (no per-token state exposed): " + join(none, ", ") + ".\n\n";
  return out;
}

// ---- §3 exact interpolation defect ------------------------------------------------------------

Section section3(const Config& cfg, const Backends& bk, const std::string& dir) {
  struct Item {
    const Backend* b;  // nullptr = exact rational step
    double eps, kn;
    double med = 0, max = 0, weight = 0;
    long tokens = 0, nonfinite = 0;
  };
  const std::vector<const Backend*> cols = traced(bk);
  std::vector<Item> items;
  for (double eps : cfg.eps_list)
    for (double kn : cfg.knorms) {
      items.push_back({nullptr, eps, kn});
      for (const Backend* b : cols) items.push_back({b, eps, kn});
    }
  Progress prog("§3 interpolation defect (exact)", double(items.size()));
  parallel_for(items.size(), cfg.threads, [&](size_t i) {
    Item& it = items[i];
    Draw d = around(cfg.t_defect, cfg.dk, cfg.dv, it.kn);
    d.eta_lo = d.eta_hi = 1.0;  // η = 1: the read-back formula of the brief
    const Problem raw = draw(d, mix_seed(cfg.seed, 3, std::uint64_t(it.kn * 1e6)));
    const Backend* tb = it.b ? it.b : bk.front().get();  // exact check starts from fp32 states
    const Problem p = raw.rounded(tb->storage());
    const auto tr = tb->trace(p, it.eps);
    if (!tr) throw std::logic_error(tb->id() + " declined the trace it offers");
    std::vector<double> defects, weights;
    for (int t = 0; t < p.T; ++t) {
      const auto& rec = (*tr)[size_t(t)];
      ++it.tokens;
      const bool finite = std::all_of(rec.state.begin(), rec.state.end(),
                                      [](double x) { return std::isfinite(x); }) &&
                          std::all_of(rec.decayed.begin(), rec.decayed.end(),
                                      [](double x) { return std::isfinite(x); });
      if (!finite) {
        ++it.nonfinite;
        defects.push_back(INFINITY);
        continue;
      }
      double w = 0;
      defects.push_back(interpolation_defect(
          rec.decayed.data(), rec.state.data(), &p.k[size_t(t) * p.dk], &p.v[size_t(t) * p.dv],
          p.eta[t], double(float(it.eps)), p.dk, p.dv, w, it.b == nullptr));
      weights.push_back(w);
    }
    it.med = median(defects);
    it.max = *std::max_element(defects.begin(), defects.end());
    it.weight = median(weights);
    prog.add(1);
  });
  prog.finish();

  Csv csv(dir + "/sec3_defect.csv", {"variant", "eps", "knorm", "tokens", "median_defect",
                                     "max_defect", "eps_weight", "nonfinite"});
  long exact_tokens = 0, exact_bad = 0;
  std::map<std::string, const Item*> worst;
  for (const Item& it : items) {
    const std::string id = it.b ? it.b->id() : "exact";
    csv.row({id, num(it.eps), num(it.kn), std::to_string(it.tokens), num(it.med), num(it.max),
             num(it.weight), std::to_string(it.nonfinite)});
    if (!it.b) {
      exact_tokens += it.tokens;
      exact_bad += it.max != 0 ? 1 : 0;
      continue;
    }
    auto& w = worst[id];
    if (!w || !(it.max <= w->max)) w = &it;
  }
  std::vector<std::string> parts;
  for (const Backend* b : cols) {
    const Item* w = worst[b->id()];
    // Median over the sweep of the per-cell maxima: the typical strays, not just the worst cell.
    std::vector<double> maxima;
    for (const Item& it : items)
      if (it.b == b) maxima.push_back(it.max);
    parts.push_back(b->id() + " typically " + fmt(median(maxima)) + ", at worst " +
                    (std::isfinite(w->max) ? fmt(w->max) : std::string("NaN/Inf")) +
                    " (eps = " + eps_str(w->eps) + ", |k| = " + eps_str(w->kn) + ")");
  }
  Section sec;
  sec.title = "3. The exact interpolation defect";
  sec.finding =
      (exact_bad == 0
           ? "Exact rational arithmetic reproduces the read-back formula with zero defect on all " +
                 std::to_string(exact_tokens) + " tokens"
           : "WARNING: exact arithmetic missed the formula in " + std::to_string(exact_bad) +
                 " cells (a reference bug)") +
      "; the rounded columns stray from it by (relative, per token) " + join(parts, "; ") + ".";
  std::ostringstream os;
  os << "With eta = 1, writing (k, v) and reading back the same key returns, exactly,\n\n"
        "    S_t^T k = |k|^2/(|k|^2+eps) v + eps/(|k|^2+eps) S~^T k\n\n"
        "(for general eta: w v + (1 - w) S~^T k with w = eta |k|^2/(|k|^2+eps)). So eps does not "
        "merely "
        "guard a division: it interpolates the write between the new value and what the state "
        "already "
        "held, with weight eps/(|k|^2+eps) on the old read-out. The `eps_weight` column of "
        "`sec3_defect.csv` gives that weight; it exceeds 1% as soon as |k| < 10 sqrt(eps).\n\n"
        "Method: each column runs "
     << cfg.t_defect << " tokens (dk = " << cfg.dk << ", dv = " << cfg.dv
     << ", eta = 1, alpha in [0.98, 1]) tokenwise in its own arithmetic; for every token its S~ "
        "and "
        "S_t are converted exactly to rationals and the defect |S_t^T k - formula| / |formula| is "
        "evaluated exactly (formula with the intended eps, so a dtype that stores eps as 0 or as a "
        "subnormal is charged for it). The `exact` row runs the step itself in rationals from the "
        "same "
        "S~ and must give 0.\n\n";
  os << trace_notes(bk);
  os << image("sec3_defect.png", "interpolation defect per column against key norm");
  for (const Backend* b : cols) {
    std::vector<std::string> head{"eps \\ |k|"};
    for (double kn : cfg.knorms) head.push_back(eps_str(kn));
    std::vector<std::vector<std::string>> rows;
    for (double eps : cfg.eps_list) {
      std::vector<std::string> r{eps_str(eps)};
      for (double kn : cfg.knorms)
        for (const Item& it : items)
          if (it.b == b && it.eps == eps && it.kn == kn) r.push_back(fmt(it.max));
      rows.push_back(r);
    }
    os << "**" << b->id() << "**, largest per-token defect:\n\n" << md_table(head, rows) << "\n";
  }
  sec.body = os.str();
  return sec;
}

// ---- §4 error against sequence length -----------------------------------------------------------

Section section4(const Config& cfg, const Backends& bk, const std::string& dir) {
  std::vector<int> lengths;
  for (long T = 64; T < cfg.max_len; T *= 4) lengths.push_back(int(T));
  lengths.push_back(cfg.max_len);
  const std::vector<Algo> algos = {Algo{false, 64, false}, Algo{true, 64, false}};
  const double eps = 1e-6;
  std::vector<std::unique_ptr<Case>> cases;
  std::vector<Job> jobs;
  std::vector<std::unique_ptr<Run<std::string>>> slots;
  for (size_t di = 0; di < kDecays.size(); ++di) {
    auto c = std::make_unique<Case>();
    Draw d;
    d.T = cfg.max_len;
    d.dk = d.dv = cfg.long_dim;
    d.knorm_lo = 0.5;
    d.knorm_hi = 2;
    d.alpha_lo = kDecays[di].lo;
    d.alpha_hi = kDecays[di].hi;
    d.eta_lo = kDecays[di].eta_lo;
    d.eta_hi = kDecays[di].eta_hi;
    c->raw = draw(d, mix_seed(cfg.seed, 4, di));
    c->eps = eps;
    add_case(*c, jobs);
    queue_runs(*c, bk, algos, std::string(kDecays[di].name), slots, jobs);
    cases.push_back(std::move(c));
  }
  run_jobs(jobs, "§4 error vs sequence length", cfg.threads);

  // A causal run's first T outputs are those of a run of length T (chunk boundaries at multiples
  // of 64 align too), so one long run per column gives every length as a prefix.
  Csv csv(dir + "/sec4_length.csv", {"variant", "algo", "decay", "T", "rel_err",
                                     "rel_err_incl_input_rounding", "nonfinite", "unit_roundoff"});
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<double>> curves;
  for (const auto& sp : slots)
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

// ---- §5 raw vs normalised, tokenwise vs chunkwise ----------------------------------------------

struct FormsResult {
  std::string chosen_form, why;
};

Section section5(const Config& cfg, const Backends& bk, const std::string& dir, const Sweep& sw,
                 FormsResult& fr) {
  struct Family {
    std::string name;
    double lo, hi, corr;
  };
  const std::vector<Family> fams = {{"typical (|k| in [0.5,2])", 0.5, 2, 0},
                                    {"wide norms (|k| in [1e-2,1e2])", 1e-2, 1e2, 0},
                                    {"wide norms + correlated keys", 1e-2, 1e2, 3.0}};
  std::vector<Algo> algos;
  for (bool norm : {false, true}) {
    algos.push_back({false, 64, norm});
    for (int C : cfg.chunks) algos.push_back({true, C, norm});
  }
  std::vector<std::unique_ptr<Case>> cases;
  std::vector<Job> jobs;
  std::vector<std::unique_ptr<Run<std::string>>> slots;
  for (size_t fi = 0; fi < fams.size(); ++fi) {
    auto c = std::make_unique<Case>();
    Draw d;
    d.T = cfg.t_forms;
    d.dk = cfg.dk;
    d.dv = cfg.dv;
    d.knorm_lo = fams[fi].lo;
    d.knorm_hi = fams[fi].hi;
    d.correlation = fams[fi].corr;
    c->raw = draw(d, mix_seed(cfg.seed, 5, fi));
    c->eps = 1e-6;
    add_case(*c, jobs);
    queue_runs(*c, bk, algos, std::string(fams[fi].name), slots, jobs);
    cases.push_back(std::move(c));
  }
  run_jobs(jobs, "§5 forms and orders", cfg.threads);

  Csv csv(dir + "/sec5_forms.csv",
          {"variant", "family", "form", "order", "chunk", "rel_err", "nonfinite"});
  std::map<std::tuple<std::string, std::string, std::string>, ErrorStat>
      err;  // variant, family, algo
  for (const auto& sp : slots) {
    const auto& s = *sp;
    const ErrorStat e = rel_rms(s.r.o, s.c->truth.at(s.b->storage()).o);
    err[{s.b->id(), s.tag, s.a.label()}] = e;
    csv.row({s.b->id(), s.tag, s.a.normalized ? "normalized" : "raw",
             s.a.chunked ? "chunkwise" : "tokenwise", s.a.chunked ? std::to_string(s.a.chunk) : "1",
             num(e.rel), std::to_string(e.nonfinite)});
  }
  // Ratio raw/normalised per column, geometric mean over families and orders; NaN runs count as
  // a factor 1e3 against the form that produced them.
  auto ratio = [](const ErrorStat& a, const ErrorStat& b) {
    const double x = a.nonfinite ? 1e3 : a.rel, y = b.nonfinite ? 1e3 : b.rel;
    return (x > 0 && y > 0) ? x / y : 1.0;
  };
  std::vector<std::string> form_parts, order_parts;
  std::vector<std::vector<std::string>> rows;
  std::vector<double> kernel_ratios;  // the columns that model a kernel (fp32 state)
  const int mid_chunk = cfg.chunks[cfg.chunks.size() / 2];
  // A kernel column runs only its own form and chunk size: its ratios use the pairs it ran.
  std::set<std::string> kernel_ids;
  for (const auto& b : bk) {
    if (!b->model_id().empty()) kernel_ids.insert(b->id());
    std::vector<double> rf, ro;
    for (const auto& f : fams) {
      for (const Algo& a : algos) {
        if (a.normalized) continue;
        Algo n = a;
        n.normalized = true;
        if (b->supports(a) && b->supports(n))
          rf.push_back(
              ratio(err.at({b->id(), f.name, a.label()}), err.at({b->id(), f.name, n.label()})));
      }
      for (bool norm : {false, true}) {
        const Algo ch{true, mid_chunk, norm}, tw{false, 64, norm};
        if (b->supports(ch) && b->supports(tw))
          ro.push_back(
              ratio(err.at({b->id(), f.name, ch.label()}), err.at({b->id(), f.name, tw.label()})));
      }
    }
    const double gf = geomean(rf), go = geomean(ro);
    if (!rf.empty()) form_parts.push_back(b->id() + " " + fmt(gf) + "x");
    if (!ro.empty()) order_parts.push_back(b->id() + " " + fmt(go) + "x");
    // The CPU columns with fp32 state model the kernels' arithmetic; the kernel columns have a
    // fixed form and take no part in the choice.
    if (b->dtypes().state == "fp32" && b->model_id().empty() && !rf.empty())
      kernel_ratios.push_back(gf);
    for (const auto& f : fams) {
      std::vector<std::string> r{b->id(), f.name};
      for (const Algo& a : algos) {
        if (!b->supports(a)) {
          r.push_back("n/a");
          continue;
        }
        const ErrorStat& e = err.at({b->id(), f.name, a.label()});
        r.push_back(e.nonfinite ? "NaN/Inf" : fmt(e.rel));
      }
      rows.push_back(r);
    }
  }
  // The choice: accuracy first (a factor 1.25 either way decides); when the forms are equally
  // accurate, robustness (NaN/Inf runs of section 2's chunk64 runs, any column); then cost (raw
  // saves a square root and two divisions per token).
  const double kr = geomean(kernel_ratios);
  int nan_raw = 0, nan_norm = 0;
  for (const auto& [key, c] : sw.cells) {
    if (!c.err.nonfinite || kernel_ids.count(std::get<0>(key))) continue;
    if (std::get<1>(key) == Algo{true, 64, false}.label()) ++nan_raw;
    if (std::get<1>(key) == Algo{true, 64, true}.label()) ++nan_norm;
  }
  std::string why;
  if (kr > 1.25) {
    fr.chosen_form = "normalised-key";
    why = "it is " + fmt(kr) + "x more accurate in the kernel-like columns";
  } else if (kr < 0.8) {
    fr.chosen_form = "raw";
    why = "it is " + fmt(1 / kr) + "x more accurate in the kernel-like columns";
  } else if (nan_norm < nan_raw) {
    fr.chosen_form = "normalised-key";
    why =
        "the forms are equally accurate (within 25%) in the kernel-like columns, and the "
        "normalised form had " +
        std::to_string(nan_norm) + " NaN/Inf runs in section 2 against " + std::to_string(nan_raw) +
        " for the raw form (beta = eta/(|k|^2+eps) overflows in fp16; k/r does not)";
  } else {
    fr.chosen_form = "raw";
    why =
        "the forms are equally accurate (within 25%) and equally robust, and the raw form is "
        "cheaper";
  }
  fr.why = why;
  Section sec;
  sec.title = "5. Raw vs normalised-key form, tokenwise vs chunkwise";
  sec.finding =
      "Error of the raw form divided by that of the normalised-key form (geometric mean over key "
      "families and orders; > 1 means normalised is more accurate): " +
      join(form_parts, ", ") + "; the kernels should use the " + fr.chosen_form + " form because " +
      fr.why + ". Chunkwise (C=" + std::to_string(mid_chunk) +
      ") error divided by tokenwise error: " + join(order_parts, ", ") + ".";
  std::ostringstream os;
  os << "Three key families, " << cfg.t_forms << " tokens each, dk = " << cfg.dk
     << ", dv = " << cfg.dv
     << ", eps = 1e-6, eta in [0.1, 1], alpha in [0.98, 1]. In the raw form the chunk matrix "
        "B(A^- o K K^T) has entries eta (|k_j|/|k_i|) cos(theta_ij), unbounded when key norms "
        "spread; in "
        "the normalised form (k^ = k/r, v^ = v/r, r = sqrt(|k|^2+eps), beta = eta) they are "
        "bounded by "
        "eta, at the price of one square root and two divisions per token. Relative RMS output "
        "error:\n\n";
  if (has_kernels(bk))
    os << "The CUDA columns run the kernels as they are: tokenwise/raw is kla_tokenwise_forward "
          "and chunk64/raw is kla_chunk_forward (chunks of 64, fixed), both given the raw keys "
          "with the Kaczmarz coefficient, so the form they compute in is the kernels' own "
          "(docs/api.md). Their other cells are n/a, and they take no part in the choice of form "
          "above.\n\n";
  os << image("sec5_forms.png", "raw vs normalised, tokenwise vs chunkwise, per chunk size");
  std::vector<std::string> head{"column", "keys"};
  for (const Algo& a : algos) head.push_back(a.label());
  os << md_table(head, rows) << "\n";
  sec.body = os.str();
  return sec;
}

// ---- §6 stress inputs --------------------------------------------------------------------------

Section section6(const Config& cfg, const Backends& bk, const std::string& dir) {
  struct Stress {
    std::string name;
    double eps;
    std::function<void(Problem&, std::mt19937_64&)> apply;
  };
  auto scale_keys = [](Problem& p, int t, double f) {
    for (int i = 0; i < p.dk; ++i) p.k[size_t(t) * p.dk + i] *= f;
  };
  auto knorm = [](const Problem& p, int t) {
    double n = 0;
    for (int i = 0; i < p.dk; ++i) n += p.k[size_t(t) * p.dk + i] * p.k[size_t(t) * p.dk + i];
    return std::sqrt(n);
  };
  const std::vector<Stress> stresses = {
      {"baseline", 1e-6, [](Problem&, std::mt19937_64&) {}},
      {"key outliers (1% of |k| x 1e3)", 1e-6,
       [&](Problem& p, std::mt19937_64& r) {
         for (int t = 0; t < p.T; ++t)
           if (r() % 100 == 0) scale_keys(p, t, 1e3);
       }},
      {"value outliers (1% of v x 1e3)", 1e-6,
       [](Problem& p, std::mt19937_64& r) {
         for (int t = 0; t < p.T; ++t)
           if (r() % 100 == 0)
             for (int j = 0; j < p.dv; ++j) p.v[size_t(t) * p.dv + j] *= 1e3;
       }},
      {"near-zero keys (10% with |k| = 1e-6)", 1e-6,
       [&](Problem& p, std::mt19937_64& r) {
         for (int t = 0; t < p.T; ++t)
           if (r() % 10 == 0) scale_keys(p, t, 1e-6 / knorm(p, t));
       }},
      {"zero keys (10% with k = 0), eps = 0", 0.0,
       [&](Problem& p, std::mt19937_64& r) {
         for (int t = 0; t < p.T; ++t)
           if (r() % 10 == 0) scale_keys(p, t, 0.0);
       }},
      {"repeated keys (runs of 16)", 1e-6,
       [](Problem& p, std::mt19937_64&) {
         for (int t = 0; t < p.T; ++t)
           for (int i = 0; i < p.dk; ++i)
             p.k[size_t(t) * p.dk + i] = p.k[size_t(t - t % 16) * p.dk + i];
       }},
      {"colinear keys (k_t = c_t k_0)", 1e-6,
       [](Problem& p, std::mt19937_64& r) {
         std::uniform_real_distribution<double> U(0.5, 2);
         for (int t = 0; t < p.T; ++t) {
           const double c = U(r) * (r() % 2 ? 1 : -1);
           for (int i = 0; i < p.dk; ++i) p.k[size_t(t) * p.dk + i] = c * p.k[i];
         }
       }},
      {"nearly colinear keys (cos > 0.999)", 1e-6,
       [](Problem& p, std::mt19937_64& r) {
         std::normal_distribution<double> N(0, 1e-3);
         for (int t = 1; t < p.T; ++t)
           for (int i = 0; i < p.dk; ++i) p.k[size_t(t) * p.dk + i] = p.k[i] * (1 + N(r)) + N(r);
       }},
      {"eta near 0 (eta = 1e-3)", 1e-6,
       [](Problem& p, std::mt19937_64&) { std::fill(p.eta.begin(), p.eta.end(), 1e-3); }},
      {"eta near 1 (eta = 1 - 1e-3)", 1e-6,
       [](Problem& p, std::mt19937_64&) { std::fill(p.eta.begin(), p.eta.end(), 1 - 1e-3); }},
      {"exact projection (eta = 1, eps = 0)", 0.0,
       [](Problem& p, std::mt19937_64&) { std::fill(p.eta.begin(), p.eta.end(), 1.0); }},
  };
  const std::vector<Algo> algos = {Algo{false, 64, false}, Algo{true, 64, false},
                                   Algo{true, 64, true}};
  std::vector<std::unique_ptr<Case>> cases;
  std::vector<Job> jobs;
  std::vector<std::unique_ptr<Run<size_t>>> slots;
  for (size_t si = 0; si < stresses.size(); ++si) {
    auto c = std::make_unique<Case>();
    Draw d;
    d.T = cfg.t_stress;
    d.dk = cfg.dk;
    d.dv = cfg.dv;
    d.knorm_lo = 0.5;
    d.knorm_hi = 2;
    c->raw = draw(d, mix_seed(cfg.seed, 6));  // the same base data for every stress
    std::mt19937_64 rng(mix_seed(cfg.seed, 6, si));
    stresses[si].apply(c->raw, rng);
    c->eps = stresses[si].eps;
    add_case(*c, jobs);
    queue_runs(*c, bk, algos, si, slots, jobs);
    cases.push_back(std::move(c));
  }
  run_jobs(jobs, "§6 stress inputs", cfg.threads);

  Csv csv(dir + "/sec6_stress.csv", {"case", "eps", "variant", "algo", "rel_err", "nonfinite"});
  std::map<std::tuple<size_t, std::string, std::string>, std::string>
      cells;                                               // (stress, variant, algo) -> error
  std::map<std::string, std::pair<double, size_t>> worst;  // variant -> (err, stress)
  std::map<std::string, std::set<size_t>> nan_cases;
  for (const auto& sp : slots) {
    const auto& s = *sp;
    const ErrorStat e = rel_rms(s.r.o, s.c->truth.at(s.b->storage()).o);
    csv.row({stresses[s.tag].name, num(s.c->eps), s.b->id(), s.a.label(), num(e.rel),
             std::to_string(e.nonfinite)});
    cells[{s.tag, s.b->id(), s.a.label()}] = e.nonfinite ? "NaN/Inf" : fmt(e.rel);
    if (e.nonfinite) nan_cases[s.b->id()].insert(s.tag);
    auto& w = worst[s.b->id()];
    if (s.tag > 0 && (w.second == 0 || !(e.rel <= w.first))) w = {e.rel, s.tag};
  }
  std::vector<std::string> parts;
  for (const auto& b : bk) {
    const auto& w = worst[b->id()];
    parts.push_back(b->id() + " " +
                    (std::isfinite(w.first) ? fmt(w.first) : std::string("NaN/Inf")) + " on '" +
                    stresses[w.second].name + "'");
  }
  std::vector<std::string> nan_parts;
  for (const auto& [id, set] : nan_cases) {
    std::vector<std::string> names;
    for (size_t s : set) names.push_back("'" + stresses[s].name + "'");
    nan_parts.push_back(id + " on " + join(names, ", "));
  }
  Section sec;
  sec.title = "6. Stress inputs";
  sec.finding = std::string("Worst stress case per column (largest error over the ") +
                (has_kernels(bk) ? "algorithms it runs" : "three algorithms") +
                "): " + join(parts, "; ") +
                (nan_parts.empty() ? std::string("; no stress input produced NaN/Inf.")
                                   : "; NaN/Inf appear in " + join(nan_parts, "; ") + ".");
  std::ostringstream os;
  os << "One base sequence (" << cfg.t_stress << " tokens, dk = " << cfg.dk << ", dv = " << cfg.dv
     << ", |k| in [0.5, 2], eta in [0.1, 1], alpha in [0.98, 1]) modified in one way per row; eps "
        "= 1e-6 "
        "unless the row says otherwise. Cells: relative RMS output error for tokenwise/raw | "
        "chunk64/raw | chunk64/normalized.\n\n";
  if (has_kernels(bk))
    os << "CUDA columns: token kernel | chunk kernel | n/a (the kernels run raw keys with the "
          "Kaczmarz coefficient only).\n\n";
  os << image("sec6_stress.png", "stress inputs, error per column");
  std::vector<std::string> head{"input"};
  for (const auto& b : bk) head.push_back(b->id());
  std::vector<std::vector<std::string>> rows;
  for (size_t si = 0; si < stresses.size(); ++si) {
    std::vector<std::string> r{stresses[si].name};
    for (const auto& b : bk) {
      std::vector<std::string> per_algo;
      for (const Algo& a : algos)
        per_algo.push_back(b->supports(a) ? cells[{si, b->id(), a.label()}] : "n/a");
      r.push_back(join(per_algo, " \\| "));
    }
    rows.push_back(r);
  }
  os << md_table(head, rows) << "\n";
  sec.body = os.str();
  return sec;
}

// ---- §7 contraction in finite precision --------------------------------------------------------

Section section7(const Config& cfg, const Backends& bk, const std::string& dir) {
  const std::vector<double> etas = {1e-3, 0.1, 0.5, 0.9, 1.0};
  const std::vector<double> epss = {0.0, 1e-6, 1e-2};
  const std::vector<double> kns =
      cfg.quick ? std::vector<double>{1.0} : std::vector<double>{1e-2, 1.0, 10.0};
  struct Item {
    const Backend* b;
    double eta, eps, kn;
    long tokens = 0, increased = 0, not_decreased = 0, nonfinite = 0, fitted = 0;
    double max_ratio = 0;
  };
  const std::vector<const Backend*> cols = traced(bk);
  std::vector<Item> items;
  for (const Backend* b : cols)
    for (double eta : etas)
      for (double eps : epss)
        for (double kn : kns) items.push_back({b, eta, eps, kn});
  Progress prog("§7 contraction (per-token loss)", double(items.size()));
  parallel_for(items.size(), cfg.threads, [&](size_t i) {
    Item& it = items[i];
    // Even tokens write (k, v) with eta in [0.5, 1]; each odd token (the probe, with the swept eta)
    // writes the same pair again. The state then already nearly fits it: a small residual against a
    // large state, which is where rounding can swallow the contraction.
    Draw d = around(cfg.t_contraction, cfg.dk, cfg.dv, it.kn);
    d.eta_lo = 0.5;
    Problem raw = draw(d, mix_seed(cfg.seed, 7, std::uint64_t(it.kn * 100)));
    for (int t = 1; t < raw.T; t += 2) {
      raw.eta[size_t(t)] = it.eta;
      std::copy_n(&raw.k[size_t(t - 1) * raw.dk], raw.dk, &raw.k[size_t(t) * raw.dk]);
      std::copy_n(&raw.v[size_t(t - 1) * raw.dv], raw.dv, &raw.v[size_t(t) * raw.dv]);
    }
    const Problem p = raw.rounded(it.b->storage());
    const auto tr = it.b->trace(p, it.eps);
    if (!tr) throw std::logic_error(it.b->id() + " declined the trace it offers");
    for (int t = 1; t < p.T; t += 2) {
      const auto& rec = (*tr)[size_t(t)];
      ++it.tokens;
      auto finite = [](const std::vector<double>& v) {
        return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
      };
      if (!finite(rec.state) || !finite(rec.decayed)) {
        ++it.nonfinite;
        continue;
      }
      int cmp = 0;
      bool zero = false;
      const double r = loss_ratio(rec.decayed.data(), rec.state.data(), &p.k[size_t(t) * p.dk],
                                  &p.v[size_t(t) * p.dv], p.dk, p.dv, cmp, zero);
      if (zero) {  // L(S~) = 0: already fitted, nothing to decrease
        ++it.fitted;
        continue;
      }
      if (cmp > 0) ++it.increased;
      if (cmp >= 0) ++it.not_decreased;
      if (cmp > 0) it.max_ratio = std::max(it.max_ratio, r);
    }
    prog.add(1);
  });
  prog.finish();
  Csv csv(dir + "/sec7_contraction.csv",
          {"variant", "eta", "eps", "knorm", "tokens", "increased", "not_decreased", "nonfinite",
           "already_fitted", "max_increase_ratio"});
  // tokens, increased, nonfinite, not decreased
  std::map<std::string, std::array<long, 4>> per_variant;
  std::map<std::pair<std::string, double>, std::array<long, 3>> by_eta;  // tokens, incr., not decr.
  for (const Item& it : items) {
    csv.row({it.b->id(), num(it.eta), num(it.eps), num(it.kn), std::to_string(it.tokens),
             std::to_string(it.increased), std::to_string(it.not_decreased),
             std::to_string(it.nonfinite), std::to_string(it.fitted), num(it.max_ratio)});
    auto& v = per_variant[it.b->id()];
    v[0] += it.tokens, v[1] += it.increased, v[2] += it.nonfinite, v[3] += it.not_decreased;
    auto& e = by_eta[{it.b->id(), it.eta}];
    e[0] += it.tokens, e[1] += it.increased, e[2] += it.not_decreased;
  }
  std::vector<std::string> parts;
  std::vector<std::vector<std::string>> rows;
  for (const Backend* b : cols) {
    const auto& v = per_variant[b->id()];
    parts.push_back(b->id() + " " + fmt(100.0 * v[3] / std::max(1L, v[0])) +
                    "% (increased: " + fmt(100.0 * v[1] / std::max(1L, v[0])) + "%)");
    std::vector<std::string> r{b->id()};
    for (double eta : etas) {
      const auto& e = by_eta[{b->id(), eta}];
      r.push_back(fmt(100.0 * e[2] / std::max(1L, e[0])) + "% / " +
                  fmt(100.0 * e[1] / std::max(1L, e[0])) + "%");
    }
    r.push_back(std::to_string(v[2]));
    rows.push_back(r);
  }
  // Where failures concentrate: the eta with the highest failure rate over all columns.
  double worst_eta = etas[0], worst_rate = -1;
  for (double eta : etas) {
    long n = 0, f = 0;
    for (const Backend* b : cols) n += by_eta[{b->id(), eta}][0], f += by_eta[{b->id(), eta}][2];
    if (double(f) / std::max(1L, n) > worst_rate)
      worst_rate = double(f) / std::max(1L, n), worst_eta = eta;
  }
  Section sec;
  sec.title = "7. Contraction in finite precision";
  sec.finding =
      "In exact arithmetic every token with eta > 0 and k != 0 decreases its loss (Prop. 2); in "
      "finite "
      "precision the loss failed to decrease on " +
      join(parts, ", ") +
      " of tokens, mostly where the contraction factor 1 - eta |k|^2/(|k|^2+eps) is near 1 (eta "
      "= " +
      eps_str(worst_eta) + ": " + fmt(100 * worst_rate) + "% of tokens over all columns).";
  std::ostringstream os;
  os << "For every token, each column's own S~ and S_t (tokenwise, raw form) are fed to the loss "
        "L(S) = 1/2 |S^T k - v|^2, evaluated in "
     << truth_bits()
     << "-bit MPFR (so the comparison itself does not round). A token *failed to decrease* when "
        "L(S_t) >= L(S~) > 0 (typically the update was rounded away entirely, S_t = S~), and "
        "*increased* when "
        "L(S_t) > L(S~), a strict violation of Prop. 2's inequality. Sweep: eta in {1e-3, 0.1, "
        "0.5, 0.9, 1}, eps in {0, 1e-6, 1e-2}, |k| around "
     << join(
            [&] {
              std::vector<std::string> v;
              for (double k : kns) v.push_back(eps_str(k));
              return v;
            }(),
            ", ")
     << ", " << cfg.t_contraction
     << " tokens each: every even token writes a fresh (k, v) with eta in [0.5, 1] and the "
        "following "
        "odd token (the probe, the only one counted) writes the same pair again with the swept "
        "eta, so "
        "the state already nearly fits it (small residual, large state: the regime of repeated "
        "associations, where a rounded update can be lost). Cells: share of tokens that failed to "
        "decrease / that increased, per eta "
        "(last column: tokens with a non-finite state, excluded; `sec7_contraction.csv` splits by "
        "eps and |k|):\n\n";
  os << trace_notes(bk);
  os << image("sec7_contraction.png", "share of tokens whose loss failed to decrease");
  std::vector<std::string> head{"column"};
  for (double eta : etas) head.push_back("eta=" + eps_str(eta));
  head.push_back("non-finite");
  os << md_table(head, rows) << "\n";
  sec.body = os.str();
  return sec;
}

// ---- §8 recommendations ------------------------------------------------------------------------

Section section8(const Config& cfg, const Backends& bk, const Sweep& sw, const FormsResult& fr) {
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

// ---- provenance --------------------------------------------------------------------------------

std::string run_cmd(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

struct CrossCheck {
  std::string name;
  double diff;
};

/// The fast MPFR truth against the reference library itself (Mpfr tokenwise and chunkwise,
/// normalised form, and exact rationals).
std::vector<CrossCheck> cross_check(const Config& cfg, const std::string& dir) {
  Draw d;
  d.T = cfg.quick ? 24 : 96;
  d.dk = d.dv = cfg.quick ? 4 : 8;
  d.knorm_lo = 1e-2;
  d.knorm_hi = 1e2;
  const Problem p = draw(d, mix_seed(cfg.seed, 1)).rounded(Storage::bf16);
  const double eps = double(1e-6f);
  const RunResult t = truth_forward(p, eps);
  std::vector<CrossCheck> cc;
  auto add = [&](const std::string& n, const RunResult& r) {
    cc.push_back({n, std::max(rel_rms(r.o, t.o).rel, rel_rms(r.state, t.state).rel)});
  };
  add("kla::ref::recurrent_forward<Mpfr>", reference_mpfr(p, eps, Algo{false, 64, false}));
  add("kla::ref::chunk_forward<Mpfr> (C=16)", reference_mpfr(p, eps, Algo{true, 16, false}));
  add("normalize_keys + chunk_forward<Mpfr> (C=16)", reference_mpfr(p, eps, Algo{true, 16, true}));
  Problem shortp = p;  // exact rationals: entries grow ~28 bits per token, keep it short
  shortp.T = 12;
  for (auto* v : {&shortp.q, &shortp.k}) v->resize(size_t(shortp.T) * shortp.dk);
  shortp.v.resize(size_t(shortp.T) * shortp.dv);
  shortp.eta.resize(size_t(shortp.T));
  shortp.alpha.resize(size_t(shortp.T));
  const RunResult ts = truth_forward(shortp, eps), rs = reference_rational(shortp, eps);
  cc.push_back({"kla::ref::recurrent_forward<Rational> (T=12, exact)",
                std::max(rel_rms(ts.o, rs.o).rel, rel_rms(ts.state, rs.state).rel)});
  Csv csv(dir + "/groundtruth_check.csv", {"check", "max_rel_diff"});
  for (const auto& c : cc) csv.row({c.name, num(c.diff)});
  return cc;
}

Section provenance(const Config& cfg, const Backends& bk, const CudaStatus& cuda,
                   const std::vector<CrossCheck>& cc, double seconds) {
  // KLA_REPORT_COMMIT: the commit recorded where the binary was built (tools/report_gpu.sh
  // stage), for machines that run a carried binary without the git checkout.
  const char* env_commit = std::getenv("KLA_REPORT_COMMIT");
  std::string commit;
  if (env_commit && *env_commit) {
    commit = env_commit;
  } else {
    commit = run_cmd("git -C '" KLA_SOURCE_DIR "' rev-parse HEAD");
    if (commit.empty())
      commit = "unknown (not a git checkout)";
    else if (!run_cmd("git -C '" KLA_SOURCE_DIR
                      "' status --porcelain --untracked-files=no -- . ':(exclude)docs/report'")
                  .empty())
      commit += " + uncommitted changes";
  }
  std::string nvcc = run_cmd("nvcc --version | tail -n 2 | head -n 1");
  if (nvcc.empty()) nvcc = run_cmd("/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1");
  const std::string smi = run_cmd("nvidia-smi -L");
  std::string toolkit, gpu;
  if (cuda.available) {
    toolkit = (nvcc.empty() ? std::string() : nvcc + "; ") + cuda.versions;
    gpu = cuda.device + " (the cuda-* columns)";
  } else {
    toolkit = nvcc.empty() ? "none found (CPU-only report)"
                           : nvcc + " (not used: " +
                                 (cuda.compiled ? cuda.why : "no CUDA backend in this build") + ")";
    gpu = "none (CPU reference columns only)";
    if (!smi.empty()) gpu += "; nvidia-smi lists " + smi + ", not used: " + cuda.why;
  }
  const std::string via = std::getenv("KLA_REPORT_VIA") ? std::getenv("KLA_REPORT_VIA") : "";
  std::ostringstream os;
  os << md_table(
      {"item", "value"},
      {{"kla version", KLA_VERSION_STRING},
       {"commit", "`" + commit + "`"},
       {"compiler", std::string(KLA_CXX_COMPILER) + " (" + __VERSION__ + "), " + KLA_BUILD_TYPE},
       {"CUDA toolkit", toolkit},
       {"GPU", gpu},
       {"CPU", cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) +
                   " hardware threads, " + std::to_string(cfg.threads) + " used"},
       {"MPFR / Eigen", std::string("MPFR ") + mpfr_get_version() + ", Eigen " +
                            std::to_string(EIGEN_WORLD_VERSION) + "." +
                            std::to_string(EIGEN_MAJOR_VERSION) + "." +
                            std::to_string(EIGEN_MINOR_VERSION)},
       {"base seed", std::to_string(cfg.seed) + " (every input is a function of it and the cell; "
                                                "re-running reproduces the numbers)"},
       {"sweep", std::string(cfg.quick  ? "--quick"
                             : cfg.full ? "--full"
                                        : "default") +
                     ": dk = " + std::to_string(cfg.dk) + ", dv = " + std::to_string(cfg.dv) +
                     ", section 4 up to " + std::to_string(cfg.max_len) +
                     " tokens at dk = dv = " + std::to_string(cfg.long_dim)},
       {"command", "`" + cfg.command + "`" + (via.empty() ? "" : " (run by `" + via + "`)")},
       {"run time", fmt(seconds, 3) + " s"}});
  os << "\nColumns. Every column reads the same inputs as its ground truth: q, k, v, eta and alpha "
        "are drawn in fp64 and rounded once to the column's storage dtype (alpha and eta too, so "
        "that one "
        "truth serves all columns of a storage dtype; the kernels keep them in fp32). eps is a "
        "float "
        "parameter.\n\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& b : bk) {
    const DtypeSpec s = b->dtypes();
    rows.push_back({b->id(), s.storage, s.state, s.accumulation, s.coefficient, s.eps, s.note});
  }
  rows.push_back({"truth", "as the column", "MPFR " + std::to_string(truth_bits()) + " bits",
                  "MPFR", "MPFR", "exact float value",
                  "tokenwise raw form, direct MPFR loop (cross-checked below)"});
  os << md_table({"column", "storage (q,k,v,eta,alpha)", "state S", "accumulation",
                  "coefficient beta", "eps", "what"},
                 rows);
  os << "\nThe emulated columns round every operation (dot products included) to bf16/fp16, which "
        "no "
        "real kernel does: they bound the damage from above. The *-store columns keep the inputs "
        "in "
        "bf16/fp16 but compute in fp32, like a kernel with fp32 state and fp32 accumulation (real "
        "kernels additionally round the operands of their intra-chunk matrix products to "
        "bf16/fp16, so "
        "they sit between the two). \"Error\" is the relative RMS error of the outputs o_t = S_t^T "
        "q_t "
        "against the truth on the same rounded inputs; \"including input rounding\" compares with "
        "the "
        "truth on the unrounded fp64 inputs instead.\n\n";
  if (cuda.available)
    os << "The cuda-* columns are the kla::cuda kernels themselves, run on " << cuda.device
       << " through the C ABI on the very inputs of the other columns of their storage dtype "
          "(tools/report/cuda_backend.cpp). Head dimensions are zero-padded to a multiple of 16, "
          "the kernels' granularity: zero components add exact zeros, so the padded run computes "
          "the same values. In the tables, token kernel = tokenwise/raw and chunk kernel = "
          "chunk64/raw.\n\n";
  os << "Ground-truth cross-check: the direct MPFR loop used as truth against the reference "
        "library "
        "itself, on bf16-rounded inputs with key norms from 1e-2 to 1e2 (relative difference of "
        "outputs and "
        "final state after rounding both to fp64, so 0 means they agree to fp64 resolution, "
        "1e-16):\n\n";
  std::vector<std::vector<std::string>> crow;
  for (const auto& c : cc) crow.push_back({c.name, fmt(c.diff)});
  os << md_table({"truth vs", "max relative difference"}, crow) << "\n";
  Section sec;
  sec.title = "1. Provenance";
  double worst = 0;
  for (const auto& c : cc) worst = std::max(worst, c.diff);
  sec.finding = std::string("This report was computed on the CPU (") + cpu_model() + ")" +
                (cuda.available ? " and the GPU (" + cuda.device + ")" : std::string()) +
                " from commit " + commit + " with seed " + std::to_string(cfg.seed) +
                "; its MPFR ground truth agrees with the reference library's Mpfr and "
                "exact rational instantiations to " +
                (worst == 0 ? std::string("the last bit of fp64") : fmt(worst)) + ".";
  sec.body = os.str();
  return sec;
}

// ---- output directory --------------------------------------------------------------------------

/// tools/plot_report.py of the source tree, else plot_report.py beside the executable (a binary
/// carried to another machine, tools/report_gpu.sh), else the source tree's path for the message.
std::string default_plot_script() {
  const std::string src = KLA_SOURCE_DIR "/tools/plot_report.py";
  std::error_code ec;
  if (fs::exists(src, ec)) return src;
  const fs::path beside = fs::read_symlink("/proc/self/exe", ec).parent_path() / "plot_report.py";
  if (!ec && fs::exists(beside, ec)) return beside.string();
  return src;
}

/// Folders of `out` holding a report of their own (report.md): kept when `out` is replaced.
std::vector<std::string> nested_reports(const fs::path& out) {
  std::vector<std::string> n;
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return n;
  for (const auto& e : fs::directory_iterator(out, ec))
    if (e.is_directory(ec) && fs::exists(e.path() / "report.md", ec) &&
        e.path().filename().string().find(".tmp-") == std::string::npos)
      n.push_back(e.path().filename().string());
  std::sort(n.begin(), n.end());
  return n;
}

/// Refuses to replace a directory that is not a previous report (guards against --out ~).
void check_out(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec))
    throw UsageError("--out " + out.string() + " exists and is not a directory");
  if (!fs::is_empty(out, ec) && !fs::exists(out / "report.md", ec))
    throw UsageError("--out " + out.string() +
                     " is a non-empty directory without report.md; refusing to replace it");
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  fs::path out;
  try {
    cfg = parse(argc, argv);
    if (cfg.plot_script.empty()) cfg.plot_script = default_plot_script();
    if (cfg.help) {
      usage(std::cout);
      return 0;
    }
    out = fs::absolute(cfg.out).lexically_normal();
    check_out(out);
  } catch (const UsageError& e) {
    std::cerr << "kla_report: " << e.what() << "\n";
    usage(std::cerr);
    return 2;
  }
  const fs::path tmp =
      out.parent_path() / (out.filename().string() + ".tmp-" + std::to_string(getpid()));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fs::create_directories(tmp);
    const std::string dir = tmp.string();
    CudaStatus cuda;
    const Backends bk = make_backends(cuda);
    if (cuda.available)
      std::cerr << "[kla_report] CUDA columns on " << cuda.device << "\n";
    else
      std::cerr << "[kla_report] no CUDA columns: " << cuda.why << "\n";
    std::cerr << "[kla_report] writing " << out.string() << " ("
              << (cfg.quick  ? "quick"
                  : cfg.full ? "full"
                             : "default")
              << " sweep, " << cfg.threads << " threads)\n";
    const auto cc = cross_check(cfg, dir);
    Sweep sw;
    FormsResult fr;
    std::vector<Section> secs;
    secs.push_back(section2(cfg, bk, dir, sw));
    secs.push_back(section3(cfg, bk, dir));
    secs.push_back(section4(cfg, bk, dir));
    secs.push_back(section5(cfg, bk, dir, sw, fr));
    secs.push_back(section6(cfg, bk, dir));
    secs.push_back(section7(cfg, bk, dir));
    secs.push_back(section8(cfg, bk, sw, fr));

    // Plots: a failure is reported in the Markdown, never fatal.
    std::string plot_note;
    const std::vector<std::string> pngs = {"sec2_heatmap.png", "sec3_defect.png",
                                           "sec4_length.png",  "sec5_forms.png",
                                           "sec6_stress.png",  "sec7_contraction.png"};
    if (!cfg.plots) {
      plot_note = "Plots were skipped (--no-plots); the CSV files hold all data.";
    } else {
      std::cerr << "[kla_report] plotting with " << cfg.python << " " << cfg.plot_script << "\n";
      const std::string cmd = shell_quote(cfg.python) + " " + shell_quote(cfg.plot_script) + " " +
                              shell_quote(dir) + " > " + shell_quote(dir + "/plot.log") + " 2>&1";
      const int rc = std::system(cmd.c_str());
      std::vector<std::string> missing;
      for (const auto& p : pngs)
        if (!fs::exists(tmp / p)) missing.push_back(p);
      if (rc != 0 || !missing.empty()) {
        std::ifstream lf(tmp / "plot.log");
        std::string log((std::istreambuf_iterator<char>(lf)), std::istreambuf_iterator<char>());
        if (log.size() > 600) log = "..." + log.substr(log.size() - 600);
        plot_note =
            "**Plots are missing** (" + join(missing, ", ") + "): `" + cfg.python + " " +
            cfg.plot_script + "` failed (exit " + std::to_string(rc) +
            "). Install matplotlib (`apt-get install python3-matplotlib`) or pass `--python`. "
            "The CSV files hold all data. Plotter output:\n\n```\n" +
            log + "\n```";
        std::cerr << "[kla_report] warning: plotting failed, see report.md\n";
      } else {
        fs::remove(tmp / "plot.log");
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    secs.insert(secs.begin(), provenance(cfg, bk, cuda, cc, seconds));
    const std::vector<std::string> nested = nested_reports(out);

    std::ofstream md(tmp / "report.md");
    md << "# KLA precision and eps sensitivity report\n\n"
          "Generated by `kla_report` (tools/kla_report.cpp); every sentence marked **Finding** is "
          "computed from "
          "the data in this directory. "
       << (cuda.available
               ? "GPU report: the cuda-* columns are the CUDA kernels on " + cuda.device + ".\n\n"
               : std::string("CPU report: the CUDA kernels' columns appear when a CUDA "
                             "backend is "
                             "available.\n\n"));
    for (const auto& n : nested) {
      std::ifstream nf(out / n / "report.md");
      const std::string text((std::istreambuf_iterator<char>(nf)),
                             std::istreambuf_iterator<char>());
      md << (text.find("GPU report:") != std::string::npos
                 ? "The same report with the CUDA kernels' columns, from a GPU run: "
                 : "Another run of this report kept in this directory: ")
         << "[" << n << "/report.md](" << n << "/report.md).\n\n";
    }
    if (!plot_note.empty()) md << "> " << plot_note << "\n\n";
    md << "## Findings\n\n";
    for (const auto& s : secs) md << "- **" << s.title << "**: " << s.finding << "\n";
    md << "\n";
    for (const auto& s : secs)
      md << "## " << s.title << "\n\n**Finding:** " << s.finding << "\n\n" << s.body << "\n";
    md.close();
    if (!md) throw std::runtime_error("cannot write report.md");
    // Nested reports (a folder of `out` with its own report.md, e.g. docs/report/gpu) are kept.
    for (const auto& n : nested) fs::rename(out / n, tmp / n);
    if (fs::exists(out)) fs::remove_all(out);
    fs::rename(tmp, out);
    std::cerr << "[kla_report] wrote " << (out / "report.md").string() << " in " << fmt(seconds, 3)
              << " s\n";
  } catch (const std::exception& e) {
    std::cerr << "kla_report: error: " << e.what() << "\n";
    std::error_code ec;
    fs::remove_all(tmp, ec);
    return 1;
  }
  return 0;
}
