// proofs_check: runs every statement of SPEC §2 as a RapidCheck property over exact rationals
// and prints a table (id, paper reference, cases, result; for a failure the shrunk
// counterexample and how to reproduce it). With --mutants it plants each fault of
// kla/ref/mutants.hpp in turn and requires that at least one statement rejects it.
//
// Exit status: 0 when every selected statement holds (or every mutant is caught), 1 otherwise,
// 2 on bad usage.
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
  int cases = 100;
  std::uint64_t seed = 0;
  bool seed_given = false;
  bool mutants = false;
  bool list = false;
};

void usage(std::ostream& os) {
  os << "usage: proofs_check [--list] [--only ID]... [--cases N] [--seed S] [--mutants]\n"
        "  --list       print the statement ids and exit\n"
        "  --only ID    run only this statement (repeatable)\n"
        "  --cases N    random cases per statement (default 100, times $KLA_PROOFS_SCALE)\n"
        "  --seed S     RapidCheck seed (default: random, printed)\n"
        "  --mutants    plant each fault and require some statement to reject it\n";
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

int run_mutants(const Options& opt, const std::vector<const Statement*>& sel) {
#ifdef KLA_REF_MUTANTS
  std::cout << "kla proofs_check --mutants: each planted fault must be rejected by some "
               "statement (seed "
            << opt.seed << ")\n\n";
  int survived = 0;
  for (const auto m : kla::ref::all_mutants) {
    kla::ref::active_mutant() = m;
    std::vector<std::string> killers;
    for (const Statement* s : sel)
      if (!run(*s, opt, true).passed) killers.push_back(s->id);
    kla::ref::active_mutant() = kla::ref::Mutant::none;
    std::cout << std::left << std::setw(20) << kla::ref::mutant_name(m)
              << (killers.empty() ? "SURVIVED" : "rejected by");
    for (const auto& k : killers) std::cout << " " << k;
    std::cout << std::endl;
    survived += killers.empty();
  }
  std::cout << "\n"
            << (kla::ref::all_mutants.size() - survived) << " passed, " << survived << " failed"
            << std::endl;
  return survived ? 1 : 0;
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
    if (opt.only.empty() || opt.only.count(s.id)) sel.push_back(&s);
  // Registration order depends on how the files were batched; print in id order.
  std::sort(sel.begin(), sel.end(),
            [](const Statement* a, const Statement* b) { return a->id < b->id; });
  for (const auto& id : opt.only) {
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
