// The runs behind the sections' sweeps (see runs.hpp).
#include "report/runs.hpp"

#include <algorithm>

#include "report/util.hpp"

namespace kla::report {

namespace {

/// Estimated cost of a job, only to order the work (most expensive first).
double job_cost(const Problem& p, const Backend* b, const Algo& a) {
  const double base = double(p.T) * p.dk * p.dv;
  if (!b) return base * 12;  // MPFR ~12x the cost of an emulated op
  const double dtype = b->unit_roundoff() > 1e-5 ? 3.0 : 0.5;
  return base * dtype * (a.chunked ? 1.5 + a.chunk / 32.0 : 1.0);
}

}  // namespace

void queue_truths(Case& c, std::vector<Job>& jobs) {
  for (Storage s : kStorages) {
    c.stored[s] = c.raw.rounded(s);
    jobs.push_back({&c, s, nullptr, {}, &c.truth[s], job_cost(c.raw, nullptr, {})});
  }
  jobs.push_back(
      {&c, Storage::fp64, nullptr, {}, &c.truth_unrounded, job_cost(c.raw, nullptr, {})});
}

void queue_run(Case& c, const Backend& b, const Algo& a, RunResult* out, std::vector<Job>& jobs) {
  jobs.push_back({&c, b.storage(), &b, a, out, job_cost(c.raw, &b, a)});
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

}  // namespace kla::report
