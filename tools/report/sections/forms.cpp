// §5 of the report: raw vs normalised-key form and tokenwise vs chunkwise order, and the form
// the kernels should use.
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "report/problems.hpp"
#include "report/runs.hpp"
#include "report/sections/sections.hpp"

namespace kla::report {

Section section_forms(const Config& cfg, const Backends& bk, const std::string& dir,
                      const Sweep& sw, FormsResult& fr) {
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
  Batch<std::string> batch(bk, algos);
  for (size_t fi = 0; fi < fams.size(); ++fi) {
    Draw d;
    d.T = cfg.t_forms;
    d.dk = cfg.dk;
    d.dv = cfg.dv;
    d.knorm_lo = fams[fi].lo;
    d.knorm_hi = fams[fi].hi;
    d.correlation = fams[fi].corr;
    batch.add(draw(d, mix_seed(cfg.seed, 5, fi)), 1e-6, fams[fi].name);
  }
  batch.run("§5 forms and orders", cfg.threads);

  Csv csv(dir + "/sec5_forms.csv",
          {"variant", "family", "form", "order", "chunk", "rel_err", "nonfinite"});
  std::map<std::tuple<std::string, std::string, std::string>, ErrorStat>
      err;  // variant, family, algo
  for (const auto& sp : batch.runs()) {
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

}  // namespace kla::report
