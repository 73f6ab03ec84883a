// The runs behind the sections' sweeps: a case (one problem in every storage dtype, with its
// ground truths) and a batch that computes its cases' truths and column runs in parallel.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "report/columns.hpp"
#include "report/common.hpp"

namespace kla::report {

/// The storage dtypes every case is rounded to (each with its own ground truth).
inline const std::vector<Storage> kStorages = {Storage::fp32, Storage::bf16, Storage::fp16};

/// One problem in every storage dtype, with its ground truths: truth[s] on the inputs rounded
/// to s, and `truth_unrounded` on the unrounded (fp64) inputs for the error including rounding.
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

/// Rounds c.raw to every storage dtype and queues c's truths.
void queue_truths(Case& c, std::vector<Job>& jobs);
/// Queues column b's run of c with algorithm a, written to *out.
void queue_run(Case& c, const Backend& b, const Algo& a, RunResult* out, std::vector<Job>& jobs);
/// Computes every job on `threads` threads, most expensive first, with a progress line `label`.
void run_jobs(std::vector<Job>& jobs, const std::string& label, int threads);

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

/// A section's sweep: its cases, each run on every column for every algorithm the column
/// supports. runs() lists them in the order added (cases, then columns, then algorithms).
template <class Tag>
class Batch {
 public:
  Batch(const Backends& bk, std::vector<Algo> algos) : bk_(bk), algos_(std::move(algos)) {}

  /// Adds the case of inputs `raw` (fp64) and stabiliser eps, whose runs carry `tag`.
  void add(Problem raw, double eps, const Tag& tag) {
    cases_.push_back(std::make_unique<Case>());
    Case& c = *cases_.back();
    c.raw = std::move(raw);
    c.eps = eps;
    queue_truths(c, jobs_);
    for (const auto& b : bk_)
      for (const Algo& a : algos_) {
        if (!b->supports(a)) continue;
        runs_.push_back(std::make_unique<Run<Tag>>(Run<Tag>{&c, b.get(), a, tag, {}}));
        queue_run(c, *b, a, &runs_.back()->r, jobs_);
      }
  }

  /// Computes every truth and run added so far.
  void run(const std::string& label, int threads) { run_jobs(jobs_, label, threads); }

  const std::vector<std::unique_ptr<Run<Tag>>>& runs() const { return runs_; }

 private:
  const Backends& bk_;
  std::vector<Algo> algos_;
  std::vector<std::unique_ptr<Case>> cases_;  // owned here: jobs and runs point into them
  std::vector<Job> jobs_;
  std::vector<std::unique_ptr<Run<Tag>>> runs_;
};

}  // namespace kla::report
