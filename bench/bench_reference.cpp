// CPU reference cost (issue 6): the tokenwise recurrence and the chunkwise form of kla::ref in
// double and in MPFR (134 bits), one head, tokens per second. These are the ground-truth paths of
// the tests and of the precision report; the numbers say how long a reference check of a given
// size takes. Benchmarks whose names end in "/smoke" are the small ones that ctest runs
// (bench.reference_smoke); the others take seconds each.
//
//   kla_bench_reference                                    # everything
//   kla_bench_reference --benchmark_filter=/smoke$ --benchmark_min_time=0.01
#include <cmath>
#include <random>
#include <string>

#include <benchmark/benchmark.h>

#include "kla/ref/chunk.hpp"
#include "kla/ref/recurrence.hpp"

namespace {

using kla::ref::HeadInputs;
using kla::ref::Mat;
using kla::ref::Mpfr;
using kla::ref::Options;
using kla::ref::scalar_cast;
using kla::ref::Vec;

/// One head of random inputs (never zeros): q, k, v ~ N(0,1), scalar decay alpha in [0.9, 1),
/// eta in [0.5, 1). The same draws for every scalar type (rounded once from double).
template <class T>
HeadInputs<T> make_inputs(Eigen::Index len, Eigen::Index d, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> decay(0.9, 1.0), gate(0.5, 1.0);
  HeadInputs<T> in;
  in.q.resize(len, d);
  in.k.resize(len, d);
  in.v.resize(len, d);
  in.eta.resize(len);
  in.alpha.resize(len, 1);
  for (Eigen::Index t = 0; t < len; ++t) {
    for (Eigen::Index j = 0; j < d; ++j) {
      in.q(t, j) = scalar_cast<T>(normal(rng));
      in.k(t, j) = scalar_cast<T>(normal(rng));
      in.v(t, j) = scalar_cast<T>(normal(rng));
    }
    in.eta(t) = scalar_cast<T>(gate(rng));
    in.alpha(t, 0) = scalar_cast<T>(decay(rng));
  }
  return in;
}

template <class T>
Options<T> make_options(Eigen::Index d) {
  Options<T> opt;
  opt.eps = scalar_cast<T>(1e-6);
  opt.scale = scalar_cast<T>(1.0 / std::sqrt(double(d)));
  return opt;
}

enum class Form { tokenwise, chunkwise };

template <class T>
void run(benchmark::State& state, Form form, Eigen::Index len, Eigen::Index d, Eigen::Index chunk) {
  const HeadInputs<T> in = make_inputs<T>(len, d, 0x6b6c61u + unsigned(len * 131 + d));
  const Options<T> opt = make_options<T>(d);
  for (auto _ : state) {
    kla::ref::HeadOutputs<T> out = form == Form::tokenwise
                                       ? kla::ref::recurrent_forward(in, opt)
                                       : kla::ref::chunk_forward(in, opt, chunk);
    benchmark::DoNotOptimize(out.o.data());
    benchmark::DoNotOptimize(out.state.data());
  }
  state.SetItemsProcessed(state.iterations() * len);
  state.counters["tokens/s"] =
      benchmark::Counter(double(len), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["time/token"] = benchmark::Counter(
      double(len), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

template <class T>
void add(const std::string& scalar, Form form, Eigen::Index len, Eigen::Index d, Eigen::Index chunk,
         bool smoke) {
  std::string name = std::string("reference/") +
                     (form == Form::tokenwise ? "tokenwise" : "chunkwise") + "/" + scalar + "/T" +
                     std::to_string(len) + "/D" + std::to_string(d);
  if (form == Form::chunkwise) name += "/C" + std::to_string(chunk);
  if (smoke) name += "/smoke";
  benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
    run<T>(st, form, len, d, chunk);
  })->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  // dk = dv = D, scalar decay, Kaczmarz coefficient, eps = 1e-6, chunks of 64 tokens.
  for (Form f : {Form::tokenwise, Form::chunkwise}) {
    add<double>("double", f, 1024, 64, 64, true);
    add<double>("double", f, 1024, 128, 64, false);
    add<Mpfr>("mpfr134", f, 64, 32, 32, true);
    add<Mpfr>("mpfr134", f, 128, 128, 64, false);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
