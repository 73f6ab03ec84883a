// The sequence split's kernels and launch (cp/segments.hpp has the algebra and the layout).
//
//   split_setup_kernel    the segments' cu_seqlens (segment_start, the host's cuts bit for bit)
//                         and the maps pass's initial states [I | 0], [M, HV, K, K + V]
//   widen_values_kernel   the maps pass's values [0 | v], [tokens, HV, K + V] in the dtype
//   fold_kernel           S_in(b n) = initial state, S_in(b n + s + 1) = A S_in(b n + s) + L, one
//                         block per (sequence, value head, 8 columns), fp32 FMA in k order
//
// then the two passes through the ordinary launchers, and the last segments' final states copied
// out. Everything is enqueued on the caller's stream: no host synchronisation, no allocation.
#include <cuda_runtime.h>

#include <vector>

#include "api/translate.hpp"
#include "common/kernel_mutants.hpp"
#include "cp/segments.hpp"
#include "cp/split_launch.hpp"
#include "launch/launchers.hpp"
#include "plan/plan.hpp"

namespace kla::cp {
namespace {

constexpr int kThreads = 256;
constexpr int kFoldColumns = 8;  // value columns a fold block carries (4 a thread, 2 threads a row)

__global__ void split_setup_kernel(int32_t* cuts, const int32_t* cu_seqlens, int64_t N, int64_t T,
                                   int n, float* identity, int64_t M, int64_t HV, int64_t K,
                                   int64_t W) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t m = first; m <= M; m += stride) {
    if (m == M) {
      cuts[M] = int32_t(cu_seqlens ? cu_seqlens[N] : N * T);
      continue;
    }
    const int64_t b = m / n;
    const int j = int(m % n);
    const int64_t base = cu_seqlens ? cu_seqlens[b] : b * T;
    const int64_t len = cu_seqlens ? cu_seqlens[b + 1] - base : T;
    cuts[m] = int32_t(base + segment_start(len, n, j));
  }
  const int64_t elems = M * HV * K * W;
  for (int64_t e = first; e < elems; e += stride) {
    const int64_t c = e % W, i = (e / W) % K;
    identity[e] = c == i ? 1.0f : 0.0f;
  }
}

/// [0 | v] in 16-byte units: a row of W = K + V elements is zero units, then v's row.
__global__ void widen_values_kernel(char* out, const char* v, int64_t tokens, int64_t T,
                                    bool packed, int64_t HV, int64_t vs0, int64_t vs1, int64_t vs2,
                                    int es, int64_t zero_units, int64_t units) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t total = tokens * HV * units;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t u = e % units, h = (e / units) % HV, tt = e / (units * HV);
    uint4 x = make_uint4(0, 0, 0, 0);
    if (u >= zero_units) {
      const int64_t b = packed ? 0 : tt / T, t = packed ? tt : tt % T;
      const char* row = v + (b * vs0 + t * vs1 + h * vs2) * es;
      x = reinterpret_cast<const uint4*>(row)[u - zero_units];
    }
    reinterpret_cast<uint4*>(out)[e] = x;
  }
}

/// One block per (sequence b, value head h, 8 value columns from c0): the fold over the sequence's
/// n segments. maps [M, HV, K, W] holds [A | L] row by row (W = K + V); states [M, HV, K, V].
__global__ void __launch_bounds__(kThreads)
    fold_kernel(const float* maps, const float* h0, float* states, int n, int64_t HV, int K,
                int V) {
  __shared__ float S[240][kFoldColumns];  // K <= 240 (K + V <= 256)
  const int64_t b = blockIdx.x / HV, h = blockIdx.x % HV;
  const int c0 = int(blockIdx.y) * kFoldColumns;
  const int W = K + V;
  const int t = int(threadIdx.x);
  auto state_at = [&](int64_t m, int i, int c) { return ((m * HV + h) * K + i) * V + c0 + c; };
  for (int e = t; e < K * kFoldColumns; e += kThreads) {
    const int i = e / kFoldColumns, c = e % kFoldColumns;
    const float x = h0 ? h0[((b * HV + h) * K + i) * V + c0 + c] : 0.0f;
    S[i][c] = x;
    states[state_at(b * n, i, c)] = x;
  }
  __syncthreads();
  const int half = (t & 1) * 4;
  for (int s = 0; s + 1 < n; ++s) {
    const int64_t m = b * n + s;
    float acc[2][4];
    for (int r = 0; r < 2; ++r) {
      const int i = (t >> 1) + r * (kThreads / 2);
      if (i >= K) continue;
      const float* row = maps + ((m * HV + h) * K + i) * W;
      for (int j = 0; j < 4; ++j) acc[r][j] = row[K + c0 + half + j];  // L
      if (KLA_MUTANT(split_fold_transition_skipped)) continue;
      for (int k = 0; k < K; k += 4) {  // + A S, k in order
        const float4 a = *reinterpret_cast<const float4*>(row + k);
        const float av[4] = {a.x, a.y, a.z, a.w};
        for (int kk = 0; kk < 4; ++kk)
          for (int j = 0; j < 4; ++j) acc[r][j] = fmaf(av[kk], S[k + kk][half + j], acc[r][j]);
      }
    }
    __syncthreads();  // every read of S_in(s) is done
    for (int r = 0; r < 2; ++r) {
      const int i = (t >> 1) + r * (kThreads / 2);
      if (i >= K) continue;
      for (int j = 0; j < 4; ++j) {
        S[i][half + j] = acc[r][j];
        states[state_at(m + 1, i, half + j)] = acc[r][j];
      }
    }
    __syncthreads();
  }
}

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return int(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

cudaError_t launch_split(const kla_params& p, int n, const plan::DeviceInfo& dev,
                         cudaStream_t stream, const char*& what) {
  KLA_SYNC_KERNEL_MUTANT(stream, what);
  const SplitLayout L = split_layout(p, n);
  const std::vector<int32_t> cuts = segment_cuts(p, n);
  const kla_params maps = pass_params(p, L, true, cuts), second = pass_params(p, L, false, cuts);
  plan::Plan maps_plan, second_plan;
  if (plan::plan_chunk(maps, dev, plan::this_build(), maps_plan) != KLA_SUCCESS ||
      plan::plan_chunk(second, dev, plan::this_build(), second_plan) != KLA_SUCCESS) {
    what = "the split's pass plans";  // planned already by kla_chunk_forward's plan: unreachable
    return cudaErrorInvalidConfiguration;
  }
  char* ws = static_cast<char*>(p.workspace);
  const int64_t W = L.K + L.V, es = p.dtype == KLA_DTYPE_FP32 ? 4 : 2;
  const bool packed = p.cu_seqlens != nullptr;

  what = "the split's setup";
  split_setup_kernel<<<grid_for(std::max<int64_t>(L.M + 1, L.M * L.HV * L.K * W)), kThreads, 0,
                       stream>>>(reinterpret_cast<int32_t*>(ws + L.cuts), p.cu_seqlens, L.N,
                                 p.seq_len, n, reinterpret_cast<float*>(ws + L.identity), L.M, L.HV,
                                 L.K, W);
  if (cudaError_t e = cudaGetLastError()) return e;
  const int64_t units = W * es / 16, zero_units = L.K * es / 16;
  widen_values_kernel<<<grid_for(L.tokens * L.HV * units), kThreads, 0, stream>>>(
      ws + L.values, static_cast<const char*>(p.v), L.tokens, p.seq_len, packed, L.HV,
      p.v_strides[0], p.v_strides[1], p.v_strides[2], int(es), zero_units, units);
  if (cudaError_t e = cudaGetLastError()) return e;

  if (cudaError_t e =
          kernels::launch(detail::translate(maps, maps_plan), maps_plan, p.dtype, stream, what))
    return e;

  what = "the split's fold";
  fold_kernel<<<dim3(unsigned(L.N * L.HV), unsigned(L.V / kFoldColumns)), kThreads, 0, stream>>>(
      reinterpret_cast<const float*>(ws + L.maps), p.initial_state,
      reinterpret_cast<float*>(ws + L.states), n, L.HV, int(L.K), int(L.V));
  if (cudaError_t e = cudaGetLastError()) return e;

  if (cudaError_t e = kernels::launch(detail::translate(second, second_plan), second_plan, p.dtype,
                                      stream, what))
    return e;
  if (p.final_state) {  // each sequence's last segment: [N] rows of HV K V floats, n apart
    what = "the split's final states";
    const size_t row = size_t(L.HV * L.K * L.V) * sizeof(float);
    return cudaMemcpy2DAsync(p.final_state, row, ws + L.finals + (n - 1) * row, n * row, row,
                             size_t(L.N), cudaMemcpyDeviceToDevice, stream);
  }
  return cudaSuccess;
}

}  // namespace kla::cp
