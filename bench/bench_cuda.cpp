// CUDA kernel benchmarks (issue 6; docs/performance.md), Google Benchmark over the C ABI.
//
//   prefill  kla_chunk_forward at B x T x H in {1x32768x16, 4x8192x16, 1x131072x8, 8x4096x16},
//            K = V = 128, and the paper's model shape 1x32768x12 with K = 96, V = 192; in fp32
//            also with kla_params.arithmetic = FAST ("fp32_fast"); in bf16 also 1x32768x16
//            without a workspace ("no_workspace": the generic kernel)
//   decode   kla_tokenwise_forward, one token, B in {1, 8, 64, 256}, H = 16, K = V = 128, fp32
//            state updated in place; back-to-back launches ("launch") and replays of a captured
//            CUDA graph ("graph")
//   copy     cudaMemcpy device to device, 1 GiB: the copy rate (bytes read + written) that the
//            floors below are measured against, in the same run
// all in fp32, bf16 and fp16 (q, k, v, o), with fp32 g and eta.
//
// Method: CUDA events around the timed region (manual time), warm-up before timing, every
// repetition reports its iterations' median as `median_us` (the run's default is 10 repetitions,
// aggregates only: read the `_median` rows). A prefill iteration is one call; a decode iteration
// is a region of max(16, sets) calls (30 per repetition), its time divided by the calls. Inputs are
// random (never zeros) and rotated among as many buffer sets as make more than 2.2x the L2 cache,
// so no call finds its inputs in L2. Before timing, each case poisons its output with NaN, runs
// once and checks that the output was written and is finite.
//
// Counters: median_us (per call), ns/head-token, TB/s (floor bytes / time), floor_us (floor bytes
// at the copy rate measured at start-up), floor_frac (floor / time), sets (rotation).
// Floor bytes: prefill reads q, k, v and writes o once in the call's dtype, reads g and eta in fp32
// (1032 B per head-token in bf16 at K = V = 128); decode adds the fp32 state read and written.
// Inputs are laid out and converted by tests/cuda/kernel_inputs.hpp, as in the GPU tests.
//
//   kla_bench_cuda [--benchmark_filter=REGEX] [--benchmark_out=FILE --benchmark_out_format=json]
//                  [--kla_no_gpu_exit_code=N]   (default 0: no GPU is not an error)
//                  [--kla_summary=FILE]   also print the medians as Markdown tables (decode, then
//                                         prefill) and write them to FILE: the benchmark table of
//                                         tools/gpu_suite.sh
// One prefill shape alone (kernel tuning): --benchmark_filter='prefill/bf16/1x32768x16/K128V128$'
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include "kernel_inputs.hpp"
#include "kla/kla.h"

namespace {

using kla::test::dtype_name;
using kla::test::dtype_size;
using kla::test::Shape;

/// Process-wide state: the stream every case runs on, the L2 size and the copy rate.
struct Globals {
  cudaStream_t stream = nullptr;
  size_t l2_bytes = 0;
  double copy_bytes_per_s = 0;  // bytes read + written per second
  std::string gpu;
};
Globals G;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- random device data -------------------------------------------------------------------------
// One device pool of random values per kind of tensor, filled once from the host; buffers are
// filled by device-to-device copies from the pool at varying offsets (fast, never zeros).
enum class Fill { unit_fp32, unit_bf16, unit_fp16, log_decay, eta, state, count };

/// The dtype a pool's values are stored in (the unit pools serve q, k, v and o of each dtype).
kla_dtype storage_dtype(Fill kind) {
  return kind == Fill::unit_bf16   ? KLA_DTYPE_BF16
         : kind == Fill::unit_fp16 ? KLA_DTYPE_FP16
                                   : KLA_DTYPE_FP32;
}

class Pools {
 public:
  static constexpr size_t kElems = size_t(1) << 22;  // 4 Mi values per pool

  Pools() {
    std::mt19937_64 rng(0x6b6c61);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f), decay(-0.2f, -0.005f),
        gate(0.3f, 1.0f), st(-0.05f, 0.05f);
    std::vector<float> f(kElems);
    for (int k = 0; k < int(Fill::count); ++k) {
      const Fill kind = Fill(k);
      for (float& x : f) {
        switch (kind) {
          case Fill::log_decay: x = decay(rng); break;
          case Fill::eta: x = gate(rng); break;
          case Fill::state: x = st(rng); break;
          default: x = unit(rng); break;
        }
      }
      const std::vector<unsigned char> bytes =
          kla::test::encode(storage_dtype(kind), f.data(), kElems);
      KLA_CUDA_CHECK(cudaMalloc(&pool_[k], bytes.size()));
      KLA_CUDA_CHECK(cudaMemcpy(pool_[k], bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
      bytes_[k] = bytes.size();
    }
  }
  ~Pools() {
    for (void* p : pool_) cudaFree(p);
  }
  Pools(const Pools&) = delete;
  Pools& operator=(const Pools&) = delete;

  /// Fills `bytes` at dst from the pool of `kind`, starting at an offset chosen by `seed`.
  void fill(void* dst, size_t bytes, Fill kind, uint64_t seed) const {
    const size_t pb = bytes_[int(kind)];
    const char* src = static_cast<const char*>(pool_[int(kind)]);
    size_t done = 0;
    for (uint64_t i = 0; done < bytes; ++i) {
      const size_t off =
          size_t(((seed + i) * 0x9E3779B97F4A7C15ull) >> 20) % (pb / 2) & ~size_t(15);
      const size_t n = std::min(bytes - done, pb - off);
      KLA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + done, src + off, n,
                                     cudaMemcpyDeviceToDevice, G.stream));
      done += n;
    }
  }

 private:
  void* pool_[int(Fill::count)] = {};
  size_t bytes_[int(Fill::count)] = {};
};
Pools* g_pools = nullptr;

// ---- one benchmark case -------------------------------------------------------------------------
struct Case {
  bool decode;
  Shape shape;
  bool workspace = true;   // prefill: pass the fast path's workspace; false: the generic kernel
  bool fp32_fast = false;  // fp32 prefill with kla_params.arithmetic = FAST

  double head_tokens() const { return double(shape.gate_elems()); }
  /// The fewest bytes a call must move (see the file comment).
  double floor_bytes() const {
    const double es = double(dtype_size(shape.dtype));
    double b = 2.0 * es * double(shape.qk_elems() + shape.v_elems()) + 8.0 * shape.gate_elems();
    if (decode) b += 2.0 * 4.0 * double(shape.state_elems());
    return b;
  }
  std::string name(const char* variant) const {
    const Shape& s = shape;
    char n[160];
    if (decode)
      std::snprintf(n, sizeof n, "decode/%s/B%dxH%d/K%dV%d/%s", dtype_name(s.dtype), s.B, s.H, s.K,
                    s.V, variant);
    else
      std::snprintf(n, sizeof n, "prefill/%s%s/%dx%dx%d/K%dV%d%s", dtype_name(s.dtype),
                    fp32_fast ? "_fast" : "", s.B, s.T, s.H, s.K, s.V,
                    workspace ? "" : "/no_workspace");
    return n;
  }
};

/// Buffer sets for one case, enough of them to total more than 2.2x L2; params[i] uses set i.
class Rotation {
 public:
  explicit Rotation(const Case& c) : c_(c) {
    const Shape& s = c.shape;
    const size_t es = dtype_size(s.dtype);
    const size_t nqk = s.qk_elems(), nv = s.v_elems(), ng = s.gate_elems(), ns = s.state_elems();
    auto up16 = [](size_t b) { return (b + 255) / 256 * 256; };
    set_bytes_ =
        up16(nqk * es) * 2 + up16(nv * es) * 2 + up16(ng * 4) * 2 + (c.decode ? up16(ns * 4) : 0);
    size_t n = size_t(std::ceil(2.2 * double(G.l2_bytes) / double(set_bytes_)));
    n = std::clamp<size_t>(n, 1, 256);
    size_t free_b = 0, total_b = 0;
    KLA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    while (n > 1 && n * set_bytes_ > free_b / 2) --n;

    const Fill unit = s.dtype == KLA_DTYPE_FP32   ? Fill::unit_fp32
                      : s.dtype == KLA_DTYPE_BF16 ? Fill::unit_bf16
                                                  : Fill::unit_fp16;
    const kla::test::Strides layout = kla::test::row_major_strides(s);
    for (size_t i = 0; i < n; ++i) {
      kla_params p = kla::test::shaped_params(s, layout);
      const uint64_t seed = 16 * i;
      p.q = alloc(nqk * es, unit, seed + 1);
      p.k = alloc(nqk * es, unit, seed + 2);
      p.v = alloc(nv * es, unit, seed + 3);
      p.o = alloc(nv * es, unit, seed + 4);
      p.g = static_cast<const float*>(alloc(ng * 4, Fill::log_decay, seed + 5));
      p.eta = static_cast<const float*>(alloc(ng * 4, Fill::eta, seed + 6));
      p.eps = 1e-6f;
      p.arithmetic = c.fp32_fast ? KLA_ARITHMETIC_FAST : KLA_ARITHMETIC_ACCURATE;
      if (c.decode) {
        float* s = static_cast<float*>(alloc(ns * 4, Fill::state, seed + 7));
        p.initial_state = s;
        p.final_state = s;  // in place, as a server updates its state
      }
      params_.push_back(p);
    }
#if KLA_ABI_VERSION >= 2
    // The chunkwise fast path's scratch: one for all sets (the calls run one after another on
    // one stream). Its traffic is the kernel's own cost, not part of the floor. Without it the
    // library runs the workspace-free generic kernel.
    if (!c.decode && c.workspace) {
      const size_t ws = kla_workspace_size(&params_[0]);
      if (ws > 0) {
        void* w = nullptr;
        KLA_CUDA_CHECK(cudaMalloc(&w, ws));
        allocs_.push_back(w);
        for (kla_params& p : params_) {
          p.workspace = w;
          p.workspace_size = ws;
        }
      }
    }
#endif
    KLA_CUDA_CHECK(cudaStreamSynchronize(G.stream));
  }
  ~Rotation() {
    for (void* p : allocs_) cudaFree(p);
  }
  Rotation(const Rotation&) = delete;
  Rotation& operator=(const Rotation&) = delete;

  size_t size() const {
    return params_.size();
  }
  const kla_params& operator[](size_t i) const {
    return params_[i % params_.size()];
  }

  /// Poisons set 0's output with NaN, runs `call` once on it and checks that o is finite
  /// (written) at its start and end. Returns an error message, empty if fine.
  template <class Call>
  std::string check_output(Call call) const {
    const kla_params& p = params_[0];
    const size_t es = dtype_size(c_.shape.dtype);
    const size_t n = c_.shape.v_elems();  // o has v's shape
    KLA_CUDA_CHECK(cudaMemsetAsync(p.o, 0xFF, n * es, G.stream));
    if (kla_status s = call(p))
      return std::string(kla_status_string(s)) + ": " + kla_last_error_message();
    KLA_CUDA_CHECK(cudaStreamSynchronize(G.stream));
    KLA_CUDA_CHECK(cudaGetLastError());
    const size_t m = std::min<size_t>(n, 1 << 16);
    for (size_t start : {size_t(0), n - m}) {
      std::vector<unsigned char> h(m * es);
      KLA_CUDA_CHECK(cudaMemcpy(h.data(), static_cast<const char*>(p.o) + start * es, m * es,
                                cudaMemcpyDeviceToHost));
      const std::vector<float> x = kla::test::decode(c_.shape.dtype, h.data(), m);
      for (size_t i = 0; i < m; ++i)
        if (!std::isfinite(x[i]))
          return "output element " + std::to_string(start + i) + " not written or not finite";
    }
    return {};
  }

 private:
  void* alloc(size_t bytes, Fill kind, uint64_t seed) {
    void* p = nullptr;
    KLA_CUDA_CHECK(cudaMalloc(&p, bytes));
    allocs_.push_back(p);
    g_pools->fill(p, bytes, kind, seed);
    return p;
  }

  Case c_;
  size_t set_bytes_ = 0;
  std::vector<kla_params> params_;
  std::vector<void*> allocs_;
};

/// The buffer sets of the case being measured. Google Benchmark calls a benchmark function once
/// per repetition (and while it sizes the iteration count), so the sets of the last case are kept
/// and reused while the same case runs (decode's "launch" and "graph" share them); the output
/// check runs once, when they are made.
std::unique_ptr<Rotation> g_rot;
std::string g_rot_key, g_rot_error;

/// The sets of case `c`, or null where its output check failed (`st` is then marked skipped with
/// the reason, for every repetition).
template <class Call>
const Rotation* rotation_for(benchmark::State& st, const Case& c, Call call) {
  const std::string key = c.name("");
  if (!g_rot || key != g_rot_key) {
    g_rot.reset();
    g_rot_key.clear();
    g_rot = std::make_unique<Rotation>(c);
    g_rot_key = key;
    g_rot_error = g_rot->check_output(call);
  }
  if (g_rot_error.empty()) return g_rot.get();
  st.SkipWithError(g_rot_error.c_str());
  return nullptr;
}

/// Events around the timed region; per-iteration seconds are kept for the median.
struct Timer {
  cudaEvent_t a = nullptr, b = nullptr;
  std::vector<double> seconds;
  Timer() {
    KLA_CUDA_CHECK(cudaEventCreate(&a));
    KLA_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start() { KLA_CUDA_CHECK(cudaEventRecord(a, G.stream)); }
  /// Ends the region; returns its seconds divided by `calls`.
  double stop(int calls) {
    KLA_CUDA_CHECK(cudaEventRecord(b, G.stream));
    KLA_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KLA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    const double s = 1e-3 * double(ms) / calls;
    seconds.push_back(s);
    return s;
  }
};

void set_counters(benchmark::State& st, const Case& c, const Timer& t, size_t sets) {
  const double s = median(t.seconds);
  if (s <= 0) return;
  const double floor_s = c.floor_bytes() / G.copy_bytes_per_s;
  st.counters["median_us"] = 1e6 * s;
  st.counters["ns/head-token"] = 1e9 * s / c.head_tokens();
  st.counters["TB/s"] = c.floor_bytes() / s / 1e12;
  st.counters["floor_us"] = 1e6 * floor_s;
  st.counters["floor_frac"] = floor_s / s;
  st.counters["sets"] = double(sets);
}

kla_status call_chunk(const kla_params& p) {
  return kla_chunk_forward(&p, G.stream);
}
kla_status call_tokenwise(const kla_params& p) {
  return kla_tokenwise_forward(&p, G.stream);
}

void bench_prefill(benchmark::State& st, Case c) {
  try {
    const Rotation* checked = rotation_for(st, c, call_chunk);
    if (!checked) return;
    const Rotation& rot = *checked;
    for (size_t i = 0; i < 3; ++i) (void)call_chunk(rot[i]);
    KLA_CUDA_CHECK(cudaStreamSynchronize(G.stream));
    Timer t;
    size_t i = 0;
    for (auto _ : st) {
      t.start();
      const kla_status s = call_chunk(rot[i++]);
      const double sec = t.stop(1);
      if (s != KLA_SUCCESS) {
        st.SkipWithError(kla_last_error_message());
        break;
      }
      st.SetIterationTime(sec);
    }
    set_counters(st, c, t, rot.size());
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

void bench_decode(benchmark::State& st, Case c, bool graph) {
  try {
    const Rotation* checked = rotation_for(st, c, call_tokenwise);
    if (!checked) return;
    const Rotation& rot = *checked;
    // Each timed region covers `calls` calls walking the rotation (at least 16).
    const int calls = int(std::max<size_t>(rot.size(), 16));
    cudaGraphExec_t exec = nullptr;
    if (graph) {
      cudaGraph_t g = nullptr;
      KLA_CUDA_CHECK(cudaStreamBeginCapture(G.stream, cudaStreamCaptureModeThreadLocal));
      kla_status bad = KLA_SUCCESS;
      for (int i = 0; i < calls; ++i)
        if (kla_status s = call_tokenwise(rot[size_t(i)])) bad = s;
      KLA_CUDA_CHECK(cudaStreamEndCapture(G.stream, &g));
      if (bad != KLA_SUCCESS) {
        cudaGraphDestroy(g);
        st.SkipWithError(kla_last_error_message());
        return;
      }
      KLA_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
      KLA_CUDA_CHECK(cudaGraphDestroy(g));
    }
    auto region = [&](size_t& i) {
      if (graph) {
        KLA_CUDA_CHECK(cudaGraphLaunch(exec, G.stream));
        return KLA_SUCCESS;
      }
      kla_status bad = KLA_SUCCESS;
      for (int j = 0; j < calls; ++j)
        if (kla_status s = call_tokenwise(rot[i++])) bad = s;
      return bad;
    };
    size_t i = 0;
    for (int w = 0; w < 3; ++w) (void)region(i);
    KLA_CUDA_CHECK(cudaStreamSynchronize(G.stream));
    Timer t;
    for (auto _ : st) {
      t.start();
      const kla_status s = region(i);
      const double sec = t.stop(calls);
      if (s != KLA_SUCCESS) {
        st.SkipWithError(kla_last_error_message());
        break;
      }
      st.SetIterationTime(sec);
    }
    if (exec) KLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    set_counters(st, c, t, rot.size());
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

struct CopyBuffers {
  void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = size_t(1) << 30;
  CopyBuffers() {
    KLA_CUDA_CHECK(cudaMalloc(&src, bytes));
    KLA_CUDA_CHECK(cudaMalloc(&dst, bytes));
    g_pools->fill(src, bytes, Fill::unit_fp32, 99);
    KLA_CUDA_CHECK(cudaStreamSynchronize(G.stream));
  }
  ~CopyBuffers() {
    cudaFree(src);
    cudaFree(dst);
  }
  CopyBuffers(const CopyBuffers&) = delete;
  CopyBuffers& operator=(const CopyBuffers&) = delete;
  void copy() const {
    KLA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, G.stream));
  }
};

/// Median copy rate (bytes read + written per second) of `reps` 1 GiB copies after warm-up.
double measure_copy(int reps) {
  CopyBuffers cb;
  Timer t;
  for (int i = 0; i < 3; ++i) cb.copy();
  for (int i = 0; i < reps; ++i) {
    t.start();
    cb.copy();
    t.stop(1);
  }
  return 2.0 * double(cb.bytes) / median(t.seconds);
}

void bench_copy(benchmark::State& st) {
  try {
    CopyBuffers cb;
    Timer t;
    for (int i = 0; i < 3; ++i) cb.copy();
    for (auto _ : st) {
      t.start();
      cb.copy();
      st.SetIterationTime(t.stop(1));
    }
    const double s = median(t.seconds);
    st.counters["median_us"] = 1e6 * s;
    st.counters["TB/s"] = 2.0 * double(cb.bytes) / s / 1e12;
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

/// Every case (see the file comment), in the order they run: prefill, decode, and last the
/// workspace-free generic kernel (about 13x slower than the fast path), so that a run cut short by
/// its time limit (bench/run_side_by_side.sh) loses the least.
std::vector<Case> all_cases() {
  const kla_dtype dts[] = {KLA_DTYPE_BF16, KLA_DTYPE_FP16, KLA_DTYPE_FP32};
  auto prefill_shapes = [](kla_dtype dt) {
    return std::vector<Shape>{{dt, 1, 32768, 16, 16, 128, 128},
                              {dt, 4, 8192, 16, 16, 128, 128},
                              {dt, 1, 131072, 8, 8, 128, 128},
                              {dt, 8, 4096, 16, 16, 128, 128},
                              {dt, 1, 32768, 12, 12, 96, 192}};
  };
  std::vector<Case> cases;
  for (kla_dtype dt : dts)
    for (const Shape& s : prefill_shapes(dt)) cases.push_back({false, s});
  for (const Shape& s : prefill_shapes(KLA_DTYPE_FP32))  // arithmetic FAST
    cases.push_back({false, s, true, true});
  for (kla_dtype dt : dts)
    for (int B : {1, 8, 64, 256}) cases.push_back({true, {dt, B, 1, 16, 16, 128, 128}});
  cases.push_back({false, {KLA_DTYPE_BF16, 1, 32768, 16, 16, 128, 128}, false});
  return cases;
}

// ---- the summary tables (--kla_summary) ---------------------------------------------------------
/// Displays as the plain console reporter does and keeps each benchmark's median counters (or its
/// error, where no repetition succeeded) for the summary tables.
class MedianCollector : public benchmark::ConsoleReporter {
 public:
  struct Result {
    benchmark::UserCounters counters;  // empty where no repetition succeeded
    std::string error;
  };

  MedianCollector() : ConsoleReporter(OO_None) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      Result& res = results_[r.run_name.function_name];
      if (r.error_occurred)
        res.error = r.error_message;
      else if (r.run_type == Run::RT_Iteration || r.aggregate_name == "median")
        res.counters = r.counters;  // aggregates come after the repetitions: the median wins
    }
    ConsoleReporter::ReportRuns(runs);
  }

  /// The median time per call of the benchmark registered as `name`, in microseconds; 0 where it
  /// has none, `why` then saying so (empty: it did not run, e.g. filtered out).
  double median_us(const std::string& name, std::string& why) const {
    why.clear();
    const auto it = results_.find(name);
    if (it == results_.end()) return 0;
    const auto us = it->second.counters.find("median_us");
    if (us != it->second.counters.end() && us->second.value > 0) return us->second.value;
    why = "error: " + (it->second.error.empty() ? std::string("no timing") : it->second.error);
    return 0;
  }

 private:
  std::map<std::string, Result> results_;
};

std::string format(const char* fmt, double x) {
  char s[64];
  std::snprintf(s, sizeof s, fmt, x);
  return s;
}

/// The tables tools/gpu_suite.sh prints last: decode (back-to-back launches and graph replay side
/// by side, as a fraction of the copy rate) and prefill, each case's median against its floor.
/// Cases that did not run are left out.
std::string summary_markdown(const MedianCollector& results, const std::vector<Case>& cases,
                             const cudaDeviceProp& prop) {
  std::string out = "kla_bench_cuda: " + std::string(prop.name) + " (" +
                    std::to_string(prop.multiProcessorCount) + " SMs), copy rate " +
                    format("%.2f", G.copy_bytes_per_s / 1e12) +
                    " TB/s (1 GiB device copy, bytes read + written); medians of CUDA-event "
                    "timings\n\n| decode (T=1, fp32 state in place) | dtype | us/call | graph "
                    "us/call | floor us | fraction of copy rate (launch / graph) |\n"
                    "|---|---|---|---|---|---|\n";
  auto cell = [](double us, const std::string& why, const char* fmt, double scale) {
    return us > 0 ? format(fmt, us * scale) : why.empty() ? "-" : why;
  };
  auto fraction = [](double floor_us, double us) {
    return us > 0 ? format("%.0f%%", 100.0 * floor_us / us) : "-";
  };
  for (const Case& c : cases) {
    if (!c.decode) continue;
    std::string why_launch, why_graph;
    const double launch = results.median_us(c.name("launch"), why_launch);
    const double graph = results.median_us(c.name("graph"), why_graph);
    if (launch <= 0 && graph <= 0 && why_launch.empty() && why_graph.empty()) continue;
    const Shape& s = c.shape;
    const double floor_us = 1e6 * c.floor_bytes() / G.copy_bytes_per_s;
    out += "| B=" + std::to_string(s.B) + " H=" + std::to_string(s.H) +
           " K=" + std::to_string(s.K) + " V=" + std::to_string(s.V) + " | " + dtype_name(s.dtype) +
           " | " + cell(launch, why_launch, "%.2f", 1) + " | " + cell(graph, why_graph, "%.2f", 1) +
           " | " + format("%.1f", floor_us) + " | " + fraction(floor_us, launch) + " / " +
           fraction(floor_us, graph) + " |\n";
  }
  out +=
      "\n| prefill (chunkwise) | dtype | ms | memory floor ms | fraction of copy rate |\n"
      "|---|---|---|---|---|\n";
  for (const Case& c : cases) {
    if (c.decode) continue;
    std::string why;
    const double us = results.median_us(c.name(""), why);
    if (us <= 0 && why.empty()) continue;
    const Shape& s = c.shape;
    const double floor_us = 1e6 * c.floor_bytes() / G.copy_bytes_per_s;
    out += "| " + std::to_string(s.B) + "x" + std::to_string(s.T) + "x" + std::to_string(s.H) +
           " K=" + std::to_string(s.K) + " V=" + std::to_string(s.V) +
           (c.workspace ? "" : " (no workspace: generic kernel)") + " | " + dtype_name(s.dtype) +
           (c.fp32_fast ? " fast" : "") + " | " + cell(us, why, "%.3f", 1e-3) + " | " +
           format("%.3f", 1e-3 * floor_us) + " | " + fraction(floor_us, us) + " |\n";
  }
  return out;
}

/// The value of `arg` if it is `prefix` followed by one (prefix ends in '='), else null.
const char* flag_value(const char* arg, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return std::strncmp(arg, prefix, n) == 0 ? arg + n : nullptr;
}

bool has_flag(int argc, char** argv, const char* prefix) {
  for (int i = 1; i < argc; ++i)
    if (flag_value(argv[i], prefix)) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // Our own flags first (Google Benchmark rejects flags it does not know).
  int no_gpu_code = 0;
  std::string summary_path;
  std::vector<char*> args(argv, argv + argc);
  for (auto it = args.begin() + 1; it != args.end();) {
    if (const char* v = flag_value(*it, "--kla_no_gpu_exit_code=")) {
      no_gpu_code = std::atoi(v);
    } else if (const char* path = flag_value(*it, "--kla_summary=")) {
      summary_path = path;
    } else {
      ++it;
      continue;
    }
    it = args.erase(it);
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("kla_bench_cuda: no CUDA device (%s); nothing to measure\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    return no_gpu_code;
  }

  // Defaults: 10 repetitions of at least 50 ms each, aggregates only.
  std::vector<std::string> extra;
  if (!has_flag(int(args.size()), args.data(), "--benchmark_repetitions"))
    extra.emplace_back("--benchmark_repetitions=10");
  if (!has_flag(int(args.size()), args.data(), "--benchmark_report_aggregates_only") &&
      !has_flag(int(args.size()), args.data(), "--benchmark_display_aggregates_only"))
    extra.emplace_back("--benchmark_report_aggregates_only=true");
  if (!has_flag(int(args.size()), args.data(), "--benchmark_min_time"))
    extra.emplace_back("--benchmark_min_time=0.05");
  for (std::string& s : extra) args.push_back(s.data());
  int nargs = int(args.size());
  args.push_back(nullptr);

  try {
    int dev = 0;
    KLA_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    KLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    G.gpu = prop.name;
    G.l2_bytes = size_t(prop.l2CacheSize);
    KLA_CUDA_CHECK(cudaStreamCreateWithFlags(&G.stream, cudaStreamNonBlocking));
    g_pools = new Pools();
    G.copy_bytes_per_s = measure_copy(15);

    char buf[64];
    benchmark::AddCustomContext("gpu", G.gpu);
    benchmark::AddCustomContext("sms", std::to_string(prop.multiProcessorCount));
    benchmark::AddCustomContext("l2_bytes", std::to_string(G.l2_bytes));
    std::snprintf(buf, sizeof buf, "%.4f", G.copy_bytes_per_s / 1e12);
    benchmark::AddCustomContext("copy_TBps", buf);
    benchmark::AddCustomContext("kla_version", kla_version_string());
    std::printf("kla_bench_cuda: %s, %d SMs, L2 %.0f MB, copy %.3f TB/s (read + written)\n",
                prop.name, prop.multiProcessorCount, double(G.l2_bytes) / 1e6,
                G.copy_bytes_per_s / 1e12);

    benchmark::RegisterBenchmark("copy/d2d/1GiB", bench_copy)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    const std::vector<Case> cases = all_cases();
    for (const Case& c : cases) {
      if (!c.decode) {
        benchmark::RegisterBenchmark(c.name("").c_str(), bench_prefill, c)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
        continue;
      }
      for (bool graph : {false, true})
        benchmark::RegisterBenchmark(c.name(graph ? "graph" : "launch").c_str(), bench_decode, c,
                                     graph)
            ->UseManualTime()
            ->Iterations(30)  // regions of `calls` calls; the reported time is per call
            ->Unit(benchmark::kMicrosecond);
    }

    benchmark::Initialize(&nargs, args.data());
    if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;
    if (summary_path.empty()) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      MedianCollector results;
      benchmark::RunSpecifiedBenchmarks(&results);
      const std::string summary = summary_markdown(results, cases, prop);
      std::printf("\n%s", summary.c_str());
      std::ofstream file(summary_path);
      file << summary;
      if (!file) throw std::runtime_error("cannot write " + summary_path);
    }
    benchmark::Shutdown();
    g_rot.reset();
    delete g_pools;
    cudaStreamDestroy(G.stream);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "kla_bench_cuda: %s\n", ex.what());
    return 1;
  }
  return 0;
}
