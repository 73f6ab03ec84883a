// BwdParams: the flat parameter block of the backward kernels (the forward's KernelParams plus
// the gradients' addresses). Plain C++, filled on the host by api/backward_translate.cpp.
#pragma once

#include <cstdint>

#include "common/kernel_params.hpp"

namespace kla::kernels {

struct BwdParams {
  KernelParams f;  // the forward call (o, s_out, pool unused; ws = the backward's workspace)
  const void* dO;  // [B,T,HV,V] dtype
  int64_t dos[3];
  const float* dht;  // [N,HV,K,V] or null (zero)
  void* dq;          // [B,T,H,K] dtype
  int64_t dqs[3];
  void* dk;  // [B,T,H,K] dtype
  int64_t dks[3];
  void* dv;  // [B,T,HV,V] dtype
  int64_t dvs[3];
  float* dg;  // [B,T,HV] or null
  int64_t dgs[2];
  float* deta;  // [B,T,HV] or null
  int64_t des[2];
  float* dh0;  // [N,HV,K,V] or null
  float* ws;   // records (bwd_layout.hpp)
  int64_t rec_floats;
  int group;         // HV / H
  int fast;          // 1: the forward's arithmetic is FAST (one-part products, bwd/block_gemm.cuh)
  int programmatic;  // 1: the device launches programmatically (sm_90 and later; bwd_launch.cuh)
  int grads_chunks;  // chunks a block of the bf16 input gradients takes in turn (bwd_block_chunks)
  int sms;           // the device's multiprocessors
  int prep_beside;   // 1: the saved prep runs beside the state-gradient scan (bwd_layout.hpp)
  int beside_first;  // its items every prep block takes before all but one a multiprocessor leave
  int chain_seg;     // > 0: the state-gradient chain as segments of this many chunks
                     // (bwd/bwd_state_grad_segments.cuh, bwd_layout.hpp bwd_chain_segment)
};

}  // namespace kla::kernels
