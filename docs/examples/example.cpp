// example.cpp — the C++ example of docs/api.md: variable-length prefill in bf16 through the
// thin C++ layer (kla/kla.hpp), errors as exceptions, on a caller's stream: its plan first (the
// path and why), a path request, then a CUDA graph of one decode step replayed.
// Exit status: 0 success, 77 no CUDA device (skipped), 1 failure.
#include <cmath>
#include <cstdio>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kla/kla.hpp"

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::puts("example_cpp: no CUDA device, skipped");
    return 77;
  }
  if (kla::cuda::abi_version() != KLA_ABI_VERSION) return 1;  // the library this header describes
  constexpr int H = 2, HV = 2, K = 128, V = 128;
  const std::vector<int32_t> cu = {0, 300, 301, 1000};  // three sequences packed in B = 1
  const int T = cu.back(), N = int(cu.size()) - 1;

  std::vector<__nv_bfloat16> q(size_t(T) * H * K), k(q.size()), v(size_t(T) * HV * V);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = __float2bfloat16(std::sin(0.01f * float(i)));
    k[i] = __float2bfloat16(std::cos(0.013f * float(i)));
  }
  for (size_t i = 0; i < v.size(); ++i) v[i] = __float2bfloat16(std::sin(0.7f * float(i)));

  auto upload = [](const auto& host) {
    void* d = nullptr;
    cudaMalloc(&d, host.size() * sizeof(host[0]));
    cudaMemcpy(d, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice);
    return d;
  };
  void* dq = upload(q);
  void* dk = upload(k);
  void* dv = upload(v);
  void* dcu = upload(cu);
  void* dout = nullptr;
  float* dstate = nullptr;
  cudaMalloc(&dout, v.size() * sizeof(__nv_bfloat16));
  cudaMalloc(&dstate, size_t(N) * HV * K * V * sizeof(float));
  cudaStream_t stream;
  cudaStreamCreate(&stream);

  kla::cuda::Params p;
  p.dtype = KLA_DTYPE_BF16;
  p.batch = 1;
  p.seq_len = T;
  p.num_heads = H;
  p.num_v_heads = HV;
  p.head_dim_k = K;
  p.head_dim_v = V;
  p.q = dq;
  p.k = dk;
  p.v = dv;
  p.o = dout;
  const int64_t qs[3] = {int64_t(T) * H * K, H * K, K}, vs[3] = {int64_t(T) * HV * V, HV * V, V};
  for (int i = 0; i < 3; ++i) {
    p.q_strides[i] = p.k_strides[i] = qs[i];
    p.v_strides[i] = p.o_strides[i] = vs[i];
  }
  p.eta_value = 0.9f;  // a constant gate
  p.eps = 1e-6f;
  p.readout = KLA_READOUT_Q_L2NORM;  // the paper's l2-normalised query
  p.cu_seqlens = static_cast<const int32_t*>(dcu);
  p.cu_seqlens_host = cu.data();
  p.num_seqs = N;
  p.final_state = dstate;
  p.workspace_size = kla_workspace_size(&p);  // the fast paths (NULL: only the generic kernel)
  cudaMalloc(&p.workspace, p.workspace_size);
  try {
    // What will run, and why (nothing launched); then the call itself.
    const kla_plan plan = kla::cuda::plan_chunk_forward(p);
    std::printf("path %s: %s\n", plan.path_name, plan.reason);
    kla::cuda::chunk_forward(p, stream);

    // A path request runs that path or is refused (never a fallback); whether the transposed WY
    // scan applies depends on the device and the build, so ask without throwing.
    kla::cuda::Params w = p;
    w.path = KLA_PATH_WY_TRANSPOSED;
    kla_plan wp{};
    if (kla::cuda::try_plan_chunk_forward(w, wp) == KLA_SUCCESS)
      std::printf("requested: %s\n", wp.reason);
    else
      std::printf("requested: %s\n", kla_last_error_message());

    // One decode token per sequence (reusing the first N tokens' inputs), captured once in a
    // graph and replayed: the entry point neither synchronises nor allocates.
    kla::cuda::Params d = p;
    d.batch = N;
    d.seq_len = 1;
    d.cu_seqlens = nullptr;
    d.cu_seqlens_host = nullptr;
    d.num_seqs = 0;
    d.q_strides[0] = d.k_strides[0] = H * K;  // batch row n = token n of the packed inputs
    d.v_strides[0] = d.o_strides[0] = HV * V;
    d.initial_state = dstate;
    d.final_state = dstate;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    kla::cuda::tokenwise_forward(d, stream);
    cudaStreamEndCapture(stream, &graph);
    cudaGraphInstantiate(&exec, graph, 0);
    for (int step = 0; step < 4; ++step) cudaGraphLaunch(exec, stream);
    cudaStreamSynchronize(stream);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    d.head_dim_k = 72;  // unsupported: throws kla::cuda::Error
    kla::cuda::tokenwise_forward(d, stream);
  } catch (const kla::cuda::Error& e) {
    std::printf("caught: %s (status %d)\n", e.what(), int(e.status()));
    if (e.status() != KLA_ERROR_UNSUPPORTED_HEAD_DIM) return 1;
  }
  std::vector<__nv_bfloat16> o(v.size());
  cudaMemcpy(o.data(), dout, o.size() * sizeof(o[0]), cudaMemcpyDeviceToHost);
  double sum = 0;
  bool finite = true;
  for (auto x : o) {
    const float f = __bfloat162float(x);
    finite = finite && std::isfinite(f);
    sum += f;
  }
  std::printf("kla %s: outputs finite=%d checksum=%.4f\n", kla::cuda::version().c_str(),
              int(finite), sum);
  for (void* x : {dq, dk, dv, dcu, dout, static_cast<void*>(dstate), p.workspace}) cudaFree(x);
  cudaStreamDestroy(stream);
  return finite && cudaGetLastError() == cudaSuccess ? 0 : 1;
}
