// Backward, pass 2 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_state_forward_bf16_kernel, the state scan of
// bwd/bwd_state_scans.cuh (its file comment has the recurrence) on bf16 tensor cores, one block per
// (sequence, value head, slice of VS = 32 value columns), 8 warps:
//   U = U0 - W S                      W and S split hi + lo (three products: hi hi, hi lo, lo hi)
//   S <- gamma_C S + K^T (diag(Gamma_C. ks) U)   K the raw keys (exact), the scaled U split
// with k^ = ks k (the record's kscale). Each warp keeps 16 rows of the state slice in fp32
// registers for the whole sequence (the mma accumulators of the update); S and the scaled U reach
// the products as split bf16 tiles in shared memory. Per chunk the block copies in W's two parts,
// the raw keys, the U0 slice, G and kscale, by bulk copies that one thread issues (the prep lays
// them out as this kernel holds them: bwd_bf16_record_fits); it writes S (entering the chunk) and U
// to the record in bf16 for bwd/bwd_input_grads_bf16.cuh, their only reader in this configuration.
//
// Precision: a split operand errs below 2^-18 relative (bwd_bf16::split_bf16x2), the dropped
// lo lo product below 2^-18, raw keys are exact, so each product errs below about 2^-16: finer
// than the TF32 scan's one part an operand (2^-10); the state itself accumulates in fp32. A split
// product's parts accumulate apart (warp_tile_mma_split*: shorter chains of dependent mma) and
// are added small ones first, which leaves that bound as it is.
#pragma once

#include <type_traits>

#include "bwd/bwd_warp_tile_bf16.cuh"

namespace kla::kernels {

template <class E>
__global__ void __maxnreg__(kBwdStateForwardBf16Regs)
    bwd_state_forward_bf16_kernel(const BwdParams bp) {
  using namespace bwd_bf16;
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  __builtin_assume(blockDim.x == kBwdThreads);                // the launcher's (bwd_launch.cuh)
  constexpr int VS = kBwdBf16Slice, PS = kBwdBf16SlicePitch;  // bf16 [.][VS] pitch: 80 bytes
  const KernelParams& p = bp.f;
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* const rec0 = bwd_record(bp, blk.n, sr, 0, blk.hv);  // chunk ch's: rec0 + ch * rstep
  const int64_t rstep = bwd_record_step(bp);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  // Shared memory (bwd_state_forward_bf16_smem): one copy stage in two groups (ScanCopyGroup):
  // W's (W hi, W lo [C][PB] bf16, the U0 slice [C][VS] fp32 (bwd_sliced_index),
  // G, kscale [C] fp32: read by U = U0 - W S) and the raw keys' (K [C][PB] bf16: read by the
  // update), each refilled for the next chunk as soon as its readers are done; then S hi, lo
  // [K][PS] and the scaled U hi, lo [C][PS] bf16; the two barriers. One stage (90 KB) leaves room
  // on a multiprocessor for a block of the state-gradient scan beside it
  // (bwd_scans_share_multiprocessors).
  extern __shared__ float4 smem4[];
  bf16* const Wh = reinterpret_cast<bf16*>(smem4);
  bf16* const Wl = Wh + C * PB;
  float* const U0 = reinterpret_cast<float*>(Wl + C * PB);
  float* const Gs = U0 + C * VS;
  float* const ks = Gs + C;
  bf16* const Kr = reinterpret_cast<bf16*>(ks + C);
  bf16* const Sh = Kr + C * PB;
  bf16* const Sl = Sh + K * PS;
  bf16* const Uh = Sl + K * PS;
  bf16* const Ul = Uh + C * PS;
  // The state-gradient scan, launched after this one (bwd_launch.cuh), may start now: it reads
  // nothing this kernel writes.
  grid_launch_dependents();

  // The warp's rows of the state slice (i0s = 16 warp, all VS columns) and its 16 x 16 tile of U.
  const int i0s = 16 * warp, i0u = (warp >> 1) * 16, n0u = (warp & 1) * 16;
  float s[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = i0s + g + 8 * (e >> 1), c = c0 + 8 * j + 2 * t + (e & 1);
      s[j][e] = blk.slot.in ? blk.slot.in[int64_t(r) * V + c] : 0.f;
    }
  store_tile_split(Sh, Sl, PS, i0s, 0, s);

  const int nch = int((sr.len + C - 1) / C);
  // The two groups, refilled once a chunk: W's (refill ch: chunk ch), then the keys' (refill ch:
  // chunk ch). Rows past the sequence's end arrive as the prep wrote them: zero.
  const ScanCopyGroup wg{reinterpret_cast<uint64_t*>(Ul + C * PS)}, kg{wg.bar + 1};
  // The raw keys are in the record of the key head's first value head (the same chunk). The
  // kernel mutant bwd_scan_keys_own_record reads its own head's, which the prep leaves unwritten
  // there but for the first value head of a group.
  const float* const kr0 = KLA_MUTANT(bwd_scan_keys_own_record)
                               ? rec0
                               : bwd_record_of_head(bp, rec0, blk.hv, blk.h * bp.group);
  auto issue_w = [&](int ch) {  // W's parts, U0, G, kscale of chunk ch
    const float* rec = rec0 + ch * rstep;
    const bf16* rb = reinterpret_cast<const bf16*>(rec);
    wg.expect(unsigned(2 * C * PB * 2 + C * VS * 4 + 2 * C * 4));
    wg.copy(Wh, rb + R.b_wh, unsigned(2 * C * PB * 2));  // W hi, then W lo
    wg.copy(U0, rec + R.u + blk.slice * C * VS, unsigned(C * VS * 4));
    wg.copy(Gs, rec + R.sc + kScG * C, unsigned(C * 4));
    wg.copy(ks, rec + R.sc + kScKscale * C, unsigned(C * 4));
    wg.commit();
  };
  auto issue_k = [&](int ch) {  // the raw keys of chunk ch
    const bf16* rb = reinterpret_cast<const bf16*>(kr0 + ch * rstep);
    kg.expect(unsigned(C * PB * 2));
    kg.copy(Kr, rb + R.b_kr, unsigned(C * PB * 2));
    kg.commit();
  };
  wg.init();
  kg.init();
  if (nch > 0) issue_w(0);
  for (int ch = 0; ch < nch; ++ch) {
    bf16* const rb = reinterpret_cast<bf16*>(rec0 + ch * rstep);
    // The previous update is done with K and the scaled U; S's tiles written; the barriers
    // initialised.
    __syncthreads();
    issue_k(ch);
    wg.wait<1>(ch);  // W, U0, G, kscale of chunk ch (the keys may still be in flight)
    // S entering the chunk to the record in bf16: its hi part is S rounded to nearest.
    for (int idx = tid; idx < K * (VS / 8); idx += kBwdThreads) {
      const int r = idx / (VS / 8), c8 = (idx % (VS / 8)) * 8;
      *reinterpret_cast<uint4*>(rb + R.b_s + int64_t(r) * V + c0 + c8) =
          *reinterpret_cast<const uint4*>(Sh + r * PS + c8);
    }
    float u[3][2][4] = {};  // W S on the warp's tile: hi hi, hi lo, lo hi (three chains)
    warp_tile_mma_split<false, false, 1>(u[0], u[1], u[2], Wh, Wl, PB, i0u, Sh, Sl, PS, n0u, K);
    // U = U0 - W S to the record in bf16; Gamma_Ci ks_i u_i split for the update.
    const float gC = expf(Gs[C - 1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = i0u + g + 8 * h;
      const float f = expf(Gs[C - 1] - Gs[i]) * ks[i];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = n0u + 8 * j + 2 * t;
        const float2 u0 = sliced_pair(U0, i, c);
        const float x = u0.x - (u[0][j][2 * h] + (u[1][j][2 * h] + u[2][j][2 * h])),
                    y = u0.y - (u[0][j][2 * h + 1] + (u[1][j][2 * h + 1] + u[2][j][2 * h + 1]));
        *reinterpret_cast<uint32_t*>(rb + R.b_u + int64_t(i) * V + c0 + c) = round_bf16x2(x, y);
        split_bf16x2(f * x, f * y, *reinterpret_cast<__nv_bfloat162*>(Uh + i * PS + c),
                     *reinterpret_cast<__nv_bfloat162*>(Ul + i * PS + c));
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= gC;
    kg.wait<0>(ch);   // the keys of chunk ch
    __syncthreads();  // the scaled U complete; W's group and S's tiles read
    if (ch + 1 < nch) issue_w(ch + 1);
    {  // + K^T (Gamma ks U): the hi part into the state, the lo part beside it, then added
      float lo[4][4] = {};
      warp_tile_mma_split_b<true, false>(s, lo, Kr, PB, i0s, Uh, Ul, PS, 0, C);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] += lo[j][e];
    }
    store_tile_split(Sh, Sl, PS, i0s, 0, s);
  }
}

}  // namespace kla::kernels
