// What the GPU tests (harness.hpp) and the CUDA benchmark (bench/bench_cuda.cpp) both need to
// hand a kernel its inputs: the dtypes' storage, the strides of the layouts of SPEC §3 and the
// kla_params that describes them. Kept in one place so that the benchmark times exactly the
// layouts and conversions the tests check. Needs only the CUDA runtime and kla.h: no gtest, no
// Google Benchmark, no reference (each side links only its own framework).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kla/kla.h"

/// Throws std::runtime_error naming the failed CUDA call (tests report it as a failure, the
/// benchmark as a skipped case with that message).
#define KLA_CUDA_CHECK(x)                                                        \
  do {                                                                           \
    const cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess)                                                       \
      throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)

namespace kla::test {

inline const char* dtype_name(kla_dtype d) {
  return d == KLA_DTYPE_FP32 ? "fp32" : d == KLA_DTYPE_BF16 ? "bf16" : "fp16";
}
inline std::size_t dtype_size(kla_dtype d) {
  return d == KLA_DTYPE_FP32 ? 4 : 2;
}

/// x rounded to nearest (even) in the dtype, as float (exact for bf16 / fp16).
inline float round_to(kla_dtype d, float x) {
  if (d == KLA_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(x));
  if (d == KLA_DTYPE_FP16) return __half2float(__float2half_rn(x));
  return x;
}

/// A double (a reference value) rounded to the dtype: through float first, which for bf16 / fp16
/// can differ from one direct rounding only at a tie, where either neighbour serves the bounds
/// that use it (any representable value would do: tolerance.hpp).
inline double rounded_ref(kla_dtype d, double r) {
  return double(round_to(d, float(r)));
}

/// n floats in the dtype's storage (rounded as round_to does), ready to copy to the device.
inline std::vector<unsigned char> encode(kla_dtype d, const float* x, std::size_t n) {
  const std::size_t es = dtype_size(d);
  std::vector<unsigned char> bytes(n * es);
  if (d == KLA_DTYPE_FP32) {
    if (n) std::memcpy(bytes.data(), x, n * es);
    return bytes;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (d == KLA_DTYPE_BF16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
      std::memcpy(&bytes[i * es], &h, es);
    } else {
      const __half h = __float2half_rn(x[i]);
      std::memcpy(&bytes[i * es], &h, es);
    }
  }
  return bytes;
}

/// n values in the dtype's storage (as copied from the device) as floats, exactly.
inline std::vector<float> decode(kla_dtype d, const void* storage, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(storage);
  const std::size_t es = dtype_size(d);
  std::vector<float> x(n);
  if (d == KLA_DTYPE_FP32) {
    if (n) std::memcpy(x.data(), bytes, n * es);
    return x;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (d == KLA_DTYPE_BF16) {
      __nv_bfloat16 h;
      std::memcpy(&h, &bytes[i * es], es);
      x[i] = __bfloat162float(h);
    } else {
      __half h;
      std::memcpy(&h, &bytes[i * es], es);
      x[i] = __half2float(h);
    }
  }
  return x;
}

/// The dimensions of one call: q, k [B,T,H,K]; v, o [B,T,HV,V]; g, eta [B,T,HV]; the state
/// [B,HV,K,V] (one per sequence).
struct Shape {
  kla_dtype dtype = KLA_DTYPE_FP32;
  int B = 1, T = 1, H = 1, HV = 1, K = 64, V = 64;

  std::size_t qk_elems() const { return std::size_t(B) * T * H * K; }
  std::size_t v_elems() const { return std::size_t(B) * T * HV * V; }
  std::size_t gate_elems() const { return std::size_t(B) * T * HV; }
  std::size_t state_elems() const { return std::size_t(B) * HV * K * V; }
};

/// Element strides of the batch, token and head dimensions (the last dimension is contiguous):
/// qs of q and k, vs of v, os of o, gs of g and eta.
struct Strides {
  int64_t qs[3], vs[3], os[3], gs[2];
};

/// The row-major layout of `s`, each head row of q / k, v and o followed by pad_qk, pad_v and
/// pad_o unused elements (the tests pad them to check that the kernels follow the strides).
inline Strides row_major_strides(const Shape& s, int pad_qk = 0, int pad_v = 0, int pad_o = 0) {
  Strides st;
  auto rows = [&](int64_t(&x)[3], int heads, int64_t head_row) {
    x[2] = head_row;
    x[1] = head_row * heads;
    x[0] = x[1] * s.T;
  };
  rows(st.qs, s.H, s.K + pad_qk);
  rows(st.vs, s.HV, s.V + pad_v);
  rows(st.os, s.HV, s.V + pad_o);
  st.gs[1] = s.HV;
  st.gs[0] = int64_t(s.HV) * s.T;
  return st;
}

/// kla_params for a call of shape `s` laid out as `st`: every pointer null, every option at
/// kla_params_init's default, for the caller to fill in.
inline kla_params shaped_params(const Shape& s, const Strides& st) {
  kla_params p;
  kla_params_init(&p);
  p.dtype = s.dtype;
  p.batch = s.B;
  p.seq_len = s.T;
  p.num_heads = s.H;
  p.num_v_heads = s.HV;
  p.head_dim_k = s.K;
  p.head_dim_v = s.V;
  for (int i = 0; i < 3; ++i) {
    p.q_strides[i] = p.k_strides[i] = st.qs[i];
    p.v_strides[i] = st.vs[i];
    p.o_strides[i] = st.os[i];
  }
  for (int i = 0; i < 2; ++i) p.g_strides[i] = p.eta_strides[i] = st.gs[i];
  return p;
}

}  // namespace kla::test
