// Backward, pass 3 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_state_backward_bf16_kernel, the state-gradient scan of
// bwd/bwd_state_scans.cuh (its file comment has the recurrence) on bf16 tensor cores, one block per
// (sequence, value head, slice of VS = 32 value columns), 8 warps, from the last chunk to the
// first:
//   dU = diag(Gamma_C. ks) K dS + X    K the raw keys (exact), dS split hi + lo (two products)
//   X = M^T dY                         M split hi + lo by the prep (two), dY raw (exact)
//   dS <- gamma_C dS - W^T dU + Y      W and dU split hi + lo (three: hi hi, hi lo, lo hi)
//   Y = Q^T D                          Q the raw queries (exact), D split hi + lo (two)
// with k^ = ks k and qs the record's kscale and qscale, M = (Q^K^^T) o Gamma, and D = diag(qs e^G)
// dY split from the raw dY (X and Y = Q^^T diag(e^G) dY, which the prep forms in the other
// configurations).
// Each warp keeps 16 rows of the dS slice in fp32 registers for the whole sequence (the mma
// accumulators of the update); dS and dU reach the products as split bf16 tiles in shared memory.
// Per chunk the block copies in W's and M's two parts, the raw keys and queries, the raw dY slice,
// G, kscale and qscale, by bulk copies that one thread issues (the prep lays them out as this
// kernel holds them: bwd_bf16_record_fits); it writes dS (the gradient of the chunk's outgoing
// state) and dU to the record in bf16 for bwd/bwd_input_grads_bf16.cuh, their only reader in this
// configuration, and at the end d(initial state) in fp32. It reads nothing the state scan writes,
// so on sm_90 it runs beside it (bwd_launch_beside); in a saved backward of one wave it runs
// beside the prep instead (bp.prep_beside, bwd/bwd_prep_beside_scan.cuh), its copying thread
// waiting for each chunk's records' ready flags before it copies them (bwd_take_ready_chunks).
//
// Precision as bwd/bwd_state_forward_bf16.cuh's: each product errs below about 2^-16 relative,
// finer than the TF32 scan's one part an operand (2^-10); dS accumulates in fp32, the parts of a
// split product apart before they are added (warp_tile_mma_split*).
#pragma once

#include <type_traits>

#include "bwd/bwd_prep_beside_scan.cuh"
#include "bwd/bwd_state_grad_segments.cuh"
#include "bwd/bwd_warp_tile_bf16.cuh"

namespace kla::kernels {

/// The scan's copying thread beside the prep (bp.prep_beside): waits until chunk ch's records are
/// ready (its value head's, rec0 + ch rstep, and the key head's first value head's, kr0 + ch rstep,
/// which holds the raw keys and queries: bwd/bwd_prep_beside_scan.cuh sets their flags), takes the
/// chunks below it that are ready too (at most kBwdReadyBatch in all, their flags read together),
/// and fences once for them all; returns the lowest chunk taken: from there to ch its copies may
/// be issued.
constexpr int kBwdReadyBatch = 8;
__device__ __forceinline__ int bwd_take_ready_chunks(const float* rec0, const float* kr0,
                                                     int64_t rstep, int ch) {
  for (;;) {
    int ready[kBwdReadyBatch];
#pragma unroll
    for (int d = 0; d < kBwdReadyBatch; ++d) {
      const int c = ch - d;
      ready[d] = c >= 0 ? flag_relaxed(bwd_ready_flag(rec0 + c * rstep)) &
                              flag_relaxed(bwd_ready_flag(kr0 + c * rstep))
                        : 0;
    }
    int taken = 0;
#pragma unroll
    for (int d = 0; d < kBwdReadyBatch; ++d)
      if (ready[d] != 0 && taken == d) taken = d + 1;
    if (taken > 0) {
      acquire_fence_for_bulk_copies();
      return ch - taken + 1;
    }
    __nanosleep(128);
  }
}

// kBesidePrep: launched beside the saved prep (bp.prep_beside), so the copying thread waits for
// the records' ready flags; the instantiation without it carries no such code, so that the scans
// that follow the prep keep their schedule (a run-time branch cost them 2% on an H100).
template <class E, bool kBesidePrep = false>
__global__ void __maxnreg__(kBwdStateBackwardBf16Regs)
    bwd_state_backward_bf16_kernel(const BwdParams bp) {
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
  const int nch = int((sr.len + C - 1) / C);
  // After the segmented chain (bp.chain_seg): only the heads it left, those without a certified
  // window for some segment (bwd/bwd_state_grad_segments.cuh). Beside the prep the chain never
  // runs (api/backward.cu), so that instantiation carries none of this.
  if constexpr (!kBesidePrep)
    if (bp.chain_seg > 0 && nch > 0 && bwd_chain_certified(rec0)) return;

  // Shared memory (bwd_state_backward_bf16_smem): one copy stage in two groups (ScanCopyGroup),
  // the keys' (the raw keys [C][PB], M hi, lo [C][PBC], the raw dY slice [C][PS] bf16, G, kscale,
  // qscale [C] fp32: read by dU, X and D) and W's (W hi, lo and the raw queries [C][PB] bf16: read
  // by the update and Y), each refilled for the next chunk as soon as its readers are done; then
  // dS hi, lo [K][PS], -dU hi, lo and D hi, lo [C][PS] bf16; the two barriers. In all 132 KB,
  // which fits beside a block of the state scan (bwd_scans_share_multiprocessors).
  extern __shared__ float4 smem4[];
  bf16* const Kr = reinterpret_cast<bf16*>(smem4);
  bf16* const Mh = Kr + C * PB;
  bf16* const Ml = Mh + C * PBC;
  bf16* const dY = Ml + C * PBC;
  float* const Gs = reinterpret_cast<float*>(dY + C * PS);
  float* const ks = Gs + C;
  float* const qs = ks + C;
  bf16* const Wh = reinterpret_cast<bf16*>(qs + C);
  bf16* const Wl = Wh + C * PB;
  bf16* const Qr = Wl + C * PB;
  bf16* const Yh = Qr + C * PB;  // D
  bf16* const Yl = Yh + C * PS;
  bf16* const Dh = Yl + C * PS;
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

  // The two groups, refilled once a chunk from the last: the keys' (refill n: chunk nch - 1 - n),
  // then W's (the same). Rows past the sequence's end arrive as the prep wrote them: zero.
  const ScanCopyGroup kg{reinterpret_cast<uint64_t*>(Ul + C * PS)}, wg{kg.bar + 1};
  // The raw keys and queries are in the record of the key head's first value head (the same
  // chunk). The kernel mutant bwd_scan_keys_own_record reads its own head's, which the prep leaves
  // unwritten there but for the first value head of a group.
  const float* const kr0 = KLA_MUTANT(bwd_scan_keys_own_record)
                               ? rec0
                               : bwd_record_of_head(bp, rec0, blk.hv, blk.h * bp.group);
  // Beside the prep (bp.prep_beside, bwd/bwd_prep_beside_scan.cuh): the copying thread's chunks
  // from ready_from on are known written (their flags read set, then one acquire fence).
  int ready_from = nch;
  auto issue_k = [&](int ch) {  // the raw keys, M's parts, the raw dY slice, G, kscale, qscale
    if constexpr (kBesidePrep)
      if (tid == 0 && ch < ready_from && !KLA_MUTANT(bwd_scan_ready_ignored))
        ready_from = bwd_take_ready_chunks(rec0, kr0, rstep, ch);
    const float* rec = rec0 + ch * rstep;
    const bf16* rb = reinterpret_cast<const bf16*>(rec);
    kg.expect(unsigned(C * PB * 2 + 2 * C * PBC * 2 + C * PS * 2 + 3 * C * 4));
    kg.copy(Kr, reinterpret_cast<const bf16*>(kr0 + ch * rstep) + R.b_kr, unsigned(C * PB * 2));
    kg.copy(Mh, rb + R.b_mh, unsigned(2 * C * PBC * 2));
    kg.copy(dY, rb + R.b_do + blk.slice * C * PS, unsigned(C * PS * 2));
    kg.copy(Gs, rec + R.sc + kScG * C, unsigned(C * 4));
    kg.copy(ks, rec + R.sc + kScKscale * C, unsigned(C * 4));
    kg.copy(qs, rec + R.sc + kScQscale * C, unsigned(C * 4));
    kg.commit();
  };
  auto issue_w = [&](int ch) {  // W's parts and the raw queries of chunk ch
    const bf16* rb = reinterpret_cast<const bf16*>(rec0 + ch * rstep);
    wg.expect(unsigned(3 * C * PB * 2));
    wg.copy(Wh, rb + R.b_wh, unsigned(2 * C * PB * 2));
    wg.copy(Qr, reinterpret_cast<const bf16*>(kr0 + ch * rstep) + R.b_qr, unsigned(C * PB * 2));
    wg.commit();
  };
  kg.init();
  wg.init();
  if (nch > 0) issue_k(nch - 1);
  for (int step = 0; step < nch; ++step) {
    const int ch = nch - 1 - step;
    bf16* const rb = reinterpret_cast<bf16*>(rec0 + ch * rstep);
    // The previous update is done with W and -dU; dS's split tiles written; the barriers
    // initialised.
    __syncthreads();
    issue_w(ch);
    kg.wait<1>(step);  // K, M, dY, G, kscale, qscale of chunk ch (W, Q may still be in flight)
    // dS (the chunk's outgoing state's gradient) to the record in bf16: its hi part, rounded to
    // nearest.
    for (int idx = tid; idx < K * (VS / 8); idx += kBwdThreads) {
      const int r = idx / (VS / 8), c8 = (idx % (VS / 8)) * 8;
      *reinterpret_cast<uint4*>(rb + R.b_ds + int64_t(r) * V + c0 + c8) =
          *reinterpret_cast<const uint4*>(Dh + r * PS + c8);
    }
    // X = M^T dY on the warp's tile (M lower: the k-steps from i0u), as the prep forms it in the
    // other configurations: M's hi part, then lo, into one accumulator. The kernel mutant
    // bwd_scan_x_rows_skipped leaves X's rows 32-63 zero.
    float xm[2][4] = {};
    if (!(KLA_MUTANT(bwd_scan_x_rows_skipped) && i0u >= 32)) {
      warp_tile_mma<true, false, 1>(xm, Mh, PBC, i0u, dY, PS, n0u, C, i0u);
      warp_tile_mma<true, false, 1>(xm, Ml, PBC, i0u, dY, PS, n0u, C, i0u);
    }
    float u[2][2][4] = {};  // K dS on the warp's tile: K times hi, times lo (two chains)
    warp_tile_mma_split_b<false, false, 1>(u[0], u[1], Kr, PB, i0u, Dh, Dl, PS, n0u, K);
    // dU = Gamma_Ci ks_i (K dS)_i + X_i to the record in bf16; -dU split for the update.
    const float gC = expf(Gs[C - 1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = i0u + g + 8 * h;
      const float f = expf(Gs[C - 1] - Gs[i]) * ks[i];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = n0u + 8 * j + 2 * t;
        const float x = fmaf(f, u[0][j][2 * h] + u[1][j][2 * h], xm[j][2 * h]),
                    y = fmaf(f, u[0][j][2 * h + 1] + u[1][j][2 * h + 1], xm[j][2 * h + 1]);
        *reinterpret_cast<uint32_t*>(rb + R.b_du + int64_t(i) * V + c0 + c) = round_bf16x2(x, y);
        split_bf16x2(-x, -y, *reinterpret_cast<__nv_bfloat162*>(Uh + i * PS + c),
                     *reinterpret_cast<__nv_bfloat162*>(Ul + i * PS + c));
      }
    }
    // gamma_C dS on the warp's rows.
    const float gCd = KLA_MUTANT(bwd_carry_no_gamma) ? 1.f : gC;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= gCd;
    {  // D = diag(qs e^G) dY split (as the prep splits its operands): eight elements a thread
      static_assert(C * VS / 8 == kBwdThreads, "a 16-byte unit of dY's slice a thread");
      const int r = tid >> 2, c8 = 8 * (tid & 3);
      const float sr = qs[r] * expf(Gs[r]);
      const uint4 raw = *reinterpret_cast<const uint4*>(dY + r * PS + c8);
      const uint32_t* e = reinterpret_cast<const uint32_t*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 y = Dtype<bf16>::unpack2(e[j]);
        split_bf16x2(sr * y.x, sr * y.y,
                     *reinterpret_cast<__nv_bfloat162*>(Yh + r * PS + c8 + 2 * j),
                     *reinterpret_cast<__nv_bfloat162*>(Yl + r * PS + c8 + 2 * j));
      }
    }
    wg.wait<0>(step);  // W, Q of chunk ch
    __syncthreads();   // -dU and D complete; the keys' group and dS's split tiles read
    if (ch > 0) issue_k(ch - 1);
    {  // - W^T dU: hi hi into dS, hi lo and lo hi beside it (one chain); Y = Q^T D beside them (Q
       // exact: D's hi, then lo, into one accumulator); then added, the small parts first
      float x[4][4] = {}, y[4][4] = {};
      warp_tile_mma_split<true, false>(s, x, x, Wh, Wl, PB, i0s, Uh, Ul, PS, 0, C);
      warp_tile_mma<true, false>(y, Qr, PB, i0s, Yh, PS, 0, C);
      warp_tile_mma<true, false>(y, Qr, PB, i0s, Yl, PS, 0, C);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = (s[j][e] + x[j][e]) + y[j][e];
    }
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
