// GPU tests of the kernels against the MPFR reference (133 bits) on fixed problems, edge cases,
// and the run-time contracts: determinism, CUDA-graph capture, thread safety, state pool,
// in-place state, nothing written on error. Skipped with a message where no GPU exists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "checks.hpp"
#include "kla/kla.hpp"

namespace kla::test {
namespace {

using Mpfr = kla::ref::Mpfr;

void expect_matches_reference(const Config& c, Entry e) {
  const Data d = make_data(c);
  DeviceProblem dp(d);
  const Outputs got = run_device(dp, e);
  const Outputs ref = run_reference<Mpfr>(d);
  const Comparison cmp = compare(got, ref, d);
  EXPECT_TRUE(cmp.ok) << entry_name(e) << " " << cmp.report;
  EXPECT_TRUE(padding_untouched(got.o, d)) << entry_name(e) << " wrote into o's padding";
  std::printf("  [%s] %s\n", entry_name(e), cmp.report.c_str());
}

const kla_dtype kDtypes[] = {KLA_DTYPE_FP32, KLA_DTYPE_BF16, KLA_DTYPE_FP16};

TEST(CudaKernels, FixedShapesAgainstMpfr) {
  KLA_REQUIRE_GPU();
  std::vector<Config> cfgs;
  for (kla_dtype dt : kDtypes) {
    Config a;  // grouped value heads, padded strides, T not a multiple of any chunk
    a.dtype = dt;
    a.B = 2, a.T = 77, a.H = 2, a.HV = 4, a.K = 64, a.V = 32;
    a.pad_qk = 16, a.pad_v = 8, a.pad_o = 8;
    a.eps = 1e-6f;
    a.knorm_lo = 1e-4, a.knorm_hi = 1e2;
    a.seed = 11 + int(dt);
    cfgs.push_back(a);
    Config b = a;  // varlen with an empty sequence, K = 96, V = 192 (the paper's model dims)
    b.B = 1, b.T = 70, b.H = 1, b.HV = 2, b.K = 96, b.V = 192;
    b.cu_seqlens = {0, 33, 33, 70};
    b.eps = 0.0f;
    b.readout = KLA_READOUT_Q_L2NORM;
    b.seed = 21 + int(dt);
    cfgs.push_back(b);
    Config qk = a;  // FLA's use_qk_l2norm_in_kernel: q and k normalised in the kernel, scale kept
    qk.readout = KLA_READOUT_QK_L2NORM;
    qk.scale = 0.3f;
    qk.seed = 41 + int(dt);
    cfgs.push_back(qk);
    qk.coefficient = KLA_COEFF_GIVEN;  // the GDN call FLA users make
    qk.seed = 51 + int(dt);
    cfgs.push_back(qk);
    Config g = a;  // given beta (plain GDN), no decay, no initial state
    g.coefficient = KLA_COEFF_GIVEN;
    g.knorm_lo = 0.5, g.knorm_hi = 1.0;
    g.has_g = false, g.has_init = false;
    g.seed = 31 + int(dt);
    cfgs.push_back(g);
  }
  Config big;  // the fast-path dims, 256 and 16
  big.dtype = KLA_DTYPE_BF16;
  big.B = 1, big.T = 40, big.H = 1, big.HV = 1, big.K = 128, big.V = 128;
  cfgs.push_back(big);
  big.K = 256, big.V = 256, big.T = 20, big.seed = 5;
  cfgs.push_back(big);
  big.K = 16, big.V = 16, big.T = 150, big.seed = 6, big.dtype = KLA_DTYPE_FP16;
  cfgs.push_back(big);
  // fp32 at K = 128: keys spread over six decades, eps = 0, a partial last chunk, grouped value
  // heads.
  Config f = big;
  f.dtype = KLA_DTYPE_FP32, f.K = 128, f.V = 48, f.T = 150, f.H = 1, f.HV = 2, f.seed = 7;
  f.eps = 0.0f, f.knorm_lo = 1e-4, f.knorm_hi = 1e2;
  cfgs.push_back(f);
  // arithmetic FAST on every shape above: fp32 on sm_90a runs the WY path with K / Q as bf16 hi
  // + lo (the same tolerances, which its ~16-bit products meet); bf16 / fp16 on the transposed
  // scan round the state and the update once to the dtype (its own tolerance, tolerance.hpp);
  // elsewhere the plan runs ACCURATE.
  for (std::size_t i = 0, n = cfgs.size(); i < n; ++i) {
    Config x = cfgs[i];
    x.arithmetic = KLA_ARITHMETIC_FAST;
    cfgs.push_back(x);
  }
  for (const Config& c : cfgs)
    for (Entry e : {Entry::chunk, Entry::tokenwise}) expect_matches_reference(c, e);
}

TEST(CudaKernels, ChunkWithoutWorkspaceUsesGenericKernel) {
  KLA_REQUIRE_GPU();
  for (kla_dtype dt : kDtypes) {
    Config c;
    c.dtype = dt;
    c.B = 2, c.T = 77, c.H = 2, c.HV = 4, c.K = 64, c.V = 32;
    c.eps = 1e-6f;
    c.seed = 41 + int(dt);
    const Data d = make_data(c);
    DeviceProblem dp(d, /*with_workspace=*/false);
    kla_params p = dp.params();
    kla_plan plan{};
    ASSERT_EQ(kla_plan_chunk_forward(&p, &plan), KLA_SUCCESS) << kla_last_error_message();
    EXPECT_EQ(plan.path, KLA_PATH_GENERIC) << plan.reason;
    EXPECT_NE(std::strstr(plan.reason, "workspace"), nullptr) << plan.reason;
    const Outputs got = run_device(dp, Entry::chunk);
    const Comparison cmp = compare(got, run_reference<Mpfr>(d), d);
    EXPECT_TRUE(cmp.ok) << cmp.report;
  }
}

TEST(CudaKernels, TinyKeysFp16EpsZeroFinite) {
  KLA_REQUIRE_GPU();
  Config c;
  c.dtype = KLA_DTYPE_FP16;
  c.B = 1, c.T = 90, c.H = 1, c.HV = 1, c.K = 64, c.V = 64;
  c.eps = 0.0f;
  c.knorm_lo = 1e-4, c.knorm_hi = 1e-3;  // components ~1e-5: fp16 subnormals
  for (Entry e : {Entry::chunk, Entry::tokenwise}) expect_matches_reference(c, e);
}

TEST(CudaKernels, ZeroKeyEpsZeroOnlyDecays) {
  KLA_REQUIRE_GPU();
  for (kla_dtype dt : kDtypes) {
    Config c;
    c.dtype = dt;
    c.B = 1, c.T = 50, c.K = 32, c.V = 32;
    c.eps = 0.0f;
    Data d = make_data(c);
    for (int t = 0; t < c.T; t += 3)  // every third key exactly zero: beta = 0 (degenerate)
      for (int i = 0; i < c.K; ++i) d.k[t * d.qs[1] + i] = 0.0f;
    DeviceProblem dp(d);
    const Outputs ref = run_reference<Mpfr>(d);
    for (Entry e : {Entry::chunk, Entry::tokenwise}) {
      const Outputs got = run_device(dp, e);
      const Comparison cmp = compare(got, ref, d);
      EXPECT_TRUE(cmp.ok) << entry_name(e) << " " << cmp.report;
    }
  }
}

TEST(CudaKernels, DefaultScaleIsInverseSqrtK) {
  KLA_REQUIRE_GPU();
  Config c;
  c.dtype = KLA_DTYPE_FP32, c.T = 10, c.K = 64, c.V = 64;
  DeviceProblem dp(make_data(c));
  for (Entry e : {Entry::chunk, Entry::tokenwise}) {
    const Outputs a = run_device(dp, e);
    kla_params p = dp.params();
    p.scale = 0.0f;
    dp.poison();
    ASSERT_EQ(call(e, p), KLA_SUCCESS) << kla_last_error_message();
    KLA_CUDA_CHECK(cudaDeviceSynchronize());
    const auto o = dp.download_o();
    for (std::size_t i = 0; i < o.size(); ++i) ASSERT_EQ(double(o[i]), a.o[i]);
  }
}

/// Bitwise equality of two float arrays (NaN patterns included).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(CudaKernels, BitwiseDeterministic) {
  KLA_REQUIRE_GPU();
  for (kla_dtype dt : kDtypes) {
    Config c;
    c.dtype = dt, c.B = 3, c.T = 300, c.H = 4, c.HV = 8, c.K = 128, c.V = 128;
    DeviceProblem dp(make_data(c));
    for (Entry e : {Entry::chunk, Entry::tokenwise}) {
      const Outputs a = run_device(dp, e), b = run_device(dp, e);
      EXPECT_TRUE(same_bits(a.o, b.o)) << entry_name(e) << " " << dtype_name(dt);
      EXPECT_TRUE(same_bits(a.state, b.state)) << entry_name(e) << " " << dtype_name(dt);
    }
  }
}

TEST(CudaKernels, GraphCaptureReplayMatchesDirectCall) {
  KLA_REQUIRE_GPU();
  Config c;
  c.dtype = KLA_DTYPE_BF16, c.B = 2, c.T = 100, c.H = 2, c.HV = 2, c.K = 64, c.V = 64;
  c.cu_seqlens = {};
  DeviceProblem dp(make_data(c));
  for (Entry e : {Entry::chunk, Entry::tokenwise}) {
    const Outputs direct = run_device(dp, e);
    cudaStream_t s;
    KLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    dp.poison(s);
    KLA_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t graph;
    KLA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const kla_params p = dp.params();
    const kla_status st = call(e, p, s);
    KLA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    ASSERT_EQ(st, KLA_SUCCESS) << kla_last_error_message();
    cudaGraphExec_t exec;
    KLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      dp.poison(s);
      KLA_CUDA_CHECK(cudaGraphLaunch(exec, s));
      KLA_CUDA_CHECK(cudaStreamSynchronize(s));
      const auto o = dp.download_o();
      const auto st2 = dp.download_state();
      const std::vector<double> od(o.begin(), o.end()), sd(st2.begin(), st2.end());
      EXPECT_TRUE(same_bits(od, direct.o)) << entry_name(e) << " replay " << rep;
      EXPECT_TRUE(same_bits(sd, direct.state)) << entry_name(e) << " replay " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
}

TEST(CudaKernels, ThreadSafeConcurrentCalls) {
  KLA_REQUIRE_GPU();
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<DeviceProblem>> probs;
  std::vector<Outputs> serial;
  for (int i = 0; i < kThreads; ++i) {
    Config c;
    c.dtype = kDtypes[i % 3], c.B = 2, c.T = 64 + 17 * i, c.H = 2, c.HV = 4, c.K = 64, c.V = 64;
    c.seed = 100 + i;
    probs.push_back(std::make_unique<DeviceProblem>(make_data(c)));
    serial.push_back(run_device(*probs.back(), i % 2 ? Entry::chunk : Entry::tokenwise));
  }
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i)
    ts.emplace_back([&, i] {
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      for (int rep = 0; rep < 20; ++rep) {
        kla_params p = probs[i]->params();
        kla_params bad = p;
        bad.num_v_heads = 3;  // interleave failing calls: messages stay per thread
        if (call(i % 2 ? Entry::chunk : Entry::tokenwise, bad, s) != KLA_ERROR_SHAPE_MISMATCH ||
            std::strstr(kla_last_error_message(), "num_v_heads") == nullptr)
          errors[i] = "wrong status/message for a bad call";
        if (call(i % 2 ? Entry::chunk : Entry::tokenwise, p, s) != KLA_SUCCESS)
          errors[i] = kla_last_error_message();
      }
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(errors[i], "");
    const auto o = probs[i]->download_o();
    const std::vector<double> od(o.begin(), o.end());
    EXPECT_TRUE(same_bits(od, serial[i].o)) << "thread " << i;
  }
}

TEST(CudaKernels, StatePoolDecodeSkipsMinusOne) {
  KLA_REQUIRE_GPU();
  for (Entry e : {Entry::tokenwise, Entry::chunk}) {
    Config c;
    c.dtype = KLA_DTYPE_BF16, c.B = 4, c.T = 2, c.H = 2, c.HV = 4, c.K = 64, c.V = 64;
    c.has_init = true;
    const Data d = make_data(c);
    DeviceProblem dp(d);
    const int pool_size = 7;
    const std::vector<int32_t> idx = {5, -1, 0, 3};
    const int64_t per = int64_t(c.HV) * c.K * c.V;
    std::vector<float> pool(pool_size * per);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (auto& x : pool) x = nd(rng);
    // The reference sees, for sequence n, the pool row idx[n] as its initial state.
    Data dref = d;
    for (int n = 0; n < c.B; ++n)
      if (idx[n] >= 0)
        std::copy(pool.begin() + idx[n] * per, pool.begin() + (idx[n] + 1) * per,
                  dref.s0.begin() + n * per);
    const Outputs ref = run_reference<Mpfr>(dref);
    float* dpool;
    int32_t* didx;
    KLA_CUDA_CHECK(cudaMalloc(&dpool, pool.size() * 4));
    KLA_CUDA_CHECK(cudaMalloc(&didx, idx.size() * 4));
    KLA_CUDA_CHECK(cudaMemcpy(dpool, pool.data(), pool.size() * 4, cudaMemcpyHostToDevice));
    KLA_CUDA_CHECK(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    dp.poison();
    kla_params p = dp.params();
    p.initial_state = nullptr;
    p.final_state = nullptr;
    p.state_pool = dpool;
    p.pool_size = pool_size;
    p.state_indices = didx;
    p.state_indices_host = idx.data();
    ASSERT_EQ(call(e, p), KLA_SUCCESS) << kla_last_error_message();
    KLA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> after(pool.size());
    KLA_CUDA_CHECK(cudaMemcpy(after.data(), dpool, after.size() * 4, cudaMemcpyDeviceToHost));
    const auto o = dp.download_o();
    // Rows not named by any index are untouched; skipped sequence's o stays poisoned.
    for (int r : {1, 2, 4, 6})
      EXPECT_EQ(0, std::memcmp(after.data() + r * per, pool.data() + r * per, per * 4)) << r;
    for (int t = 0; t < c.T; ++t)
      for (int i = 0; i < c.HV * int(d.os[2]); ++i)
        EXPECT_TRUE(std::isnan(o[1 * d.os[0] + t * d.os[1] + i]));
    // Live sequences match the reference, outputs and pool rows.
    Outputs got;
    got.o.assign(o.begin(), o.end());
    got.state.assign(d.state_elems(), 0.0);
    Outputs want = ref;
    for (int n = 0; n < c.B; ++n) {
      if (idx[n] < 0) {
        for (int64_t i = 0; i < d.os[0]; ++i) got.o[n * d.os[0] + i] = want.o[n * d.os[0] + i];
        continue;
      }
      for (int64_t i = 0; i < per; ++i) got.state[n * per + i] = after[idx[n] * per + i];
    }
    for (int64_t i = 0; i < per; ++i) want.state[1 * per + i] = 0, got.state[1 * per + i] = 0;
    const Comparison cmp = compare(got, want, d);
    EXPECT_TRUE(cmp.ok) << entry_name(e) << " " << cmp.report;
    cudaFree(dpool);
    cudaFree(didx);
  }
}

TEST(CudaKernels, InPlaceStateUpdate) {
  KLA_REQUIRE_GPU();
  for (Entry e : {Entry::tokenwise, Entry::chunk}) {
    Config c;
    c.dtype = KLA_DTYPE_FP32, c.B = 3, c.T = 5, c.H = 1, c.HV = 2, c.K = 128, c.V = 128;
    DeviceProblem dp(make_data(c));
    const Outputs sep = run_device(dp, e);
    float* s;
    KLA_CUDA_CHECK(cudaMalloc(&s, dp.data.state_elems() * 4));
    KLA_CUDA_CHECK(cudaMemcpy(s, dp.s0, dp.data.state_elems() * 4, cudaMemcpyDeviceToDevice));
    kla_params p = dp.params();
    p.initial_state = s;
    p.final_state = s;
    ASSERT_EQ(call(e, p), KLA_SUCCESS) << kla_last_error_message();
    std::vector<float> st(dp.data.state_elems());
    KLA_CUDA_CHECK(cudaMemcpy(st.data(), s, st.size() * 4, cudaMemcpyDeviceToHost));
    const std::vector<double> sd(st.begin(), st.end());
    EXPECT_TRUE(same_bits(sd, sep.state)) << entry_name(e);
    cudaFree(s);
  }
}

// Every chunkwise path requested through kla_params.path (on the GPU suite's device: the WY paths
// need sm_90a, so elsewhere they must be refused with the plan's reason), against MPFR: the
// default run covers every path without --kla_path.
TEST(CudaKernels, EveryRequestedPathAgainstMpfr) {
  KLA_REQUIRE_GPU();
  struct Case {
    kla_path path;
    int32_t vs;
    kla_dtype dt;
    int K, V;
  };
  const Case cases[] = {{KLA_PATH_WY, 16, KLA_DTYPE_BF16, 128, 64},
                        {KLA_PATH_WY, 32, KLA_DTYPE_FP16, 64, 64},
                        {KLA_PATH_WY, 8, KLA_DTYPE_BF16, 96, 48},
                        {KLA_PATH_WY_TRANSPOSED, 0, KLA_DTYPE_BF16, 128, 128},
                        {KLA_PATH_WY_TRANSPOSED, 64, KLA_DTYPE_FP16, 64, 64},
                        {KLA_PATH_TF32, 8, KLA_DTYPE_FP32, 128, 32},
                        {KLA_PATH_TF32, 32, KLA_DTYPE_BF16, 64, 64},
                        {KLA_PATH_GENERIC, 16, KLA_DTYPE_FP16, 32, 48},
                        {KLA_PATH_GENERIC, 32, KLA_DTYPE_FP32, 128, 64}};
  kla_device_info dev{};
  ASSERT_EQ(kla_device_info_get(0, &dev), KLA_SUCCESS) << kla_last_error_message();
  for (const Case& k : cases) {
    Config c;
    c.dtype = k.dt;
    c.B = 2, c.T = 150, c.H = 1, c.HV = 2, c.K = k.K, c.V = k.V;
    c.eps = 1e-6f;
    c.seed = 101 + int(k.path) * 7 + k.vs;
    const Data d = make_data(c);
    DeviceProblem dp(d);
    kla_params p = dp.params();
    p.path = k.path, p.value_slice = k.vs;
    kla_plan plan{};
    const kla_status st = kla_plan_chunk_forward(&p, &plan);
    const bool wy = k.path == KLA_PATH_WY || k.path == KLA_PATH_WY_TRANSPOSED;
    if (wy && dev.compute_major != 9) {
      EXPECT_EQ(st, KLA_ERROR_UNSUPPORTED_PATH);
      continue;
    }
    ASSERT_EQ(st, KLA_SUCCESS) << kla_path_name(k.path) << ": " << kla_last_error_message();
    EXPECT_EQ(plan.path, k.path) << plan.reason;
    if (k.vs) {
      EXPECT_EQ(plan.value_slice, k.vs) << plan.reason;
    }
    const Outputs got = run_params(dp, Entry::chunk, p);
    const Comparison cmp = compare(got, run_reference<Mpfr>(d), d);
    EXPECT_TRUE(cmp.ok) << plan.path_name << "/" << plan.value_slice << " " << cmp.report;
    std::printf("  [%s/%d] %s\n", plan.path_name, plan.value_slice, cmp.report.c_str());
  }
}

// The sequence split (kla_params.segments, cp/segments.hpp) against MPFR on fresh draws: ragged
// lengths, a packed sequence shorter than its segments (empty segments: identity maps), a batch
// of unpacked sequences, an initial state and none, the fold's final state; each dtype and both
// arithmetics. The plan must report the split it ran (the tolerance then counts the maps pass's
// hand-offs too: tolerance.hpp). Mutant split_fold_transition_skipped (the fold drops A) fails it.
TEST(CudaKernels, SequenceSplitAgainstMpfr) {
  KLA_REQUIRE_GPU();
  struct Case {
    kla_dtype dt;
    kla_arithmetic ar;
    int segments, B, T, HV, K, V;
    std::vector<int32_t> cu;
    bool init;
  };
  const Case cases[] = {
      {KLA_DTYPE_BF16, KLA_ARITHMETIC_ACCURATE, 5, 1, 64 * 11 + 17, 2, 128, 128, {}, true},
      {KLA_DTYPE_BF16, KLA_ARITHMETIC_FAST, 4, 1, 64 * 12, 1, 128, 128, {}, true},
      {KLA_DTYPE_FP16, KLA_ARITHMETIC_ACCURATE, 3, 1, 2001, 1, 64, 64, {0, 700, 701, 2001}, true},
      {KLA_DTYPE_FP32, KLA_ARITHMETIC_ACCURATE, 4, 2, 600, 2, 64, 128, {}, false},
      {KLA_DTYPE_FP32, KLA_ARITHMETIC_FAST, 16, 1, 64 * 20 + 5, 1, 96, 96, {}, true}};
  const int n = int(sizeof cases / sizeof cases[0]);
  std::random_device rd;
  std::vector<Data> data;
  for (const Case& k : cases) {
    Config c;
    c.dtype = k.dt, c.arithmetic = k.ar;
    c.B = k.B, c.T = k.T, c.H = 1, c.HV = k.HV, c.K = k.K, c.V = k.V;
    c.cu_seqlens = k.cu;
    c.eps = 1e-6f;
    c.has_init = k.init;
    c.decay_max = 0.05;
    c.seed = (std::uint64_t(rd()) << 32) | rd();
    data.push_back(make_data(c));
  }
  std::vector<Outputs> refs(data.size());
  parallel_for(n, [&](int i) { refs[i] = run_reference<Mpfr>(data[i]); });
  for (int i = 0; i < n; ++i) {
    const Case& k = cases[i];
    const Data& d = data[i];
    DeviceProblem dp(d);
    kla_params p = dp.params();
    p.segments = k.segments;
    kla_plan plan{};
    ASSERT_EQ(kla_plan_chunk_forward(&p, &plan), KLA_SUCCESS) << kla_last_error_message();
    EXPECT_EQ(plan.segments, k.segments) << plan.reason;
    const Outputs got = run_params(dp, Entry::chunk, p);
    EXPECT_EQ(got.ran.segments, k.segments);
    const Comparison cmp = compare(got, refs[i], d);
    EXPECT_TRUE(cmp.ok) << d.cfg.describe() << " segments=" << k.segments << " " << cmp.report;
    std::printf("  [%s/%d, %d segments] %s\n", plan.path_name, plan.value_slice, plan.segments,
                cmp.report.c_str());
  }
}

// A split the call cannot take is refused with the reason, and nothing is written.
TEST(CudaKernels, SequenceSplitRefusedWritesNothing) {
  KLA_REQUIRE_GPU();
  Config c;
  c.dtype = KLA_DTYPE_BF16, c.T = 300, c.K = 128, c.V = 192, c.seed = 9;  // K + V > 256
  const Data d = make_data(c);
  DeviceProblem dp(d);
  kla_params p = dp.params();
  p.segments = 2;
  dp.poison();
  EXPECT_EQ(kla_chunk_forward(&p, nullptr), KLA_ERROR_UNSUPPORTED_PATH);
  EXPECT_NE(std::strstr(kla_last_error_message(), "K + V = 320"), nullptr)
      << kla_last_error_message();
  KLA_CUDA_CHECK(cudaDeviceSynchronize());
  for (float x : dp.download_state()) ASSERT_TRUE(std::isnan(x)) << "final state written";
}

// A request the call cannot honour is an error naming the path, and nothing is written.
TEST(CudaKernels, InapplicablePathRefusedWritesNothing) {
  KLA_REQUIRE_GPU();
  Config c;
  c.dtype = KLA_DTYPE_BF16, c.B = 1, c.T = 70, c.H = 1, c.HV = 1, c.K = 64, c.V = 48;
  DeviceProblem dp(make_data(c));
  kla_params p = dp.params();
  const struct {
    kla_path path;
    int32_t vs;
  } bad[] = {
      {KLA_PATH_WY, 8}, {KLA_PATH_WY_TRANSPOSED, 0}, {KLA_PATH_TF32, 64}, {KLA_PATH_TOKENWISE, 0}};
  for (const auto& b : bad) {
    dp.poison();
    p.path = b.path, p.value_slice = b.vs;
    EXPECT_EQ(kla_chunk_forward(&p, nullptr), KLA_ERROR_UNSUPPORTED_PATH) << kla_path_name(b.path);
    EXPECT_NE(std::strstr(kla_last_error_message(), kla_path_name(b.path)), nullptr)
        << kla_last_error_message();
    KLA_CUDA_CHECK(cudaDeviceSynchronize());
    for (float x : dp.download_o()) ASSERT_TRUE(std::isnan(x));
    for (float x : dp.download_state()) ASSERT_TRUE(std::isnan(x));
  }
}

// The stride of an extent-1 dimension is never used and not validated: with B = 1 a garbage B
// stride must not change the plan (the tensor maps stand another stride in for it) nor the result.
TEST(CudaKernels, UnusedStrideOfExtentOneIgnored) {
  KLA_REQUIRE_GPU();
  Config c;
  c.dtype = KLA_DTYPE_BF16, c.B = 1, c.T = 130, c.H = 2, c.HV = 2, c.K = 128, c.V = 64;
  c.seed = 77;
  const Data d = make_data(c);
  DeviceProblem dp(d);
  kla_params p = dp.params();
  kla_plan clean{}, odd{};
  ASSERT_EQ(kla_plan_chunk_forward(&p, &clean), KLA_SUCCESS) << kla_last_error_message();
  p.q_strides[0] = 3, p.k_strides[0] = 0, p.v_strides[0] = 5;  // B = 1: never used
  ASSERT_EQ(kla_plan_chunk_forward(&p, &odd), KLA_SUCCESS) << kla_last_error_message();
  EXPECT_EQ(odd.path, clean.path) << odd.reason;
  const Outputs got = run_params(dp, Entry::chunk, p);
  const Comparison cmp = compare(got, run_reference<Mpfr>(d), d);
  EXPECT_TRUE(cmp.ok) << odd.path_name << " " << cmp.report;
}

TEST(CudaKernels, ErrorLaunchesNothing) {
  KLA_REQUIRE_GPU();
  Config c;
  c.dtype = KLA_DTYPE_FP16, c.B = 2, c.T = 9, c.H = 2, c.HV = 2;
  DeviceProblem dp(make_data(c));
  for (Entry e : {Entry::chunk, Entry::tokenwise}) {
    dp.poison();
    kla_params p = dp.params();
    p.head_dim_v = 72;  // unsupported head dim
    EXPECT_EQ(call(e, p), KLA_ERROR_UNSUPPORTED_HEAD_DIM);
    EXPECT_NE(std::strstr(kla_last_error_message(), "head_dim_v"), nullptr);
    KLA_CUDA_CHECK(cudaDeviceSynchronize());
    for (float x : dp.download_o()) ASSERT_TRUE(std::isnan(x));
    for (float x : dp.download_state()) ASSERT_TRUE(std::isnan(x));
  }
}

// docs/bad_input.md, 'Values': a NaN in a live input gives NaN in the state and the outputs that
// depend on it; an Inf is IEEE arithmetic, never a crash. Neither leaves its sequence, its value
// head (unless it is in q or k, which the group's value heads share) or, for a value, its value
// column; the chunkwise paths may carry it back to the start of its 64-token chunk (their
// triangular products multiply the zeros above the diagonal by it), never further. Two packed
// sequences, two value heads; the fault goes into sequence 1 (value head 1 for v and g).
TEST(CudaKernels, NonFiniteInputsStayWhereTheyDependOn) {
  KLA_REQUIRE_GPU();
  enum class Fault { nan_v, nan_q, inf_k, nan_g };
  for (kla_dtype dt : kDtypes)
    for (Fault f : {Fault::nan_v, Fault::nan_q, Fault::inf_k, Fault::nan_g}) {
      Config c;
      c.dtype = dt;
      c.B = 1, c.T = 200, c.H = 1, c.HV = 2, c.K = 64, c.V = 64;
      c.cu_seqlens = {0, 90, 200};
      c.eps = 1e-6f;
      c.seed = 61 + int(dt) * 4 + int(f);
      Data d = make_data(c);
      const int t0 = 90 + 70, hv = 1, j = 5;  // token 70 of sequence 1 (its second chunk)
      const float nan = std::nanf(""), inf = INFINITY;
      switch (f) {
        case Fault::nan_v: d.v[t0 * d.vs[1] + hv * d.vs[2] + j] = nan; break;
        case Fault::nan_q: d.q[t0 * d.qs[1] + 0 * d.qs[2] + 3] = nan; break;
        case Fault::inf_k: d.k[t0 * d.qs[1] + 0 * d.qs[2] + 3] = inf; break;
        case Fault::nan_g: d.g[t0 * d.gs[1] + hv] = nan; break;
      }
      DeviceProblem dp(d);
      for (Entry e : {Entry::chunk, Entry::tokenwise}) {
        const Outputs got = run_device(dp, e);
        const std::string what = std::string(entry_name(e)) + " " + dtype_name(dt) + " fault " +
                                 std::to_string(int(f)) + " on " + kla_path_name(got.ran.path);
        auto o_at = [&](int t, int h, int i) { return got.o[t * d.os[1] + h * d.os[2] + i]; };
        auto s_at = [&](int n, int h, int r, int i) {
          return got.state[((int64_t(n) * c.HV + h) * c.K + r) * c.V + i];
        };
        const bool key_fault = f == Fault::inf_k || f == Fault::nan_q;
        const int start = e == Entry::chunk ? 90 + (t0 - 90) / 64 * 64 : t0;
        for (int t = 0; t < c.T; ++t)
          for (int h = 0; h < c.HV; ++h)
            for (int i = 0; i < c.V; ++i) {
              const bool may = t >= start && (h == hv || key_fault) &&
                               (f != Fault::nan_v || i == j) && (f != Fault::nan_q || t == t0);
              if (!may) {
                ASSERT_TRUE(std::isfinite(o_at(t, h, i))) << what << " o t=" << t;
              }
            }
        for (int h = 0; h < c.HV; ++h)
          for (int r = 0; r < c.K; ++r)
            for (int i = 0; i < c.V; ++i) {
              ASSERT_TRUE(std::isfinite(s_at(0, h, r, i))) << what << " sequence 0's state";
              if (h != hv && !key_fault) {
                ASSERT_TRUE(std::isfinite(s_at(1, h, r, i))) << what << " head 0's state";
              }
            }
        // Where the policy says NaN, there is NaN.
        switch (f) {
          case Fault::nan_v:  // column j of the state and o_t0[j]
            EXPECT_TRUE(std::isnan(o_at(t0, hv, j))) << what;
            EXPECT_TRUE(std::isnan(s_at(1, hv, 0, j))) << what;
            for (int r = 0; r < c.K; ++r)
              for (int i = 0; i < c.V; ++i)
                if (i != j) {
                  ASSERT_TRUE(std::isfinite(s_at(1, hv, r, i))) << what << " column";
                }
            break;
          case Fault::nan_q:  // o_t0 of both value heads (checked above: nothing else)
            for (int h = 0; h < c.HV; ++h) EXPECT_TRUE(std::isnan(o_at(t0, h, 0))) << what;
            for (double x : got.state) ASSERT_TRUE(std::isfinite(x)) << what << " state";
            break;
          case Fault::nan_g:  // the decay of head hv: its state and its later outputs
            EXPECT_TRUE(std::isnan(s_at(1, hv, 0, 0))) << what;
            EXPECT_TRUE(std::isnan(o_at(c.T - 1, hv, 0))) << what;
            break;
          case Fault::inf_k: break;  // IEEE arithmetic: no claim beyond confinement
        }
      }
    }
}

TEST(CudaKernels, CppWrapperThrows) {
  KLA_REQUIRE_GPU();
  kla::cuda::Params p;
  try {
    kla::cuda::chunk_forward(p);
    FAIL() << "no throw";
  } catch (const kla::cuda::Error& err) {
    EXPECT_EQ(err.status(), KLA_ERROR_INVALID_SIZE);
    EXPECT_NE(std::string(err.what()).find("batch"), std::string::npos);
  }
}

}  // namespace
}  // namespace kla::test
