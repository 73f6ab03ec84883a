// §6 of the report: the error on inputs built to hurt (outliers, zero and colinear keys,
// extreme eta).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "report/problems.hpp"
#include "report/runs.hpp"
#include "report/sections/sections.hpp"

namespace kla::report {

Section section_stress(const Config& cfg, const Backends& bk, const std::string& dir) {
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
  Draw d;
  d.T = cfg.t_stress;
  d.dk = cfg.dk;
  d.dv = cfg.dv;
  d.knorm_lo = 0.5;
  d.knorm_hi = 2;
  const Problem base = draw(d, mix_seed(cfg.seed, 6));  // the same base data for every stress
  Batch<size_t> batch(bk, algos);
  for (size_t si = 0; si < stresses.size(); ++si) {
    Problem raw = base;
    std::mt19937_64 rng(mix_seed(cfg.seed, 6, si));
    stresses[si].apply(raw, rng);
    batch.add(std::move(raw), stresses[si].eps, si);
  }
  batch.run("§6 stress inputs", cfg.threads);

  Csv csv(dir + "/sec6_stress.csv", {"case", "eps", "variant", "algo", "rel_err", "nonfinite"});
  std::map<std::tuple<size_t, std::string, std::string>, std::string>
      cells;                                               // (stress, variant, algo) -> error
  std::map<std::string, std::pair<double, size_t>> worst;  // variant -> (err, stress)
  std::map<std::string, std::set<size_t>> nan_cases;
  std::map<std::pair<size_t, std::string>, ErrorStat> chunk_raw;  // (stress, variant), chunk64/raw
  for (const auto& sp : batch.runs()) {
    const auto& s = *sp;
    const ErrorStat e = rel_rms(s.r.o, s.c->truth.at(s.b->storage()).o);
    csv.row({stresses[s.tag].name, num(s.c->eps), s.b->id(), s.a.label(), num(e.rel),
             std::to_string(e.nonfinite)});
    cells[{s.tag, s.b->id(), s.a.label()}] = e.nonfinite ? "NaN/Inf" : fmt(e.rel);
    if (e.nonfinite) nan_cases[s.b->id()].insert(s.tag);
    if (s.a.label() == Algo{true, 64, false}.label()) chunk_raw[{s.tag, s.b->id()}] = e;
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
  // The FAST contract (kla_params.arithmetic): FAST's error over the one-part arithmetic's
  // (flash-linear-attention's, modelled by <dt>-onepart-model) on each input, for the FAST model
  // and, in a GPU report, the FAST kernels; a one-part NaN / Inf where FAST is finite counts as
  // FAST within the contract.
  auto contract_of = [&](const std::string& fast_id, const std::string& d) -> std::string {
    double worst_ratio = 0;
    size_t at = 0, finite = 0, onepart_nan = 0;
    bool fast_nan = false, ran = false;
    for (size_t si = 0; si < stresses.size(); ++si) {
      const auto f = chunk_raw.find({si, fast_id});
      const auto o = chunk_raw.find({si, d + "-onepart-model"});
      if (f == chunk_raw.end() || o == chunk_raw.end()) continue;
      ran = true;
      if (f->second.nonfinite) {
        fast_nan = true;
        continue;
      }
      if (o->second.nonfinite) {
        ++onepart_nan;
        continue;
      }
      ++finite;
      const double r = o->second.rel > 0 ? f->second.rel / o->second.rel : 0.0;
      if (r >= worst_ratio) worst_ratio = r, at = si;
    }
    if (!ran) return "";
    return fast_id + ": at most " + fmt(worst_ratio) + "x (on '" + stresses[at].name + "', " +
           std::to_string(finite) + " inputs)" +
           (onepart_nan ? ", and finite on the " + std::to_string(onepart_nan) +
                              " where the one-part arithmetic gives NaN/Inf"
                        : "") +
           (fast_nan ? "; FAST itself NaN/Inf on some input" : "");
  };
  std::vector<std::string> contract;
  for (const std::string d : {"bf16", "fp16"})
    for (const std::string& id : {d + "-fast-model", "cuda-" + d + "-fast"})
      if (const std::string c = contract_of(id, d); !c.empty()) contract.push_back(c);
  Section sec;
  sec.title = "6. Stress inputs";
  sec.finding = std::string("Worst stress case per column (largest error over the ") +
                (has_kernels(bk) ? "algorithms it runs" : "three algorithms") +
                "): " + join(parts, "; ") +
                (nan_parts.empty() ? std::string("; no stress input produced NaN/Inf.")
                                   : "; NaN/Inf appear in " + join(nan_parts, "; ") + ".") +
                (contract.empty() ? std::string()
                                  : " The FAST contract (FAST's error over the one-part "
                                    "arithmetic's, flash-linear-attention's, as modelled by "
                                    "<dtype>-onepart-model; chunk64/raw): " +
                                        join(contract, "; ") + ".");
  std::ostringstream os;
  os << "One base sequence (" << cfg.t_stress << " tokens, dk = " << cfg.dk << ", dv = " << cfg.dv
     << ", |k| in [0.5, 2], eta in [0.1, 1], alpha in [0.98, 1]) modified in one way per row; eps "
        "= 1e-6 "
        "unless the row says otherwise. Cells: relative RMS output error for tokenwise/raw | "
        "chunk64/raw | chunk64/normalized.\n\n";
  if (has_kernels(bk))
    os << "CUDA columns: token kernel | chunk kernel | n/a (the kernels run raw keys with the "
          "Kaczmarz coefficient only); the -fast columns n/a | chunk kernel under arithmetic FAST "
          "| n/a.\n\n";
  os << "The *-model columns model the kernels' tensor-core arithmetics (n/a | chunk64/raw | "
        "n/a): FAST (kla_params.arithmetic; the state and the update rounded once to the dtype) "
        "and one-part (every operand rounded once, flash-linear-attention's), in double "
        "otherwise (tools/report/arith_models.cpp).\n\n";
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

}  // namespace kla::report
