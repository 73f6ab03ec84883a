// proofs_check: runs every statement of SPEC §2 as a RapidCheck property over exact rationals
// and prints a table (id, paper reference, cases, result; for a failure the shrunk
// counterexample and how to reproduce it). With --mutants it plants each fault of
// kla/ref/mutants.hpp in turn, runs every statement against it and prints the matrix (mutant x
// statement) and, per statement, whether it rejects a mutant of its own (ownership() below).
// RapidCheck's own reporting is silenced there: the matrix is the only output.
//
// Exit status: 0 when every selected statement holds (with --mutants: every mutant is caught
// and every statement rejects one of its own), 1 otherwise, 2 on bad usage.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "kla/ref/mutants.hpp"
#include "statement.hpp"

namespace {

using kla::proofs::registry;
using kla::proofs::Statement;

struct Options {
  std::set<std::string> only;
  std::set<std::string> skip;
  int cases = 100;
  std::uint64_t seed = 0;
  bool seed_given = false;
  bool mutants = false;
  bool list = false;
};

void usage(std::ostream& os) {
  os << "usage: proofs_check [--list] [--only ID]... [--skip ID]... [--cases N] [--seed S] "
        "[--mutants]\n"
        "  --list       print the statement ids and exit\n"
        "  --only ID    run only this statement (repeatable)\n"
        "  --skip ID    leave this statement out (repeatable; with --mutants: as if its check\n"
        "               were deleted, every mutant must still be caught by the others)\n"
        "  --cases N    random cases per statement (default 100, times $KLA_PROOFS_SCALE)\n"
        "  --seed S     RapidCheck seed (default: random, printed)\n"
        "  --mutants    plant each fault, run every statement against it, print the matrix;\n"
        "               requires every fault rejected and every statement to reject its own\n";
}

struct Outcome {
  bool passed = false;
  int cases = 0;
  std::string detail;  // failure description and counterexample
  std::string reproduce;
};

Outcome run(const Statement& s, const Options& opt, bool quiet_shrink) {
  rc::detail::TestParams params;
  params.seed = opt.seed;
  params.maxSuccess = opt.cases;
  params.maxSize = 100;
  params.disableShrinking = quiet_shrink;
  rc::detail::TestMetadata meta;
  meta.id = s.id;
  meta.description = s.id;
  const auto result = rc::detail::checkTestable(s.property, meta, params);
  Outcome out;
  rc::detail::SuccessResult ok;
  rc::detail::FailureResult fail;
  rc::detail::GaveUpResult gave_up;
  rc::detail::Error error;
  if (result.match(ok)) {
    out.passed = true;
    out.cases = ok.numSuccess;
  } else if (result.match(fail)) {
    out.cases = fail.numSuccess + 1;
    std::ostringstream os;
    os << fail.description << "\n  counterexample (shrunk):\n";
    for (const auto& [type, value] : fail.counterExample)
      os << "    " << type << ": " << value << "\n";
    out.detail = os.str();
    std::ostringstream rep;
    rep << fail.reproduce;
    out.reproduce = rep.str();
  } else if (result.match(gave_up)) {
    out.cases = gave_up.numSuccess;
    out.detail = "gave up: " + gave_up.description;
  } else if (result.match(error)) {
    out.detail = "error: " + error.description;
  }
  return out;
}

int run_statements(const Options& opt, const std::vector<const Statement*>& sel) {
  std::cout << "kla proofs_check: " << sel.size() << " statements, " << opt.cases
            << " cases each, seed " << opt.seed << "\n\n";
  std::cout << std::left << std::setw(24) << "id" << std::setw(34) << "paper" << std::setw(8)
            << "cases"
            << "result\n"
            << std::string(76, '-') << "\n";
  int failed = 0;
  std::vector<std::pair<const Statement*, Outcome>> failures;
  for (const Statement* s : sel) {
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = run(*s, opt, false);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << std::left << std::setw(24) << s->id << std::setw(34) << s->paper << std::setw(8)
              << o.cases << (o.passed ? "holds" : "FAILS") << "  (" << std::fixed
              << std::setprecision(1) << sec << " s)" << std::endl;
    if (!o.passed) {
      ++failed;
      failures.emplace_back(s, o);
    }
  }
  for (const auto& [s, o] : failures) {
    std::cout << "\n== " << s->id << " fails\n" << o.detail;
    if (!o.reproduce.empty())
      std::cout << "  failing case: " << o.reproduce << "\n  reproduce: proofs_check --only "
                << s->id << " --seed " << opt.seed << " --cases " << opt.cases << "\n";
  }
  std::cout << "\n" << (sel.size() - failed) << " passed, " << failed << " failed" << std::endl;
  return failed ? 1 : 0;
}

#ifdef KLA_REF_MUTANTS
using kla::ref::Mutant;

/// Which planted faults are each statement's own: the mutants aimed at that statement's claim,
/// planted in the code path its property exercises. `--mutants` requires every statement to
/// reject at least one of its own (so deleting or weakening its check shows), and every mutant
/// to be rejected by some statement. The four gross mutants of SPEC §2 belong to no statement.
/// proofs_check/README.md shows the matrix and which own mutants only their owner rejects.
struct Ownership {
  const char* id;
  const char* column;  ///< short column label of the matrix
  std::vector<Mutant> own;
};

const std::vector<Ownership>& ownership() {
  static const std::vector<Ownership> table = {
      {"ext.diagonal_gating", "diag", {Mutant::gate_channel_reversed}},
      {"grad.adjoint",
       "gadj",
       {Mutant::grad_carry_undecayed, Mutant::grad_kaczmarz_norm_term,
        Mutant::grad_decay_one_channel}},
      {"grad.chunk_equals_token",
       "gchk",
       {Mutant::grad_chunk_gram_term, Mutant::grad_chunk_carry_no_gamma}},
      {"grad.normalized_key", "gnky", {Mutant::grad_chain_value_term}},
      {"ours.normalized_key", "nkey", {Mutant::value_unnormalized}},
      {"prop1.proximal", "prx1", {Mutant::proximal_mu}},
      {"prop2.contraction", "ctr2", {Mutant::contraction_eps_dropped}},
      {"prop3.chunk_system", "sys3", {Mutant::chunk_mask_upper, Mutant::chunk_beta_right}},
      {"prop4.chunk_output",
       "out4",
       {Mutant::readout_scale_ignored, Mutant::chunk_out_strict_mask}},
      {"remark.decay_agnostic",
       "dagn",
       {Mutant::projection_residual_sign, Mutant::decay_after_update}},
      {"seg.combine", "segc", {Mutant::segment_combine_order}},
      {"seg.grad_bound", "segb", {Mutant::gradient_bound_decays_own_outputs}},
      {"seg.grad_combine", "segg", {Mutant::segment_grad_fold_untransposed}},
      {"seg.grad_truncation", "segt", {Mutant::truncation_certificate_min_decay}},
      {"thm1.constraint", "cons", {Mutant::residual_undecayed}},
      {"thm1.lagrange", "lagr", {Mutant::multiplier_sign}},
      {"thm1.line_search", "line", {Mutant::loss_half_dropped, Mutant::trace_residual_sign}},
      {"thm1.normalized_sgd", "nsgd", {Mutant::gradient_sign}},
      {"thm1.projection", "proj", {Mutant::project_undecayed}},
      {"wy.H", "wyH", {Mutant::wy_H_undecayed}},
      {"wy.P", "wyP", {Mutant::wy_P_sum_range}},
  };
  return table;
}

const Ownership* owner_entry(const std::string& id) {
  for (const auto& o : ownership())
    if (id == o.id) return &o;
  return nullptr;
}

bool is_gross(Mutant m) {
  return std::find(kla::ref::gross_mutants.begin(), kla::ref::gross_mutants.end(), m) !=
         kla::ref::gross_mutants.end();
}

/// The statement that owns `m`, or nullptr (gross, or not in the table).
const Ownership* owner_of(Mutant m) {
  for (const auto& o : ownership())
    if (std::find(o.own.begin(), o.own.end(), m) != o.own.end()) return &o;
  return nullptr;
}

/// Listens to nothing: the mutant run reports through its matrix only, not through RapidCheck's
/// global listener (whose exit banner "properties had failures" would read as a failure).
class SilentListener : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

enum class Verdict { holds, rejects, error };

/// Runs one statement with no shrinking and no RapidCheck output.
Verdict run_silent(const Statement& s, const Options& opt) {
  rc::detail::TestParams params;
  params.seed = opt.seed;
  params.maxSuccess = opt.cases;
  params.maxSize = 100;
  params.disableShrinking = true;
  rc::detail::TestMetadata meta;
  meta.id = s.id;
  meta.description = s.id;
  SilentListener listener;
  const auto result =
      rc::detail::checkProperty(rc::detail::toProperty(s.property), meta, params, listener, {});
  if (result.template is<rc::detail::SuccessResult>()) return Verdict::holds;
  if (result.template is<rc::detail::FailureResult>()) return Verdict::rejects;
  return Verdict::error;  // gave up or a RapidCheck error: neither holds nor rejects
}

/// Sends std::cerr nowhere while alive (RapidCheck prints its configuration there on first use).
class MuteStderr {
 public:
  MuteStderr() : saved_(std::cerr.rdbuf(nullptr)) {}
  ~MuteStderr() { std::cerr.rdbuf(saved_); }
  MuteStderr(const MuteStderr&) = delete;
  MuteStderr& operator=(const MuteStderr&) = delete;

 private:
  std::streambuf* saved_;
};
#endif

int run_mutants(const Options& opt, const std::vector<const Statement*>& sel) {
#ifdef KLA_REF_MUTANTS
  const auto t0 = std::chrono::steady_clock::now();
  // The ownership table must name real statements and non-gross mutants, each mutant once.
  for (const auto& o : ownership()) {
    bool known = false;
    for (const auto& s : registry()) known |= s.id == o.id;
    if (!known) {
      std::cerr << "proofs_check: ownership table names no statement '" << o.id << "'\n";
      return 2;
    }
    for (const auto m : o.own)
      if (is_gross(m) || owner_of(m) != &o) {
        std::cerr << "proofs_check: mutant " << kla::ref::mutant_name(m)
                  << " is gross or owned twice\n";
        return 2;
      }
  }
  for (const auto m : kla::ref::all_mutants)
    if (!is_gross(m) && !owner_of(m)) {
      std::cerr << "proofs_check: mutant " << kla::ref::mutant_name(m) << " has no owner\n";
      return 2;
    }
  // Every mutant must be caught, also with --skip (which stands for a deleted check). With --only
  // a mutant is required only where its owner runs; the others are shown for information.
  const bool all_required = opt.only.empty();
  auto selected = [&](const char* id) {
    for (const Statement* s : sel)
      if (s->id == id) return true;
    return false;
  };

  std::cout << "kla proofs_check --mutants: " << kla::ref::all_mutants.size()
            << " planted faults x " << sel.size() << " statements, " << opt.cases
            << " cases each, seed " << opt.seed << "\n\n";
  std::vector<std::string> col;
  for (const Statement* s : sel) {
    const Ownership* o = owner_entry(s->id);
    col.push_back(o ? o->column : s->id.substr(0, 4));
  }
  int name_w = 8;  // the longest mutant name and a space
  for (const Mutant m : kla::ref::all_mutants)
    name_w = std::max(name_w, int(kla::ref::mutant_name(m).size()) + 1);
  const int owner_w = 7, cell_w = 5;
  std::cout << std::left << std::setw(name_w) << "mutant" << std::setw(owner_w) << "owner";
  for (const auto& c : col) std::cout << std::setw(cell_w) << c;
  std::cout << "caught by\n"
            << std::string(name_w + owner_w + cell_w * col.size() + 9, '-') << "\n";

  std::vector<int> own_rejected(sel.size(), 0);
  int survived = 0, errors = 0;
  for (const auto m : kla::ref::all_mutants) {
    const Ownership* owner = owner_of(m);
    std::vector<Verdict> v;
    {
      const MuteStderr mute;
      kla::ref::active_mutant() = m;
      for (const Statement* s : sel) v.push_back(run_silent(*s, opt));
      kla::ref::active_mutant() = Mutant::none;
    }
    int caught = 0;
    std::cout << std::left << std::setw(name_w) << kla::ref::mutant_name(m) << std::setw(owner_w)
              << (owner ? owner->column : "gross");
    for (size_t i = 0; i < sel.size(); ++i) {
      const bool own = owner && sel[i]->id == owner->id;
      const char* mark = v[i] == Verdict::error     ? "?"
                         : v[i] == Verdict::rejects ? (own ? "X" : "x")
                                                    : (own ? "o" : ".");
      std::cout << std::setw(cell_w) << mark;
      caught += v[i] == Verdict::rejects;
      errors += v[i] == Verdict::error;
      if (own && v[i] == Verdict::rejects) ++own_rejected[i];
    }
    const bool required = all_required || (owner && selected(owner->id));
    if (caught)
      std::cout << caught;
    else
      std::cout << (required ? "SURVIVED" : "0 (not required)");
    std::cout << std::endl;
    survived += required && !caught;
  }
  std::cout << "\nX rejects its own mutant, x rejects another, . holds, o misses its own, ? gave "
               "up or errored\n\n";

  int without_own = 0;
  auto own_list = [](const Ownership* o) {
    std::string own;
    if (o)
      for (const auto m : o->own)
        own += (own.empty() ? "" : ", ") + std::string(kla::ref::mutant_name(m));
    return own;
  };
  int own_w = 50;
  for (const Statement* s : sel)
    own_w = std::max(own_w, static_cast<int>(own_list(owner_entry(s->id)).size()) + 2);
  std::cout << std::left << std::setw(24) << "statement" << std::setw(6) << "col"
            << std::setw(own_w) << "own mutants"
            << "rejects its own mutant\n"
            << std::string(static_cast<size_t>(24 + 6 + own_w + 22), '-') << "\n";
  for (size_t i = 0; i < sel.size(); ++i) {
    const Ownership* o = owner_entry(sel[i]->id);
    const std::string own = own_list(o);
    std::cout << std::setw(24) << sel[i]->id << std::setw(6) << col[i] << std::setw(own_w)
              << (o ? own : "(none in the table)") << (own_rejected[i] ? "yes" : "NO") << std::endl;
    without_own += own_rejected[i] == 0;
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "\n"
            << kla::ref::all_mutants.size() << " mutants: " << survived << " survived; "
            << sel.size() << " statements: " << without_own << " reject none of their own"
            << (errors ? "; " + std::to_string(errors) + " runs gave up or errored" : "") << "  ("
            << std::fixed << std::setprecision(1) << sec << " s)\n"
            << (survived || without_own || errors ? "mutant check FAILED" : "mutant check passed")
            << std::endl;
  return survived || without_own || errors ? 1 : 0;
#else
  (void)opt;
  (void)sel;
  std::cerr << "proofs_check: built without KLA_REF_MUTANTS\n";
  return 2;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "proofs_check: " << name << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--only")
        opt.only.insert(value("--only"));
      else if (a == "--skip")
        opt.skip.insert(value("--skip"));
      else if (a == "--cases")
        opt.cases = std::stoi(value("--cases"));
      else if (a == "--seed") {
        opt.seed = std::stoull(value("--seed"));
        opt.seed_given = true;
      } else if (a == "--mutants")
        opt.mutants = true;
      else if (a == "--list")
        opt.list = true;
      else if (a == "-h" || a == "--help") {
        usage(std::cout);
        return 0;
      } else {
        std::cerr << "proofs_check: unknown argument '" << a << "'\n";
        usage(std::cerr);
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << "proofs_check: bad number for " << a << "\n";
      return 2;
    }
  }
  if (opt.cases < 1) {
    std::cerr << "proofs_check: --cases must be >= 1\n";
    return 2;
  }
  if (const char* s = std::getenv("KLA_PROOFS_SCALE")) {
    const double f = std::atof(s);
    if (f > 0) opt.cases = std::max(1, static_cast<int>(opt.cases * f));
  }
  if (!opt.seed_given) opt.seed = std::random_device{}();

  std::vector<const Statement*> sel;
  for (const auto& s : registry())
    if ((opt.only.empty() || opt.only.count(s.id)) && !opt.skip.count(s.id)) sel.push_back(&s);
  // Registration order depends on how the files were batched; print in id order.
  std::sort(sel.begin(), sel.end(),
            [](const Statement* a, const Statement* b) { return a->id < b->id; });
  std::set<std::string> named = opt.only;
  named.insert(opt.skip.begin(), opt.skip.end());
  for (const auto& id : named) {
    bool found = false;
    for (const auto& s : registry()) found |= s.id == id;
    if (!found) {
      std::cerr << "proofs_check: no statement '" << id << "' (try --list)\n";
      return 2;
    }
  }
  if (opt.list) {
    for (const Statement* s : sel) std::cout << s->id << "\t" << s->paper << "\n";
    return 0;
  }
  return opt.mutants ? run_mutants(opt, sel) : run_statements(opt, sel);
}
