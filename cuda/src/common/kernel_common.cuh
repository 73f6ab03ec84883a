// Shared by every kernel: dtype traits, warp helpers and the addressing of the [B,T,H,K] /
// [B,T,HV,V] tensors, the [B,T,HV] gates, the [N,HV,K,V] states and the workspace's chunk slots,
// plus the per-token coefficients of the normalised-key form. The parameter block itself is
// common/kernel_params.hpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/kernel_mutants.hpp"
#include "common/kernel_params.hpp"
#include "layout/chunk_geometry.hpp"

namespace kla::kernels {

using namespace kla::layout;  // the shared geometry (kChunk, record layouts, tile offsets)

template <class E>
struct Dtype;
template <>
struct Dtype<float> {
  __device__ static float to_float(float x) { return x; }
  __device__ static float from_float(float x) { return x; }
};
template <>
struct Dtype<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  /// A pair in one 32-bit register (x in the low half), rounded to nearest; and back.
  __device__ static uint32_t pack2(float x, float y) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ static float2 unpack2(uint32_t r) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
  }
};
template <>
struct Dtype<__half> {
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
  __device__ static uint32_t pack2(float x, float y) {
    const __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ static float2 unpack2(uint32_t r) {
    return __half22float2(*reinterpret_cast<const __half2*>(&r));
  }
};

/// The layout's element tag of a storage type (layout/chunk_geometry.hpp).
template <class E>
constexpr Elem elem_of() {
  return std::is_same_v<E, float> ? Elem::F32 : std::is_same_v<E, __half> ? Elem::F16 : Elem::BF16;
}

__device__ __forceinline__ float warp_sum(float x) {
  // Fixed butterfly order: the same inputs give bitwise the same sum in every lane.
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// The three parts of a split product (hi hi, hi lo, lo hi; mma3, mma_bf16_split) at accumulator
/// element e, summed small parts first.
__device__ __forceinline__ float parts_sum(const float (&d)[3][4], int e) {
  return d[0][e] + (d[1][e] + d[2][e]);
}

/// Sequence n's token range [t0, t0+len) in batch row b, from cu_seqlens or the fixed layout.
struct SeqRange {
  int64_t b, t0, len;
};
/// The query / key head that value head hv reads (HV a multiple of H; no division where they
/// are equal, the common case).
__device__ __forceinline__ int key_head(const KernelParams& p, int hv) {
  return p.HV == p.H ? hv : hv / (p.HV / p.H);
}
__device__ __forceinline__ SeqRange seq_range(const KernelParams& p, int n) {
  if (p.cu_seqlens) {
    const int64_t a = p.cu_seqlens[n], e = p.cu_seqlens[n + 1];
    return {0, a, e - a};
  }
  return {n, 0, p.T};
}

/// Workspace chunk slot of chunk c of sequence n (layout/chunk_geometry.hpp).
__device__ __forceinline__ int64_t chunk_slot(const KernelParams& p, int n, const SeqRange& sr,
                                              int c) {
  if (p.cu_seqlens) return sr.t0 / kChunk + n + c;
  return int64_t(n) * ((p.T + kChunk - 1) / kChunk) + c;
}

/// Token t's step size eta (per token and value head, or the scalar p.eta_value) and log decay
/// (0 without g) for value head hv of batch row b: the [B,T,HV] addressing every kernel shares.
__device__ __forceinline__ float token_eta(const KernelParams& p, int64_t b, int64_t t, int hv) {
  return p.eta ? p.eta[b * p.es[0] + t * p.es[1] + hv] : p.eta_value;
}
__device__ __forceinline__ float token_log_decay(const KernelParams& p, int64_t b, int64_t t,
                                                 int hv) {
  return p.g ? p.g[b * p.gs[0] + t * p.gs[1] + hv] : 0.f;
}

/// Where head (n, hv) reads and writes its [K,V] fp32 state: the pool row p.indices[n], updated
/// in place (skip when the index is -1), or the optional initial / final state tensors
/// [N,HV,K,V]. One place for the addressing every kernel shares.
struct StateSlot {
  const float* in;
  float* out;
  bool skip;
};
__device__ __forceinline__ StateSlot state_slot(const KernelParams& p, int n, int hv, int64_t KV) {
  if (p.indices) {
    const int idx = p.indices[n];
    if (idx < 0) return {nullptr, nullptr, true};
    float* s = p.pool + (int64_t(idx) * p.HV + hv) * KV;
    return {s, s, false};
  }
  return {p.s_in ? p.s_in + (int64_t(n) * p.HV + hv) * KV : nullptr,
          p.s_out ? p.s_out + (int64_t(n) * p.HV + hv) * KV : nullptr, false};
}

/// What a scan block (one per value-column slice, value head and sequence; slices fastest in
/// blockIdx.x) works on: value columns [c0, c0 + VS) of value head hv (query / key head h) of
/// sequence n, its state slot and token range.
struct ScanTile {
  int n, hv, h, slice, c0;
  StateSlot slot;
  SeqRange sr;
};
__device__ __forceinline__ ScanTile scan_tile(const KernelParams& p, int K, int V, int VS) {
  const int nslices = V / VS;
  ScanTile t;
  t.slice = int(blockIdx.x % nslices);
  t.hv = int((blockIdx.x / nslices) % p.HV);
  t.n = int(blockIdx.x / (unsigned(nslices) * p.HV));
  t.h = key_head(p, t.hv);
  t.c0 = t.slice * VS;
  t.slot = state_slot(p, t.n, t.hv, int64_t(K) * V);
  t.sr = seq_range(p, t.n);
  return t;
}

/// epsilon of the qk l2-norm read-out (flash-linear-attention's l2norm): x / sqrt(|x|^2 + 1e-6).
constexpr float kQkL2NormEps = 1e-6f;

/// The per-token coefficients of the normalised-key form (SPEC §1): KLA(q,k,v,eta) equals
/// GDN(q, k^, v^, beta = eta) with k^ = k/r, v^ = v/r, r = sqrt(|k|^2 + eps). Kernels scale
/// keys by `kscale`, values by `vscale` and use `beta`; for |k|^2 + eps == 0 all are 0 (the
/// degenerate convention: the token only decays). Given mode: kscale = vscale = 1, beta = eta.
/// With the qk l2-norm read-out the key is first k / r_n, r_n = sqrt(|k|^2 + kQkL2NormEps): then
/// kscale = 1 / (r_n r'), vscale = 1 / r' with r' = sqrt(|k|^2 / r_n^2 + eps) (given mode: r' = 1).
/// The chunkwise paths form the residual as kscale (rho v - K S) with rho = vscale / kscale.
struct TokenCoef {
  float kscale, vscale, beta;
};
__device__ __forceinline__ TokenCoef token_coef(float k_sqnorm, float eta, const KernelParams& p) {
  float kn = 1.0f;  // 1 / r_n
  if (p.l2norm == 2) {
    const float rn2 = k_sqnorm + kQkL2NormEps;
    kn = 1.0f / sqrtf(rn2);
    k_sqnorm = k_sqnorm / rn2;
  }
  if (!p.kaczmarz) return {kn, 1.0f, eta};
  const float eps = p.eps;
  const float d = k_sqnorm + (KLA_MUTANT(beta_eps_zero) && eps == 0.0f ? 0x1p-20f : eps);
  if (!(d > 0.0f)) return {0.0f, 0.0f, 0.0f};
  const float s = 1.0f / sqrtf(d);
  return {s * kn, s, eta};
}

__device__ __forceinline__ float readout_scale(float q_sqnorm, const KernelParams& p) {
  if (p.l2norm == 0) return p.scale;
  if (p.l2norm == 2) return p.scale / sqrtf(q_sqnorm + kQkL2NormEps);
  return q_sqnorm > 0.0f ? 1.0f / sqrtf(q_sqnorm) : 0.0f;
}

}  // namespace kla::kernels
