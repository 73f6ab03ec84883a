// KernelParams: the flat parameter block every kernel reads (FlashAttention-3's boundary: kernels
// never see kla_params, the ABI struct). Plain C++, so the host side (api/translate.cpp) fills it
// without CUDA. Defaults are resolved on the host (scale, eta), N is known, and the workspace's
// regions are located.
#pragma once

#include <cstdint>

namespace kla::kernels {

/// Tensor strides are element strides of (B, T, head); the last dimension is contiguous.
struct KernelParams {
  const void* q;  // [B,T,H,K]
  const void* k;  // [B,T,H,K]
  const void* v;  // [B,T,HV,V]
  void* o;        // [B,T,HV,V]
  int64_t qs[3], ks[3], vs[3], os[3];
  const float* g;  // [B,T,HV] or null
  int64_t gs[2];
  const float* eta;  // [B,T,HV] or null (eta_value)
  int64_t es[2];
  float eta_value;
  float eps;
  float scale;
  int kaczmarz;  // 1: beta = eta/(|k|^2+eps); 0: beta = eta
  int l2norm;    // 0: read-out scale; 1: 1/|q|; 2: q and k normalised (kQkL2NormEps), then scale
  // State addressing: sequence n uses s_in/s_out + (n*HV + hv)*K*V, or, with `indices`,
  // pool + (indices[n]*HV + hv)*K*V for both (in place; index < 0 skips the sequence).
  const float* s_in;
  float* s_out;
  float* pool;
  const int32_t* indices;
  const int32_t* cu_seqlens;  // [N+1] or null
  int N, T, H, HV, K, V;
  // Two-pass paths (TF32, WY): the caller's workspace and the largest number of 64-token chunks
  // of one sequence.
  float* ws;
  int64_t ws_record_floats;  // floats per (chunk slot, value head) record (chunk_geometry.hpp)
  // The WY path's K / Q images (fp16 / fp32 storage, chunk_geometry.hpp): after the records; null
  // where the prep writes none.
  char* ws_images;
  int max_chunks;
  // Saved states (kla_chunk_forward_saving / kla_chunk_backward_saved; bf16 at K = V = 128): per
  // (chunk slot, value head) the chunk's incoming state S [K][V], then U [64][V], bf16
  // (layout/saved_states.hpp). The WY scan compiled to save writes them; the backward's input
  // gradients read them instead of its own state scan's. Null everywhere else.
  void* saved;
};

}  // namespace kla::kernels
