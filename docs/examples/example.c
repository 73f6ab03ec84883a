/* example.c — the C example of docs/api.md: plan a prefill (print the path and the reason), run
 * it with kla_chunk_forward, then one decode step with kla_tokenwise_forward on the state left by
 * the prefill (in place); a path request that cannot run and a bad call are refused.
 * Exit status: 0 on success, 77 when no CUDA device exists (skipped), 1 on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "kla/kla.h"

enum { B = 2, T = 100, H = 4, HV = 8, K = 64, V = 64 };

static void* device_copy(const void* host, size_t bytes) {
  void* d = NULL;
  if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
  cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  return d;
}

static void set_layout(kla_params* p, int64_t t) {
  p->q_strides[0] = p->k_strides[0] = t * H * K; /* [B,T,H,K] contiguous */
  p->q_strides[1] = p->k_strides[1] = H * K;
  p->q_strides[2] = p->k_strides[2] = K;
  p->v_strides[0] = p->o_strides[0] = t * HV * V; /* [B,T,HV,V] contiguous */
  p->v_strides[1] = p->o_strides[1] = HV * V;
  p->v_strides[2] = p->o_strides[2] = V;
  p->g_strides[0] = t * HV; /* [B,T,HV] */
  p->g_strides[1] = HV;
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("example_c: no CUDA device, skipped\n");
    return 77;
  }
  /* fp32 inputs for brevity; KLA_DTYPE_BF16 / KLA_DTYPE_FP16 take 2-byte elements. */
  const size_t nqk = (size_t)B * (T + 1) * H * K, nv = (size_t)B * (T + 1) * HV * V;
  float* hq = malloc(nqk * sizeof(float));
  float* hk = malloc(nqk * sizeof(float));
  float* hv = malloc(nv * sizeof(float));
  float* hg = malloc((size_t)B * (T + 1) * HV * sizeof(float));
  for (size_t i = 0; i < nqk; ++i) {
    hq[i] = (float)sin(0.1 * (double)i);
    hk[i] = (float)cos(0.37 * (double)i);
  }
  for (size_t i = 0; i < nv; ++i) hv[i] = (float)sin(0.05 * (double)i + 1.0);
  for (size_t i = 0; i < (size_t)B * (T + 1) * HV; ++i) hg[i] = -0.02f;

  float* q = device_copy(hq, nqk * sizeof(float));
  float* k = device_copy(hk, nqk * sizeof(float));
  float* v = device_copy(hv, nv * sizeof(float));
  float* g = device_copy(hg, (size_t)B * (T + 1) * HV * sizeof(float));
  float *o = NULL, *state = NULL;
  cudaMalloc((void**)&o, nv * sizeof(float));
  cudaMalloc((void**)&state, (size_t)B * HV * K * V * sizeof(float));

  /* 1. Prefill the first T tokens of each sequence (batch rows hold T+1 tokens, so the token
   *    stride is the padded one and the batch stride spans T+1 tokens). */
  kla_params p;
  kla_params_init(&p); /* Kaczmarz coefficient, eta = 1, eps = 0, scale = K^-1/2 */
  p.dtype = KLA_DTYPE_FP32;
  p.batch = B;
  p.seq_len = T;
  p.num_heads = H;
  p.num_v_heads = HV;
  p.head_dim_k = K;
  p.head_dim_v = V;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.g = g;
  set_layout(&p, T + 1);
  p.eps = 1e-6f;
  p.final_state = state; /* initial_state NULL: start from zero */
  /* The chunkwise fast paths need a device workspace (NULL: only the slower generic kernel). */
  p.workspace_size = kla_workspace_size(&p);
  if (cudaMalloc(&p.workspace, p.workspace_size) != cudaSuccess) return 1;
  /* The plan: the path and tiling kla_chunk_forward runs for p on this device, and why; nothing
   * is launched. p.path is AUTO (kla_params_init): the plan chooses. */
  kla_plan plan;
  kla_status s = kla_plan_chunk_forward(&p, &plan);
  if (s != KLA_SUCCESS) {
    fprintf(stderr, "kla_plan_chunk_forward: %s: %s\n", kla_status_string(s),
            kla_last_error_message());
    return 1;
  }
  printf("path %s: %s\n", plan.path_name, plan.reason);
  s = kla_chunk_forward(&p, NULL);
  if (s != KLA_SUCCESS) {
    fprintf(stderr, "kla_chunk_forward: %s: %s\n", kla_status_string(s), kla_last_error_message());
    return 1;
  }

  /* 2. Decode token T of every sequence, state updated in place. */
  kla_params d = p;
  d.seq_len = 1;
  d.q = q + T * H * K;
  d.k = k + T * H * K;
  d.v = v + T * HV * V;
  d.o = o + T * HV * V;
  d.g = g + T * HV;
  d.initial_state = state;
  d.final_state = state;
  s = kla_tokenwise_forward(&d, NULL);
  if (s != KLA_SUCCESS) {
    fprintf(stderr, "kla_tokenwise_forward: %s: %s\n", kla_status_string(s),
            kla_last_error_message());
    return 1;
  }

  /* 3. A path request runs that path or fails, never falls back: fp32 with arithmetic ACCURATE
   *    is no call for the WY path (on any device), so nothing is launched or written. */
  kla_params r = p;
  r.path = KLA_PATH_WY;
  const kla_status refused = kla_chunk_forward(&r, NULL);
  printf("path wy -> %s: %s\n", kla_status_string(refused), kla_last_error_message());

  /* 4. A bad call: the status names the problem, nothing is launched. */
  d.num_v_heads = 6;
  s = kla_tokenwise_forward(&d, NULL);
  printf("bad call -> %s: %s\n", kla_status_string(s), kla_last_error_message());

  float* ho = malloc(nv * sizeof(float));
  cudaMemcpy(ho, o, nv * sizeof(float), cudaMemcpyDeviceToHost);
  double sum = 0;
  int finite = 1;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t <= T; ++t)
      for (int i = 0; i < HV * V; ++i) {
        const float x = ho[((size_t)b * (T + 1) + t) * HV * V + i];
        finite &= isfinite(x);
        sum += x;
      }
  printf("kla %s: outputs finite=%d checksum=%.6f\n", kla_version_string(), finite, sum);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(g), cudaFree(o), cudaFree(state);
  cudaFree(p.workspace);
  free(hq), free(hk), free(hv), free(hg), free(ho);
  return finite && refused == KLA_ERROR_UNSUPPORTED_PATH && s == KLA_ERROR_SHAPE_MISMATCH ? 0 : 1;
}
