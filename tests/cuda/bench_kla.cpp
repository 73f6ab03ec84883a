// Kernel benchmarks (run by tools/gpu_suite.sh on the GPU machine; not a test). Times with CUDA
// events around the C entry points, after warm-up, median of repeated timings; the device copy
// bandwidth (bytes read + written) is measured in the same run for the decode floor.
//   decode: H = HV = 16, K = V = 128, one token, bf16 q/k/v/o, fp32 state updated in place;
//           per-call time of back-to-back calls, and of replays of a captured graph.
//   prefill: chunkwise forward, the SPEC §4 shapes.
// Prints a table; with an argument, also writes it to that file.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "kla/kla.h"

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define KK(x)                                                                            \
  do {                                                                                   \
    kla_status s_ = (x);                                                                 \
    if (s_ != KLA_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s: %s\n", kla_status_string(s_), kla_last_error_message()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

/// Median over `reps` timings of `iters` back-to-back runs of fn, in microseconds per run.
double time_us(const std::function<void()>& fn, int iters, int reps, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  CK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) fn();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1e3 * ms / iters);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

void fill_random(void* p, size_t bytes, unsigned seed, bool half) {
  // Small random values in the bit patterns of the storage type (finite, moderate).
  std::vector<unsigned short> h;
  std::vector<float> f;
  if (half) {
    h.resize(bytes / 2);
    unsigned x = seed;
    for (auto& v : h) {
      x = x * 1664525u + 1013904223u;
      const float r = float((x >> 9) & 0xFFFF) / 65536.0f - 0.5f;
      unsigned u;
      std::memcpy(&u, &r, 4);
      v = static_cast<unsigned short>(u >> 16);  // bf16 truncation of r
    }
    CK(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
  } else {
    f.resize(bytes / 4);
    unsigned x = seed;
    for (auto& v : f) {
      x = x * 1664525u + 1013904223u;
      v = float((x >> 9) & 0xFFFF) / 65536.0f - 0.5f;
    }
    CK(cudaMemcpy(p, f.data(), bytes, cudaMemcpyHostToDevice));
  }
}

struct Problem {
  kla_params p;
  std::vector<void*> bufs;
  Problem(kla_dtype dt, int B, int T, int H, int K, int V, bool with_state) {
    kla_params_init(&p);
    const size_t es = dt == KLA_DTYPE_FP32 ? 4 : 2;
    p.dtype = dt;
    p.batch = B, p.seq_len = T, p.num_heads = H, p.num_v_heads = H;
    p.head_dim_k = K, p.head_dim_v = V;
    auto alloc = [&](size_t bytes) {
      void* x;
      CK(cudaMalloc(&x, bytes));
      bufs.push_back(x);
      return x;
    };
    const size_t nqk = size_t(B) * T * H * K, nv = size_t(B) * T * H * V;
    p.q = alloc(nqk * es);
    p.k = alloc(nqk * es);
    p.v = alloc(nv * es);
    p.o = alloc(nv * es);
    fill_random(const_cast<void*>(p.q), nqk * es, 1, es == 2);
    fill_random(const_cast<void*>(p.k), nqk * es, 2, es == 2);
    fill_random(const_cast<void*>(p.v), nv * es, 3, es == 2);
    if (dt == KLA_DTYPE_FP16) {  // bf16 bit patterns are not fp16 values: refill sanely
      std::vector<unsigned short> h(std::max(nqk, nv), 0x2e66);  // ~0.1 in fp16
      CK(cudaMemcpy(const_cast<void*>(p.q), h.data(), nqk * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(const_cast<void*>(p.k), h.data(), nqk * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(const_cast<void*>(p.v), h.data(), nv * 2, cudaMemcpyHostToDevice));
    }
    const int64_t qs[3] = {int64_t(T) * H * K, int64_t(H) * K, K};
    const int64_t vs[3] = {int64_t(T) * H * V, int64_t(H) * V, V};
    for (int i = 0; i < 3; ++i) {
      p.q_strides[i] = p.k_strides[i] = qs[i];
      p.v_strides[i] = p.o_strides[i] = vs[i];
    }
    const size_t ng = size_t(B) * T * H;
    std::vector<float> g(ng, -0.05f), eta(ng, 0.9f);
    p.g = static_cast<float*>(alloc(ng * 4));
    p.eta = static_cast<float*>(alloc(ng * 4));
    CK(cudaMemcpy(const_cast<float*>(p.g), g.data(), ng * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(const_cast<float*>(p.eta), eta.data(), ng * 4, cudaMemcpyHostToDevice));
    p.g_strides[0] = p.eta_strides[0] = int64_t(T) * H;
    p.g_strides[1] = p.eta_strides[1] = H;
    if (with_state) {
      const size_t ns = size_t(B) * H * K * V;
      float* s = static_cast<float*>(alloc(ns * 4));
      fill_random(s, ns * 4, 4, false);
      p.initial_state = s;
      p.final_state = s;  // in place
    }
    p.eps = 1e-6f;
    p.workspace_size = kla_workspace_size(&p);
    p.workspace = alloc(p.workspace_size);  // chunkwise workspace (unused by decode)
  }
  ~Problem() {
    for (void* b : bufs) cudaFree(b);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    std::printf("bench_kla: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::ostringstream out;
  out << "device: " << prop.name << " (" << prop.multiProcessorCount << " SMs)\n";

  // Copy bandwidth: 1 GiB device-to-device, counting bytes read + written.
  const size_t cbytes = size_t(1) << 30;
  void *ca, *cb;
  CK(cudaMalloc(&ca, cbytes));
  CK(cudaMalloc(&cb, cbytes));
  CK(cudaMemset(ca, 1, cbytes));
  const double cus =
      time_us([&] { CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, s)); }, 5, 7, s);
  const double copy_bw = 2.0 * cbytes / (cus * 1e-6);  // bytes/s
  cudaFree(ca);
  cudaFree(cb);
  char line[512];
  std::snprintf(line, sizeof line, "copy bandwidth (read+write): %.2f TB/s\n", copy_bw / 1e12);
  out << line;

  out << "\n| decode (H=16, K=V=128, T=1, bf16, fp32 state in place) | us/call | graph us/call | "
         "floor us | fraction of copy rate |\n|---|---|---|---|---|\n";
  // KLA_BENCH_QUICK=i: only prefill shape i (tuning runs).
  const bool quick = std::getenv("KLA_BENCH_QUICK") != nullptr;
  for (int B : {1, 8, 64, 256}) {
    if (quick) break;
    Problem pr(KLA_DTYPE_BF16, B, 1, 16, 128, 128, true);
    const double us = time_us([&] { KK(kla_tokenwise_forward(&pr.p, s)); }, 200, 9, s);
    // Graph replay of 20 calls.
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 20; ++i) KK(kla_tokenwise_forward(&pr.p, s));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double gus = time_us([&] { CK(cudaGraphLaunch(ge, s)); }, 10, 9, s) / 20;
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    const double bytes = double(B) * 16 * 128 * 128 * 4 * 2 + double(B) * 16 * 128 * 2 * 4;
    const double floor_us = bytes / copy_bw * 1e6;
    std::snprintf(line, sizeof line, "| B=%d | %.2f | %.2f | %.1f | %.0f%% |\n", B, us, gus,
                  floor_us, 100.0 * floor_us / us);
    out << line;
  }

  out << "\n| prefill (chunkwise) | dtype | ms | memory floor ms |\n|---|---|---|---|\n";
  struct Shape {
    int B, T, H, K, V;
    kla_dtype dt;
    bool workspace;  // false: the workspace-free generic kernel
  };
  constexpr kla_dtype bf = KLA_DTYPE_BF16, f16 = KLA_DTYPE_FP16, f32 = KLA_DTYPE_FP32;
  const Shape shapes[] = {{1, 32768, 16, 128, 128, bf, true},  {4, 8192, 16, 128, 128, bf, true},
                          {8, 4096, 16, 128, 128, bf, true},   {1, 131072, 8, 128, 128, bf, true},
                          {1, 32768, 12, 96, 192, bf, true},   {1, 32768, 16, 128, 128, f16, true},
                          {4, 8192, 16, 128, 128, f16, true},  {8, 4096, 16, 128, 128, f16, true},
                          {1, 131072, 8, 128, 128, f16, true}, {1, 32768, 12, 96, 192, f16, true},
                          {1, 32768, 16, 128, 128, f32, true}, {4, 8192, 16, 128, 128, f32, true},
                          {1, 32768, 12, 96, 192, f32, true},  {1, 32768, 16, 128, 128, bf, false}};
  for (const Shape& sh : shapes) {
    if (quick && &sh != &shapes[std::atoi(std::getenv("KLA_BENCH_QUICK"))]) continue;
    Problem pr(sh.dt, sh.B, sh.T, sh.H, sh.K, sh.V, false);
    if (!sh.workspace) pr.p.workspace = nullptr;
    const double us = time_us([&] { KK(kla_chunk_forward(&pr.p, s)); }, 2, 5, s);
    const double es = sh.dt == KLA_DTYPE_FP32 ? 4 : 2;
    const double bytes = double(sh.B) * sh.T * sh.H * ((2.0 * sh.K + 2.0 * sh.V) * es + 8);
    std::snprintf(line, sizeof line, "| %dx%dx%d K=%d V=%d%s | %s | %.3f | %.3f |\n", sh.B, sh.T,
                  sh.H, sh.K, sh.V, sh.workspace ? "" : " (no workspace: generic kernel)",
                  sh.dt == KLA_DTYPE_FP32   ? "fp32"
                  : sh.dt == KLA_DTYPE_BF16 ? "bf16"
                                            : "fp16",
                  us / 1e3, bytes / copy_bw * 1e3);
    out << line;
  }
  std::printf("%s", out.str().c_str());
  if (argc > 1) std::ofstream(argv[1]) << out.str();
  cudaStreamDestroy(s);
  return 0;
}
