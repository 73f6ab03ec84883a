// Backward, pass 3 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_state_backward_bf16_kernel, the state-gradient scan of
// bwd/bwd_state_scans.cuh (its file comment has the recurrence) on bf16 tensor cores, one block per
// (sequence, value head, slice of kBwdStateBackwardBf16Slice = 32 value columns), two warps per 16
// of its columns (the two halves of the keys), from the last chunk to the first, each warp holding
// its part of the state's gradient transposed, dS^T [16 x K / 2] fp32, in mma accumulators:
//   dU^T = (dS^T K^T) diag(Gamma_C. ks) + X^T     K the raw keys (exact), dS^T split hi + lo (two)
//   dS^T <- gamma_C dS^T + Y^T - dU^T W           dU^T and W split hi + lo (three: hi hi, hi lo,
//                                                 lo hi)
// with k^ = ks k (the record's kscale), X = M^T dY and Y = Q^^T diag(e^G) dY from the prep (fp32).
// As in bwd/bwd_state_forward_bf16.cuh, an accumulator tile is the next product's A operand, so
// dS^T and dU^T stay in registers; K and W come from shared memory. Per chunk the block copies in
// (cp.async) W's two parts (BwdRecord::b_wh / b_wl), the raw keys, the X and Y slices, G and
// kscale; it writes dS (the gradient of the chunk's outgoing state, its hi part) and dU to the
// record in bf16 for bwd/bwd_input_grads_bf16.cuh, their only reader in this configuration, and at
// the end d(initial state) in fp32. It reads nothing the state scan writes, so on sm_90 it runs
// beside it (bwd_launch_beside).
//
// Precision as bwd/bwd_state_forward_bf16.cuh's: each product errs below about 2^-16 relative,
// finer than the TF32 scan's one part an operand (2^-10); dS accumulates in fp32.
#pragma once

#include <type_traits>

#include "bwd/bwd_state_forward_bf16.cuh"

namespace kla::kernels {

template <class E>
__global__ void __maxnreg__(kBwdStateBackwardBf16Regs)
    bwd_state_backward_bf16_kernel(const BwdParams bp) {
  using namespace bwd_bf16;
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  constexpr int VS = kBwdStateBackwardBf16Slice, NT = kBwdStateBackwardBf16Threads;
  static_assert(NT == 64 * (VS / 16), "two warps per 16 value columns");
  constexpr int PO = VS + 8, PU = bwd_pitch(VS), KH = K / 2;  // out tiles as the state scan's
  __builtin_assume(blockDim.x == NT);                         // the launcher's (bwd_launch.cuh)
  const KernelParams& p = bp.f;
  const ScanTile blk = scan_tile(p, K, V, VS);
  const int c0 = blk.c0;
  const SeqRange sr = blk.sr;
  const BwdRecord R(K, V);
  float* const rec0 = bwd_record(bp, blk.n, sr, 0, blk.hv);  // chunk ch's: rec0 + ch * rstep
  const int64_t rstep = bwd_record_step(bp);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // The warp's value columns c0 + cw .. + 16 and keys kb .. kb + K / 2.
  const int cg = warp >> 1, cw = 16 * cg, kb = KH * (warp & 1);

  // Shared memory (bwd_state_backward_bf16_smem): one copy stage in two cp.async groups, the keys'
  // (the raw keys [C][PB] bf16, the X [C][PU] and Y [K][PU] slices, G, kscale [C] fp32: read by
  // dU and gamma_C dS + Y) and W's (W hi, lo [C][PB] bf16: read by the update), each refilled for
  // the next chunk as soon as its readers are done; the out tiles dS [K][PO] and dU [C][PO] bf16
  // (the record's [row][column] layout); each warp's partial sum of dS^T K^T over its keys. It
  // fits beside a block of the state scan (bwd_scans_share_multiprocessors).
  extern __shared__ float4 smem4[];
  bf16* const Kr = reinterpret_cast<bf16*>(smem4);
  float* const X = reinterpret_cast<float*>(Kr + C * PB);
  float* const Y = X + C * PU;
  float* const Gs = Y + K * PU;
  float* const ks = Gs + C;
  float* const part = ks + C;  // [warp][C / 2][32]
  bf16* const Wh = reinterpret_cast<bf16*>(part + (NT / 32) * (C / 2) * 32);
  bf16* const Wl = Wh + C * PB;
  bf16* const So = Wl + C * PB;
  bf16* const Uo = So + K * PO;

  // dS^T: ds[n] the accumulator tile of keys kb + 8n .. + 8: (column cw + g + 8 (e / 2), key
  // kb + 8n + 2t + e % 2) for element e.
  const int64_t KV = int64_t(K) * V, head = int64_t(blk.n) * p.HV + blk.hv;
  auto at_state = [&](int n, int e) {  // element e of tile n in a [K][V] state
    return head * KV + int64_t(kb + 8 * n + 2 * t + (e & 1)) * V + c0 + cw + g + 8 * (e >> 1);
  };
  float ds[KH / 8][4];
#pragma unroll
  for (int n = 0; n < KH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) ds[n][e] = bp.dht ? bp.dht[at_state(n, e)] : 0.f;

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
  // Lane address of stmatrix.trans for an out tile (as bwd/bwd_state_forward_bf16.cuh's).
  const int mrow = 8 * (lane >> 4) + (lane & 7), mcol = cw + 8 * ((lane >> 3) & 1);
  if (nch > 0) issue_k(nch - 1);
  for (int step = 0; step < nch; ++step) {
    const int ch = nch - 1 - step;
    bf16* const rb = reinterpret_cast<bf16*>(rec0 + ch * rstep);
    __syncthreads();  // the previous update is done with W, its copy-out with the out tiles
    issue_w(ch);
    cp_wait<1>();     // the keys' group of chunk ch (W may still be in flight)
    __syncthreads();  // K, X, Y, G, kscale visible
    // The warp's part of dS^T K^T (its keys) on the 16 x C tile (u[j]: tokens 8j .. 8j + 8): per
    // k-step of 16 keys, the A operand is dS^T's two accumulator tiles split hi + lo; the hi part
    // also goes to the dS out tile (the chunk's outgoing state's gradient, rounded to nearest).
    float u[C / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < KH / 16; ++kk) {
      uint32_t ah[4], al[4];
      split_pair(ds[2 * kk][0], ds[2 * kk][1], ah[0], al[0]);
      split_pair(ds[2 * kk][2], ds[2 * kk][3], ah[1], al[1]);
      split_pair(ds[2 * kk + 1][0], ds[2 * kk + 1][1], ah[2], al[2]);
      split_pair(ds[2 * kk + 1][2], ds[2 * kk + 1][3], ah[3], al[3]);
      stsm4_t(So + (kb + 16 * kk + mrow) * PO + mcol, ah[0], ah[1], ah[2], ah[3]);
#pragma unroll
      for (int pp = 0; pp < C / 16; ++pp) {  // tokens 16 pp .. + 16: n-tiles 2 pp, 2 pp + 1
        uint32_t b[4];
        ldsm4(b, Kr + (16 * pp + (lane & 7) + (lane >> 4) * 8) * PB + kb + 16 * kk +
                     ((lane >> 3) & 1) * 8);
        mma_bf16(u[2 * pp], ah, b[0], b[1]);
        mma_bf16(u[2 * pp + 1], ah, b[2], b[3]);
        mma_bf16(u[2 * pp], al, b[0], b[1]);
        mma_bf16(u[2 * pp + 1], al, b[2], b[3]);
      }
    }
    exchange_pair_parts(u, part, warp, lane, cg);
    // dU = diag(Gamma_C. ks) K dS + X: to the dU out tile in bf16 (by the pair's first warp);
    // -dU^T split, the update's A operand (k-steps of 16 tokens).
    const float gC = expf(Gs[C - 1]);
    uint32_t uh[C / 16][4], ul[C / 16][4];
#pragma unroll
    for (int pp = 0; pp < C / 16; ++pp) {
      uint32_t r[4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {  // n-tile j = 2 pp + jj: tokens i, i + 1
        const int j = 2 * pp + jj, i = 8 * j + 2 * t;
        const float fx = expf(Gs[C - 1] - Gs[i]) * ks[i];
        const float fy = expf(Gs[C - 1] - Gs[i + 1]) * ks[i + 1];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // columns cw + g + 8 h
          const int c = cw + g + 8 * h;
          const float x = fmaf(fx, u[j][2 * h], X[i * PU + c]);
          const float y = fmaf(fy, u[j][2 * h + 1], X[(i + 1) * PU + c]);
          r[2 * jj + h] = round_bf16x2(x, y);
          split_pair(-x, -y, uh[pp][2 * jj + h], ul[pp][2 * jj + h]);
        }
      }
      if (kb == 0) stsm4_t(Uo + (16 * pp + mrow) * PO + mcol, r[0], r[1], r[2], r[3]);
    }
    // gamma_C dS + Y on the warp's columns and keys.
    const float gCd = KLA_MUTANT(bwd_carry_no_gamma) ? 1.f : gC;
#pragma unroll
    for (int n = 0; n < KH / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        ds[n][e] =
            fmaf(gCd, ds[n][e], Y[(kb + 8 * n + 2 * t + (e & 1)) * PU + cw + g + 8 * (e >> 1)]);
    cp_wait<0>();
    __syncthreads();  // W and the out tiles complete; the keys' group read
    if (ch > 0) issue_k(ch - 1);
    // The chunk's outgoing state's gradient and dU to the record in bf16.
    copy_out_tiles<VS, NT>(rb + R.b_ds, So, rb + R.b_du, Uo, c0, tid);
    // dS^T -= dU^T W on the warp's keys: k-steps of 16 tokens, n-tiles of 8 keys (pairs by
    // ldmatrix.trans of W's rows), parts hi hi, hi lo, lo hi.
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk)
#pragma unroll
      for (int pp = 0; pp < KH / 16; ++pp) {
        uint32_t bh[4], bl[4];
        const int at = frag_b_kn(PB, 16 * kk, kb + 16 * pp, lane);
        ldsm4_t(bh, Wh + at);
        ldsm4_t(bl, Wl + at);
        mma_bf16(ds[2 * pp], uh[kk], bh[0], bh[1]);
        mma_bf16(ds[2 * pp + 1], uh[kk], bh[2], bh[3]);
        mma_bf16(ds[2 * pp], uh[kk], bl[0], bl[1]);
        mma_bf16(ds[2 * pp + 1], uh[kk], bl[2], bl[3]);
        mma_bf16(ds[2 * pp], ul[kk], bh[0], bh[1]);
        mma_bf16(ds[2 * pp + 1], ul[kk], bh[2], bh[3]);
      }
  }
  if (bp.dh0)
#pragma unroll
    for (int n = 0; n < KH / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) bp.dh0[at_state(n, e)] = ds[n][e];
  // Launched to run beside the state scan (programmatic dependent launch, bwd_launch.cuh): this
  // grid completes only once that one has and its writes are visible, so that the kernels after
  // it, ordered after this grid alone, see both scans' records.
  grid_dependency_wait();
}

}  // namespace kla::kernels
