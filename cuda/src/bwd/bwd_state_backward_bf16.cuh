// Backward, pass 3 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_state_backward_bf16_kernel, the state-gradient scan of
// bwd/bwd_state_scans.cuh (its file comment has the recurrence) on bf16 tensor cores, one block per
// (sequence, value head, slice of VS = 32 value columns), 8 warps, from the last chunk to the
// first:
//   dU = diag(Gamma_C. ks) K dS + X     K the raw keys (exact), dS split hi + lo (two products)
//   dS <- gamma_C dS + Y - W^T dU       W and dU split hi + lo (three products: hi hi, hi lo, lo
//   hi)
// with k^ = ks k (the record's kscale), X = M^T dY and Y = Q^^T diag(e^G) dY from the prep (fp32).
// Each warp keeps 16 rows of the dS slice in fp32 registers for the whole sequence (the mma
// accumulators of the update); dS and dU reach the products as split bf16 tiles in shared memory.
// Per chunk the block copies in (cp.async, two stages) W's two parts (BwdRecord::b_wh / b_wl),
// the raw keys, the X and Y slices, G and kscale; it writes dS (the gradient of the chunk's
// outgoing state) and dU to the record in bf16 for bwd/bwd_input_grads_bf16.cuh, their only
// reader in this configuration, and at the end d(initial state) in fp32.
//
// Precision as bwd/bwd_state_forward_bf16.cuh's: each product errs below about 2^-16 relative,
// finer than the TF32 scan's one part an operand (2^-10); dS accumulates in fp32.
#pragma once

#include <type_traits>

#include "bwd/bwd_warp_tile_bf16.cuh"

namespace kla::kernels {

template <class E>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_state_backward_bf16_kernel(const BwdParams bp) {
  using namespace bwd_bf16;
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  __builtin_assume(blockDim.x == kBwdThreads);             // the launcher's (bwd_launch.cuh)
  constexpr int VS = 32, PS = VS + 8, PU = bwd_pitch(VS);  // bf16 [.][VS] pitch: 80 bytes
  const KernelParams& p = bp.f;
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* const rec0 = bwd_record(bp, blk.n, sr, 0, blk.hv);  // chunk ch's: rec0 + ch * rstep
  const int64_t rstep = bwd_record_step(bp);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  // Shared memory (bwd_state_backward_bf16_smem): stage st: W hi, W lo, raw K [C][PB] bf16, X
  // [C][PU] and Y [K][PU] fp32, G [C], kscale [C]; then dS hi, lo [K][PS] and -dU hi, lo [C][PS]
  // bf16.
  extern __shared__ float4 smem4[];
  constexpr int kStageBytes = 2 * 3 * C * PB + 4 * ((C + K) * PU + 2 * C);
  char* const stages = reinterpret_cast<char*>(smem4);
  bf16* const Dh = reinterpret_cast<bf16*>(stages + 2 * kStageBytes);
  bf16* const Dl = Dh + K * PS;
  bf16* const Uh = Dl + K * PS;
  bf16* const Ul = Uh + C * PS;
  auto stage_w = [&](int st) { return reinterpret_cast<bf16*>(stages + st * kStageBytes); };
  auto stage_x = [&](int st) { return reinterpret_cast<float*>(stage_w(st) + 3 * C * PB); };

  // The warp's rows of the dS slice (i0s = 16 warp, all VS columns) and its 16 x 16 tile of dU.
  const int i0s = 16 * warp, i0u = (warp >> 1) * 16, n0u = (warp & 1) * 16;
  const int64_t KV = int64_t(K) * V, head = int64_t(blk.n) * p.HV + blk.hv;
  float s[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = i0s + g + 8 * (e >> 1), c = c0 + 8 * j + 2 * t + (e & 1);
      s[j][e] = bp.dht ? bp.dht[head * KV + int64_t(r) * V + c] : 0.f;
    }
  store_tile_split(Dh, Dl, PS, i0s, 0, s);

  const E* kraw = static_cast<const E*>(p.k);
  const int nch = int((sr.len + C - 1) / C);
  auto issue = [&](int st, int ch) {
    const float* rec = rec0 + ch * rstep;
    const bf16* rb = reinterpret_cast<const bf16*>(rec);
    bf16* w = stage_w(st);
    float* x = stage_x(st);
    const int64_t cs = int64_t(ch) * C;
    const int L = int(sr.len - cs < C ? sr.len - cs : C);
    cp_tile_bf16<K>(w, PB, rb + R.b_wh, C);
    cp_tile_bf16<K>(w + C * PB, PB, rb + R.b_wl, C);
    cp_input_rows(w + 2 * C * PB, PB, kraw, p.ks, sr.b, sr.t0 + cs, blk.h, L);
    bwd_cp_rows(x, PU, rec + R.du + c0, V, C, VS);
    bwd_cp_rows(x + C * PU, PU, rec + R.ds + c0, V, K, VS);
    bwd_cp_rows(x + (C + K) * PU, C, rec + R.sc + kScG * C, C, 1, C);
    bwd_cp_rows(x + (C + K) * PU + C, C, rec + R.sc + kScKscale * C, C, 1, C);
    cp_commit();
  };
  if (nch > 0) issue(0, nch - 1);
  for (int step = 0; step < nch; ++step) {
    const int ch = nch - 1 - step, st = step & 1;
    bf16* const rb = reinterpret_cast<bf16*>(rec0 + ch * rstep);
    const bf16* const Wh = stage_w(st);
    const bf16* const Wl = Wh + C * PB;
    const bf16* const Kr = Wl + C * PB;
    const float* const X = stage_x(st);
    const float* const Y = X + C * PU;
    const float* const Gs = Y + K * PU;
    const float* const ks = Gs + C;
    __syncthreads();  // the previous chunk is done with stage st ^ 1, Uh and Ul
    if (ch > 0) {
      issue(st ^ 1, ch - 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();  // stage st and dS's split tiles visible
    // dS (the chunk's outgoing state's gradient) to the record in bf16: its hi part, rounded to
    // nearest.
    for (int idx = tid; idx < K * (VS / 8); idx += kBwdThreads) {
      const int r = idx / (VS / 8), c8 = (idx % (VS / 8)) * 8;
      *reinterpret_cast<uint4*>(rb + R.b_ds + int64_t(r) * V + c0 + c8) =
          *reinterpret_cast<const uint4*>(Dh + r * PS + c8);
    }
    float u[2][4] = {};  // K dS on the warp's tile: K times hi, times lo
    warp_tile_mma<false, false, 1>(u, Kr, PB, i0u, Dh, PS, n0u, K);
    warp_tile_mma<false, false, 1>(u, Kr, PB, i0u, Dl, PS, n0u, K);
    // dU = Gamma_Ci ks_i (K dS)_i + X_i to the record in bf16; -dU split for the update.
    const float gC = expf(Gs[C - 1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = i0u + g + 8 * h;
      const float f = expf(Gs[C - 1] - Gs[i]) * ks[i];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = n0u + 8 * j + 2 * t;
        const float2 xi = *reinterpret_cast<const float2*>(X + i * PU + c);
        const float x = fmaf(f, u[j][2 * h], xi.x), y = fmaf(f, u[j][2 * h + 1], xi.y);
        *reinterpret_cast<uint32_t*>(rb + R.b_du + int64_t(i) * V + c0 + c) = round_bf16x2(x, y);
        split_bf16x2(-x, -y, *reinterpret_cast<__nv_bfloat162*>(Uh + i * PS + c),
                     *reinterpret_cast<__nv_bfloat162*>(Ul + i * PS + c));
      }
    }
    // gamma_C dS + Y on the warp's rows.
    const float gCd = KLA_MUTANT(bwd_carry_no_gamma) ? 1.f : gC;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 y =
            *reinterpret_cast<const float2*>(Y + (i0s + g + 8 * h) * PU + 8 * j + 2 * t);
        s[j][2 * h] = fmaf(gCd, s[j][2 * h], y.x);
        s[j][2 * h + 1] = fmaf(gCd, s[j][2 * h + 1], y.y);
      }
    __syncthreads();  // -dU complete; every warp done reading dS's split tiles
    warp_tile_mma<true, false>(s, Wh, PB, i0s, Uh, PS, 0, C);  // - W^T dU: hi hi
    warp_tile_mma<true, false>(s, Wh, PB, i0s, Ul, PS, 0, C);  // hi lo
    warp_tile_mma<true, false>(s, Wl, PB, i0s, Uh, PS, 0, C);  // lo hi
    store_tile_split(Dh, Dl, PS, i0s, 0, s);
  }
  if (bp.dh0)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = i0s + g + 8 * (e >> 1), c = c0 + 8 * j + 2 * t + (e & 1);
        bp.dh0[head * KV + int64_t(r) * V + c] = s[j][e];
      }
}

}  // namespace kla::kernels
