// Backward, pass 3 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_state_backward_bf16_kernel, the state-gradient scan of
// bwd/bwd_state_scans.cuh (its file comment has the recurrence) on bf16 tensor cores, one block per
// (sequence, value head, slice of VS = 32 value columns), 8 warps, from the last chunk to the
// first:
//   dU = diag(Gamma_C. ks) K dS + X    K the raw keys (exact), dS split hi + lo (two products)
//   dS <- gamma_C dS + Y - W^T dU      W and dU split hi + lo (three: hi hi, hi lo, lo hi)
// with k^ = ks k (the record's kscale), X = M^T dY and Y = Q^^T diag(e^G) dY from the prep (fp32).
// Each warp keeps 16 rows of the dS slice in fp32 registers for the whole sequence (the mma
// accumulators of the update); dS and dU reach the products as split bf16 tiles in shared memory.
// Per chunk the block copies in (cp.async) W's two parts (BwdRecord::b_wh / b_wl), the raw keys,
// the X and Y slices, G and kscale; it writes dS (the gradient of the chunk's outgoing state) and
// dU to the record in bf16 for bwd/bwd_input_grads_bf16.cuh, their only reader in this
// configuration, and at the end d(initial state) in fp32. It reads nothing the state scan writes,
// so on sm_90 it runs beside it (bwd_launch_beside).
//
// Precision as bwd/bwd_state_forward_bf16.cuh's: each product errs below about 2^-16 relative,
// finer than the TF32 scan's one part an operand (2^-10); dS accumulates in fp32.
#pragma once

#include <type_traits>

#include "bwd/bwd_warp_tile_bf16.cuh"

namespace kla::kernels {

template <class E>
__global__ void __maxnreg__(kBwdStateBackwardBf16Regs)
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

  // Shared memory (bwd_state_backward_bf16_smem): one copy stage in two cp.async groups, the keys'
  // (the raw keys [C][PB] bf16, the X [C][PU] and Y [K][PU] slices, G, kscale [C] fp32: read by dU
  // and gamma_C dS + Y) and W's (W hi, lo [C][PB] bf16: read by the update), each refilled for the
  // next chunk as soon as its readers are done; then dS hi, lo [K][PS] and -dU hi, lo [C][PS]
  // bf16. One stage (111 KB) fits beside a block of the state scan
  // (bwd_scans_share_multiprocessors).
  extern __shared__ float4 smem4[];
  bf16* const Kr = reinterpret_cast<bf16*>(smem4);
  float* const X = reinterpret_cast<float*>(Kr + C * PB);
  float* const Y = X + C * PU;
  float* const Gs = Y + K * PU;
  float* const ks = Gs + C;
  bf16* const Wh = reinterpret_cast<bf16*>(ks + C);
  bf16* const Wl = Wh + C * PB;
  bf16* const Dh = Wl + C * PB;
  bf16* const Dl = Dh + K * PS;
  bf16* const Uh = Dl + K * PS;
  bf16* const Ul = Uh + C * PS;

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
  auto issue_k = [&](int ch) {  // the raw keys, X, Y, G, kscale of chunk ch
    const float* rec = rec0 + ch * rstep;
    const int64_t cs = int64_t(ch) * C;
    const int L = int(sr.len - cs < C ? sr.len - cs : C);
    cp_input_rows(Kr, PB, kraw, p.ks, sr.b, sr.t0 + cs, blk.h, L);
    bwd_cp_rows(X, PU, rec + R.du + c0, V, C, VS);
    bwd_cp_rows(Y, PU, rec + R.ds + c0, V, K, VS);
    bwd_cp_rows(Gs, C, rec + R.sc + kScG * C, C, 1, C);
    bwd_cp_rows(ks, C, rec + R.sc + kScKscale * C, C, 1, C);
    cp_commit();
  };
  auto issue_w = [&](int ch) {  // W's parts of chunk ch
    const bf16* rb = reinterpret_cast<const bf16*>(rec0 + ch * rstep);
    cp_tile_bf16<K>(Wh, PB, rb + R.b_wh, C);
    cp_tile_bf16<K>(Wl, PB, rb + R.b_wl, C);
    cp_commit();
  };
  if (nch > 0) issue_k(nch - 1);
  for (int step = 0; step < nch; ++step) {
    const int ch = nch - 1 - step;
    bf16* const rb = reinterpret_cast<bf16*>(rec0 + ch * rstep);
    __syncthreads();  // the previous update is done with W and -dU; dS's split tiles written
    issue_w(ch);
    cp_wait<1>();     // the keys' group of chunk ch (W may still be in flight)
    __syncthreads();  // K, X, Y, G, kscale and dS's split tiles visible
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
    cp_wait<0>();
    __syncthreads();  // W and -dU complete; the keys' group and dS's split tiles read
    if (ch > 0) issue_k(ch - 1);
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
  // Launched to run beside the state scan (programmatic dependent launch, bwd_launch.cuh): this
  // grid completes only once that one has and its writes are visible, so that the kernels after
  // it, ordered after this grid alone, see both scans' records.
  grid_dependency_wait();
}

}  // namespace kla::kernels
