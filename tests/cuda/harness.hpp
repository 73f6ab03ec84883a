// Test harness for the CUDA kernels: random problems in the kernels' layouts (SPEC §3), device
// runs through the C ABI, and the reference (kla::ref::forward) on the same rounded inputs.
//
// Inputs are generated in float and rounded once to the call's dtype; the rounded values, held
// as float (exact for bf16/fp16), feed both the kernel (converted back exactly) and the
// reference, so the comparison measures the kernel's arithmetic alone. The dtypes' storage and
// the layouts come from kernel_inputs.hpp, shared with the CUDA benchmark.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "kernel_inputs.hpp"
#include "path_pin.hpp"
#include "tolerance.hpp"
#include "kla/kla.h"
#include "kla/ref/scalar.hpp"
#include "kla/ref/tensor.hpp"

namespace kla::test {

/// Whether a CUDA device is usable, and if not why (for GTEST_SKIP's message).
inline bool gpu_available(std::string* why = nullptr) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    if (why)
      *why = std::string("no CUDA device (") +
             (e != cudaSuccess ? cudaGetErrorString(e) : "device count 0") +
             "): GPU test skipped; run tools/gpu_suite.sh on the GPU machine";
    return false;
  }
  return true;
}

#define KLA_REQUIRE_GPU()                                         \
  do {                                                            \
    std::string why_;                                             \
    if (!::kla::test::gpu_available(&why_)) GTEST_SKIP() << why_; \
  } while (0)

/// Unit roundoff u = 2^-p of a dtype (p significand bits incl. the implicit one).
inline double unit_roundoff(kla_dtype d) {
  return d == KLA_DTYPE_FP32   ? std::ldexp(1.0, -24)
         : d == KLA_DTYPE_BF16 ? std::ldexp(1.0, -8)
                               : std::ldexp(1.0, -11);
}
/// The spacing of a dtype's subnormals (its smallest positive value): below the smallest normal,
/// a rounding errs by up to half of it, not by u relative.
inline double subnormal_spacing(kla_dtype d) {
  return d == KLA_DTYPE_FP32   ? std::ldexp(1.0, -149)
         : d == KLA_DTYPE_BF16 ? std::ldexp(1.0, -133)
                               : std::ldexp(1.0, -24);
}
/// Problem description. cu_seqlens empty = N = B sequences of length T.
struct Config {
  kla_dtype dtype = KLA_DTYPE_FP32;
  int B = 1, T = 1, H = 1, HV = 1, K = 64, V = 64;
  std::vector<int32_t> cu_seqlens;  // N+1 offsets (B = 1)
  float eps = 0.0f;
  float scale = 0.0f;  // 0: resolved to 1/sqrt(K) here, the same float the library uses
  kla_coefficient coefficient = KLA_COEFF_KACZMARZ;
  kla_readout readout = KLA_READOUT_SCALE;
  kla_arithmetic arithmetic = KLA_ARITHMETIC_ACCURATE;  // the chunkwise entry's contract
  bool has_g = true, has_eta = true, has_init = true, want_final = true;
  int pad_qk = 0, pad_v = 0, pad_o = 0;  // extra head-stride elements (multiples of 8)
  // Generation ranges.
  double knorm_lo = 1e-2, knorm_hi = 1e1;  // key norms log-uniform in [lo, hi]
  double decay_max = 1.0;                  // g uniform in [-decay_max, 0]
  double eta_lo = 0.1;                     // eta uniform in [eta_lo, 1]
  std::uint64_t seed = 1;

  float eta_value = 1.0f;  // the scalar eta of kla_params where has_eta is false
  int N() const { return cu_seqlens.empty() ? B : int(cu_seqlens.size()) - 1; }
  /// Tokens of the longest sequence.
  int longest() const {
    if (cu_seqlens.empty()) return T;
    int m = 0;
    for (std::size_t i = 1; i < cu_seqlens.size(); ++i)
      m = std::max(m, int(cu_seqlens[i] - cu_seqlens[i - 1]));
    return m;
  }
  Shape shape() const { return {dtype, B, T, H, HV, K, V}; }
  float resolved_scale() const { return scale != 0.0f ? scale : 1.0f / std::sqrt(float(K)); }
  std::string describe() const {
    std::string s =
        std::string(dtype_name(dtype)) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
        " H=" + std::to_string(H) + " HV=" + std::to_string(HV) + " K=" + std::to_string(K) +
        " V=" + std::to_string(V) + " N=" + std::to_string(N()) + " eps=" + std::to_string(eps) +
        (has_g ? " g<=" + std::to_string(decay_max) : "") + (has_init ? " s0" : "") +
        (!has_eta && eta_value != 1.0f ? " eta_value=" + std::to_string(eta_value) : "") +
        (coefficient == KLA_COEFF_GIVEN ? " given-beta" : "") +
        (readout == KLA_READOUT_Q_L2NORM ? " q-l2" : "") +
        (readout == KLA_READOUT_QK_L2NORM ? " qk-l2" : "") +
        (arithmetic == KLA_ARITHMETIC_FAST ? " fast" : "") + " seed=" + std::to_string(seed);
    if (!cu_seqlens.empty()) {
      s += " cu=[";
      for (auto c : cu_seqlens) s += std::to_string(c) + ",";
      s += "]";
    }
    return s;
  }
};

/// Host data (rounded values as float) in the device layouts, whose strides it holds (qs, vs,
/// os, gs).
struct Data : Strides {
  Config cfg;
  std::vector<float> q, k, v, g, eta, s0;

  std::size_t o_elems() const { return std::size_t(cfg.B) * os[0]; }
  std::size_t state_elems() const { return std::size_t(cfg.N()) * cfg.HV * cfg.K * cfg.V; }
};

inline Data make_data(const Config& c) {
  Data d;
  d.cfg = c;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  static_cast<Strides&>(d) = row_major_strides(c.shape(), c.pad_qk, c.pad_v, c.pad_o);
  d.q.assign(std::size_t(c.B) * d.qs[0], 0.f);
  d.k = d.q;
  d.v.assign(std::size_t(c.B) * d.vs[0], 0.f);
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t) {
      for (int h = 0; h < c.H; ++h) {
        const std::size_t base = b * d.qs[0] + t * d.qs[1] + h * d.qs[2];
        std::vector<double> kd(c.K);
        double n2 = 0;
        for (int i = 0; i < c.K; ++i) {
          kd[i] = nd(rng);
          n2 += kd[i] * kd[i];
        }
        const double lo = std::log(c.knorm_lo), hi = std::log(c.knorm_hi);
        const double norm = std::exp(lo + (hi - lo) * ud(rng));
        for (int i = 0; i < c.K; ++i) {
          d.k[base + i] = round_to(c.dtype, float(kd[i] / std::sqrt(n2) * norm));
          d.q[base + i] = round_to(c.dtype, float(nd(rng)));
        }
      }
      for (int hv = 0; hv < c.HV; ++hv)
        for (int i = 0; i < c.V; ++i)
          d.v[b * d.vs[0] + t * d.vs[1] + hv * d.vs[2] + i] = round_to(c.dtype, float(nd(rng)));
    }
  const std::size_t ng = c.shape().gate_elems();
  if (c.has_g) {
    d.g.resize(ng);
    for (auto& x : d.g) x = float(-c.decay_max * ud(rng));
  }
  if (c.has_eta) {
    d.eta.resize(ng);
    for (auto& x : d.eta) x = ud(rng) < 0.2 ? 1.0f : float(c.eta_lo + (1 - c.eta_lo) * ud(rng));
  }
  if (c.has_init) {
    d.s0.resize(d.state_elems());
    for (auto& x : d.s0) x = float(0.3 * nd(rng));
  }
  return d;
}

/// The reference's read-out for a kla_readout.
inline kla::ref::Readout ref_readout(kla_readout r) {
  return r == KLA_READOUT_Q_L2NORM    ? kla::ref::Readout::q_l2norm
         : r == KLA_READOUT_QK_L2NORM ? kla::ref::Readout::qk_l2norm
                                      : kla::ref::Readout::scale;
}

/// Device buffers for one problem, inputs converted to the dtype. o and final state are
/// poisoned (all bytes 0xFF: NaN) before every run, so unwritten elements are caught.
struct DeviceProblem {
  Data data;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float *g = nullptr, *eta = nullptr, *s0 = nullptr, *sf = nullptr;
  int32_t* cu = nullptr;
  void* ws = nullptr;  // chunkwise workspace (kla_workspace_size); null = workspace-free kernel
  std::size_t ws_bytes = 0;

  explicit DeviceProblem(const Data& d, bool with_workspace = true) : data(d) {
    q = upload(d.q);
    k = upload(d.k);
    v = upload(d.v);
    KLA_CUDA_CHECK(cudaMalloc(&o, d.o_elems() * dtype_size(d.cfg.dtype)));
    if (!d.g.empty()) g = upload_f(d.g);
    if (!d.eta.empty()) eta = upload_f(d.eta);
    if (!d.s0.empty()) s0 = upload_f(d.s0);
    KLA_CUDA_CHECK(cudaMalloc(&sf, d.state_elems() * sizeof(float)));
    if (!d.cfg.cu_seqlens.empty()) {
      KLA_CUDA_CHECK(cudaMalloc(&cu, d.cfg.cu_seqlens.size() * 4));
      KLA_CUDA_CHECK(cudaMemcpy(cu, d.cfg.cu_seqlens.data(), d.cfg.cu_seqlens.size() * 4,
                                cudaMemcpyHostToDevice));
    }
    if (with_workspace) {
      const kla_params p = params();
      ws_bytes = kla_workspace_size(&p);
      if (ws_bytes) KLA_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    }
  }
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;
  ~DeviceProblem() {
    for (void* p : {q, k, v, o, static_cast<void*>(g), static_cast<void*>(eta),
                    static_cast<void*>(s0), static_cast<void*>(sf), static_cast<void*>(cu), ws})
      if (p) cudaFree(p);
  }

  void* upload(const std::vector<float>& x) {
    const std::vector<unsigned char> bytes = encode(data.cfg.dtype, x.data(), x.size());
    void* p = nullptr;
    KLA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes.size(), 16)));
    KLA_CUDA_CHECK(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    return p;
  }
  float* upload_f(const std::vector<float>& x) {
    void* p = nullptr;
    KLA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(x.size() * 4, 16)));
    KLA_CUDA_CHECK(cudaMemcpy(p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    return static_cast<float*>(p);
  }

  /// Params for this problem (initial state = s0 if present, final state = sf if wanted).
  kla_params params() const {
    const Config& c = data.cfg;
    kla_params p = shaped_params(c.shape(), data);
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.g = g;
    p.eta = eta;
    p.eta_value = c.eta_value;
    p.eps = c.eps;
    p.scale = c.resolved_scale();
    p.coefficient = c.coefficient;
    p.readout = c.readout;
    p.arithmetic = c.arithmetic;
    p.initial_state = s0;
    p.final_state = c.want_final ? sf : nullptr;
    if (cu) {
      p.cu_seqlens = cu;
      p.cu_seqlens_host = data.cfg.cu_seqlens.data();
      p.num_seqs = c.N();
    }
    p.workspace = ws;
    p.workspace_size = ws_bytes;
    return p;
  }

  void poison(cudaStream_t s = nullptr) {
    KLA_CUDA_CHECK(cudaMemsetAsync(o, 0xFF, data.o_elems() * dtype_size(data.cfg.dtype), s));
    KLA_CUDA_CHECK(cudaMemsetAsync(sf, 0xFF, data.state_elems() * sizeof(float), s));
  }

  std::vector<float> download_o() const {
    const kla_dtype dt = data.cfg.dtype;
    const std::size_t n = data.o_elems();
    std::vector<unsigned char> bytes(n * dtype_size(dt));
    KLA_CUDA_CHECK(cudaMemcpy(bytes.data(), o, bytes.size(), cudaMemcpyDeviceToHost));
    return decode(dt, bytes.data(), n);
  }
  std::vector<float> download_state() const {
    std::vector<float> out(data.state_elems());
    KLA_CUDA_CHECK(cudaMemcpy(out.data(), sf, out.size() * 4, cudaMemcpyDeviceToHost));
    return out;
  }
};

struct Outputs {
  std::vector<double> o;      // o layout of Data (os strides), padding ignored
  std::vector<double> state;  // [N,HV,K,V]
  Ran ran;                    // the path that produced them (AUTO: a reference or unknown)
};

enum class Entry { chunk, tokenwise };
inline const char* entry_name(Entry e) {
  return e == Entry::chunk ? "chunk" : "tokenwise";
}

/// The path of this thread's last successful call() (the tolerances depend on it).
inline Ran& last_ran() {
  thread_local Ran r;
  return r;
}

/// The entry point; chunkwise calls go through the pinned path (path_pin.hpp).
inline kla_status call(Entry e, const kla_params& p, cudaStream_t s = nullptr) {
  if (e == Entry::tokenwise) {
    const kla_status st = kla_tokenwise_forward(&p, s);
    if (st == KLA_SUCCESS) last_ran() = Ran{KLA_PATH_TOKENWISE, 0, 1};
    return st;
  }
  kla_plan plan{};
  const kla_status st = chunk_forward_pinned(p, s, &plan);
  if (st == KLA_SUCCESS)
    last_ran() = Ran{plan.path, plan.value_slice, plan.chunk_len, plan.arithmetic, plan.segments};
  return st;
}

/// Runs an entry point on a problem with params p (outputs poisoned first) and downloads o and,
/// where wanted, the final state; throws on a failing status.
inline Outputs run_params(DeviceProblem& dp, Entry e, const kla_params& p) {
  dp.poison();
  const kla_status st = call(e, p);
  if (st != KLA_SUCCESS)
    throw std::runtime_error(std::string(kla_status_string(st)) + ": " + kla_last_error_message());
  KLA_CUDA_CHECK(cudaDeviceSynchronize());
  Outputs out;
  out.ran = last_ran();
  const auto o = dp.download_o();
  out.o.assign(o.begin(), o.end());
  if (dp.data.cfg.want_final) {
    const auto s = dp.download_state();
    out.state.assign(s.begin(), s.end());
  }
  return out;
}

/// Runs an entry point on a problem with its own params (dp.params()).
inline Outputs run_device(DeviceProblem& dp, Entry e) {
  return run_params(dp, e, dp.params());
}

/// Runs `fn(i)` for i in [0, n) on up to hardware_concurrency threads.
inline void parallel_for(int n, const std::function<void(int)>& fn) {
  const int nt = std::max(1, std::min<int>(n, int(std::thread::hardware_concurrency())));
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  std::exception_ptr err;
  std::mutex m;
  for (int t = 0; t < nt; ++t)
    pool.emplace_back([&] {
      for (int i; (i = next++) < n;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lk(m);
          err = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
}

/// The reference (kla::ref::forward<R>, tokenwise) on the same rounded inputs, one call per
/// (sequence, value head) so the heads run on all CPU cores.
template <class R>
Outputs run_reference(const Data& d) {
  using kla::ref::TensorView;
  const Config& c = d.cfg;
  const int N = c.N(), group = c.HV / c.H;
  Outputs out;
  out.o.assign(d.o_elems(), 0.0);
  out.state.assign(d.state_elems(), 0.0);
  kla::ref::Options<R> opt;
  opt.eps = R(c.eps);
  opt.scale = R(c.resolved_scale());
  opt.coefficient = c.coefficient == KLA_COEFF_GIVEN ? kla::ref::Coefficient::given
                                                     : kla::ref::Coefficient::kaczmarz;
  opt.readout = ref_readout(c.readout);
  const std::vector<float> ones(std::size_t(c.B) * c.T * c.HV, c.eta_value);
  parallel_for(N * c.HV, [&](int task) {
    const int n = task / c.HV, hv = task % c.HV, h = hv / group;
    int64_t b = n, t0 = 0, len = c.T;
    if (!c.cu_seqlens.empty()) {
      b = 0;
      t0 = c.cu_seqlens[n];
      len = c.cu_seqlens[n + 1] - t0;
    }
    kla::ref::SequenceBatch<float> in;
    const std::int64_t one = 1;
    in.q = {d.q.data() + b * d.qs[0] + t0 * d.qs[1] + h * d.qs[2],
            {one, len, one, c.K},
            {d.qs[0], d.qs[1], d.qs[2], 1}};
    in.k = {d.k.data() + b * d.qs[0] + t0 * d.qs[1] + h * d.qs[2],
            {one, len, one, c.K},
            {d.qs[0], d.qs[1], d.qs[2], 1}};
    in.v = {d.v.data() + b * d.vs[0] + t0 * d.vs[1] + hv * d.vs[2],
            {one, len, one, c.V},
            {d.vs[0], d.vs[1], d.vs[2], 1}};
    // eta absent means eta_value for every token.
    const float* eta = d.eta.empty() ? ones.data() : d.eta.data();
    in.eta = {eta + b * d.gs[0] + t0 * d.gs[1] + hv, {one, len, one}, {d.gs[0], d.gs[1], 1}};
    if (!d.g.empty())
      in.log_decay = {
          d.g.data() + b * d.gs[0] + t0 * d.gs[1] + hv, {one, len, one}, {d.gs[0], d.gs[1], 1}};
    const int64_t KV = int64_t(c.K) * c.V;
    if (!d.s0.empty())
      in.initial_state = TensorView<const float, 4>::contiguous(
          d.s0.data() + (int64_t(n) * c.HV + hv) * KV, {1, 1, c.K, c.V});
    TensorView<double, 4> o{out.o.data() + b * d.os[0] + t0 * d.os[1] + hv * d.os[2],
                            {one, len, one, c.V},
                            {d.os[0], d.os[1], d.os[2], 1}};
    auto fs = TensorView<double, 4>::contiguous(out.state.data() + (int64_t(n) * c.HV + hv) * KV,
                                                {1, 1, c.K, c.V});
    kla::ref::forward<R>(in, opt, kla::ref::Algorithm{}, o, fs);
  });
  return out;
}

/// The magnitudes the kernels' sums are formed from (tolerance.hpp), from the recurrence in double
/// on the same rounded inputs (kla::ref::token_step), S_t the state after token t:
///  * o, in o's layout: m = |scale_t| (sum_i S_t[i, j]^2 q_t[i]^2)^(1/2). A read-out S_t^T q_t
///    whose terms err independently by sigma errs by sigma m, not by sigma times its own value,
///    which cancellation can make far smaller.
///  * state_peak, one per (sequence, value head): the largest RMS the head's state took over the
///    sequence, each decayed to the end as the state's own error is (peak_t = max(alpha_t
///    peak_{t-1}, rms(S_t)), from rms(S_0)). A hand-off sums terms the size of the states it
///    passes through; where later tokens cancel most of a large state (tiny keys at eps = 0 store
///    v / |k|, a later key along them removes it) the final state is far smaller than the terms.
struct Magnitudes {
  std::vector<double> o, state_peak;
};
inline Magnitudes magnitudes(const Data& d) {
  const Config& c = d.cfg;
  const int N = c.N(), group = c.HV / c.H;
  Magnitudes out;
  out.o.assign(d.o_elems(), 0.0);
  out.state_peak.assign(std::size_t(N) * c.HV, 0.0);
  std::vector<double>& m = out.o;
  const double KV = double(c.K) * c.V;
  kla::ref::Options<double> opt;
  opt.eps = c.eps;
  opt.scale = c.resolved_scale();
  opt.coefficient = c.coefficient == KLA_COEFF_GIVEN ? kla::ref::Coefficient::given
                                                     : kla::ref::Coefficient::kaczmarz;
  opt.readout = ref_readout(c.readout);
  parallel_for(N * c.HV, [&](int task) {
    const int n = task / c.HV, hv = task % c.HV, h = hv / group;
    int64_t b = n, t0 = 0, len = c.T;
    if (!c.cu_seqlens.empty()) {
      b = 0;
      t0 = c.cu_seqlens[n];
      len = c.cu_seqlens[n + 1] - t0;
    }
    kla::ref::Mat<double> S = kla::ref::Mat<double>::Zero(c.K, c.V);
    if (!d.s0.empty())
      for (int r = 0; r < c.K; ++r)
        for (int j = 0; j < c.V; ++j)
          S(r, j) = d.s0[((int64_t(n) * c.HV + hv) * c.K + r) * c.V + j];
    kla::ref::Vec<double> alpha(c.K), k(c.K), q(c.K), v(c.V);
    double peak = std::sqrt(S.squaredNorm() / KV);
    for (int64_t t = t0; t < t0 + len; ++t) {
      for (int r = 0; r < c.K; ++r) {
        k(r) = d.k[b * d.qs[0] + t * d.qs[1] + h * d.qs[2] + r];
        q(r) = d.q[b * d.qs[0] + t * d.qs[1] + h * d.qs[2] + r];
      }
      for (int j = 0; j < c.V; ++j) v(j) = d.v[b * d.vs[0] + t * d.vs[1] + hv * d.vs[2] + j];
      if (c.readout == KLA_READOUT_QK_L2NORM) {  // the inputs the read-out sees (tolerance.hpp)
        k /= std::sqrt(k.squaredNorm() + opt.l2norm_eps);
        q /= std::sqrt(q.squaredNorm() + opt.l2norm_eps);
      }
      alpha.setConstant(d.g.empty() ? 1.0 : std::exp(double(d.g[b * d.gs[0] + t * d.gs[1] + hv])));
      const double eta = d.eta.empty() ? c.eta_value : d.eta[b * d.gs[0] + t * d.gs[1] + hv];
      kla::ref::token_step<double>(S, alpha, k, v, eta, opt);
      peak = std::max(peak * alpha(0), std::sqrt(S.squaredNorm() / KV));
      const double sc = std::abs(kla::ref::readout_scale<double>(q, opt));
      const kla::ref::Vec<double> q2 = q.cwiseProduct(q);
      for (int j = 0; j < c.V; ++j)
        m[b * d.os[0] + t * d.os[1] + hv * d.os[2] + j] =
            sc * std::sqrt(S.col(j).cwiseProduct(S.col(j)).dot(q2));
    }
    out.state_peak[std::size_t(n) * c.HV + hv] = peak;
  });
  return out;
}

/// Calls fn(i) for the index of every element the comparisons below look at: the valid elements
/// of an o-layout array (padding skipped), or each of the n elements when `o_layout` is false.
template <class Fn>
void for_each_compared(std::size_t n, const Data& d, bool o_layout, Fn fn) {
  if (!o_layout) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const Config& c = d.cfg;
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int hv = 0; hv < c.HV; ++hv)
        for (int i = 0; i < c.V; ++i) fn(b * d.os[0] + t * d.os[1] + hv * d.os[2] + i);
}

/// Relative RMS ‖a − r‖ / ‖r‖ over the valid elements of an o-layout array (padding skipped),
/// or over every element when `o_layout` is false. NaN/Inf in `a` gives +inf.
inline double rel_rms(const std::vector<double>& a, const std::vector<double>& r, const Data& d,
                      bool o_layout) {
  double num = 0, den = 0;
  for_each_compared(a.size(), d, o_layout, [&](std::size_t i) {
    if (!std::isfinite(a[i])) num = INFINITY;
    const double e = a[i] - r[i];
    num += e * e;
    den += r[i] * r[i];
  });
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Largest |a − r| / (scale_rel |r| + floor) over valid o elements (<= 1 passes).
inline double max_scaled_err(const std::vector<double>& a, const std::vector<double>& r,
                             const Data& d, bool o_layout, double rel, double abs_floor) {
  double worst = 0;
  for_each_compared(a.size(), d, o_layout, [&](std::size_t i) {
    if (!std::isfinite(a[i]))
      worst = INFINITY;
    else
      worst = std::max(worst, std::abs(a[i] - r[i]) / (rel * std::abs(r[i]) + abs_floor));
  });
  return worst;
}

inline double rms(const std::vector<double>& r) {
  double s = 0;
  for (double x : r) s += x * x;
  return r.empty() ? 0 : std::sqrt(s / double(r.size()));
}

}  // namespace kla::test
