// Backward, pass 4 under arithmetic FAST for bf16 storage at K = V = 128
// (bwd_runs_bf16_input_grads): bwd_input_grads_bf16_kernel, one block per (chunk group, key head,
// sequence) running the key head's value heads in turn and summing their dq^, dk^ as it goes, the
// same gradients as bwd/bwd_chunk_grads.cuh (its file comment has the math) with every product of
// this pass on bf16 operands:
//   dR = A^-T dU;  dY S^T, U dS^T, dR S^T (C x K);  dY U^T, dR U^T (C x C);  Q^K^^T, K^K^^T;
//   dq^ = e^G o (dY S^T) + Pm K^,  dk^ = Gamma_C o (U dS^T) - e^G beta o (dR S^T) + Pm^T Q^ +
//   Z K^ + Z^T K^.
// Each warp keeps one 16 x 32 tile of each [C][K] product in registers for the whole pass (the
// sums over V and over C never leave the tensor cores' accumulators), its operands read from
// bf16 tiles in shared memory by ldmatrix (mma.sync m16n8k16, arch/mma_bf16.cuh). S, U, dS, dU
// and A^-1 come from the record already in bf16 (the prep and the scans round them as they write
// them, BwdRecord::b_*: half the bytes, copied without passing through registers); the keys, the
// queries and dO are the raw bf16 inputs (exact), so the per-token scales k^ = ks k, q^ = qs q
// (the record's kscale, qscale) leave the products, as in the prep (bwd/bwd_prep_bf16.cuh):
//   Q^K^^T = diag(qs) (Q K^T) diag(ks),  K^K^^T = diag(ks) (K K^T) diag(ks)   (fp32 factors)
//   Pm K^ = (Pm diag(ks)) K,  Pm^T Q^ = (diag(qs) Pm)^T Q,  Z K^ = (Z diag(ks)) K,
//   Z^T K^ = (diag(ks) Z)^T K                     (each scaled Pm, Z rounded once to bf16)
// and the row terms and the prologue backwards read the same raw rows from shared memory.
//
// Precision (the FAST contract, kla.h): each operand rounded once to bf16 (nearest, below 2^-8
// relative) or exact (the raw inputs), products exact, fp32 sums in a fixed order (by k-step of 16,
// then the tensor core's order inside one); sum(dS o S) (the carried state's share of dg) over the
// same bf16 values in a fixed order; the row terms (q^ . (S dy)-like dots), the [C][C] sums of dG
// and dbeta and the prologue backwards in fp32 from fp32 values, as bwd/bwd_chunk_grads.cuh. The
// state-gradient path (X, Y and the dS scan) stays at one TF32 part an operand or finer (operands
// split into two bf16 parts): rounding it to one bf16 part too makes d(initial state)
// err 1.31-1.36x FLA's, while bf16 operands here keep every gradient at most 0.95x FLA's error
// (docs/prefill_notes.md, round 2 sessions 11 and 13).
#pragma once

#include <type_traits>

#include "bwd/bwd_grads_parts.cuh"
#include "bwd/bwd_warp_tile_bf16.cuh"
#include "layout/saved_states.hpp"

namespace kla::kernels {

/// Value head pt.hv, from this warp's dR tile (rows i0.., columns n0..; the mma.sync accumulator
/// layout: element [j][e] is row i0 + g + 8 (e / 2), column n0 + 8 j + 2 t + e % 2) and the raw v
/// at the same elements (bf16 pairs): dv = vscale beta dR written out, and the warp's part of
/// each row's v^ . dR (v^ = vscale v) in vparts[row][warp % 4] (summed over the lane quad in a
/// fixed order; the four parts by quarter_sum). Rows at or past L are not written.
template <class E>
__device__ __forceinline__ void bwd_value_grads_tile(const BwdParams& bp, const PrepTile& pt,
                                                     const float* rs, const float (&dr)[4][4],
                                                     const uint32_t (&vraw)[2][4], int i0, int n0,
                                                     const float* beta, float* vparts) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + g + 8 * h;
    const bool ok = row < pt.L;
    const float vs = ok ? rs[kScVscale * kChunk + row] : 0.f, bi = beta[row];
    E* dvrow = static_cast<E*>(bp.dv) + pt.sr.b * bp.dvs[0] + (pt.tb + (ok ? row : 0)) * bp.dvs[1] +
               int64_t(pt.hv) * bp.dvs[2];
    float part = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = Dtype<E>::unpack2(vraw[h][j]);
      const float x = dr[j][2 * h], y = dr[j][2 * h + 1];
      part = fmaf(v.y * vs, y, fmaf(v.x * vs, x, part));
      if (ok)
        *reinterpret_cast<uint32_t*>(dvrow + n0 + 8 * j + 2 * t) =
            Dtype<E>::pack2(vs * (bi * x), vs * (bi * y));
    }
    part = quad_sum(part);
    if (t == 0) vparts[row * 4 + ((threadIdx.x >> 5) & 3)] = part;
  }
}

/// The [C][C] phase of a value head on a warp's tile (rows pi0.., columns pn0..; the mma.sync
/// accumulator layout) where its products leave it: from p = dY U^T and xr = Q K^T (kReadout,
/// warps 0-7) or p = dR U^T and xr = K K^T (warps 8-15) at the same elements, raw, whose scaled
/// x = (srow_i ks_j) xr is Q^K^^T (srow = qscale) or K^K^^T (srow = kscale); Gamma_ij =
/// e^{G_i - G_j}:
///   kReadout: Pm = p o Gamma (j <= i); the row and column sums of Pm o x;
///   else: dL o Gamma = -p o Gamma (j < i) and Z = diag(beta) (dL o Gamma); the row sums of
///   (dL o Gamma) o x and the column sums of Z o x;
/// Pm (Z) written as bf16 twice: Pm diag(ks) to pmc and diag(srow) Pm to pmr, for the products
/// with the raw keys and queries.
/// Pm, dL o Gamma and Z are the values of bwd_gamma_masks and of bwd/bwd_chunk_grads.cuh's Z,
/// without their passes over shared memory; the sums replace bwd_readout_gate_sum and
/// bwd_system_gate_sums (bwd_grads_parts.cuh: a thread a row, j by j, while the other warps wait),
/// in another fixed order.
/// The sums are the warp's parts (over its 32 columns, its 16 rows), each over its lanes in a fixed
/// order: rowg[row][pn0 / 32] and colg[column][pi0 / 16] of the read-out's [C][2] and [C][4] parts
/// (rowg, colg) or the system's (after them: kBwdGateRowParts, kBwdGateColParts), combined by
/// bwd_gate_sums.
constexpr int kBwdGateRowParts = 2 * kChunk, kBwdGateColParts = 4 * kChunk;
template <bool kReadout>
__device__ __forceinline__ void bwd_gate_tile(const float (&pacc)[4][4], const float (&xr)[4][4],
                                              int pi0, int pn0, const float* G, const float* beta,
                                              const float* srow, const float* ks,
                                              bwd_bf16::bf16* pmc, bwd_bf16::bf16* pmr, float* rowg,
                                              float* colg) {
  using namespace bwd_bf16;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if constexpr (!kReadout) rowg += kBwdGateRowParts, colg += kBwdGateColParts;
  float rs[2], cs[4][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = pi0 + g + 8 * h;
    const float gi = G[row], bi = beta[row], si = srow[row];
    rs[h] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v[2], z[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = pn0 + 8 * j + 2 * t + e;
        const float pe = pacc[j][2 * h + e], xe = (si * ks[col]) * xr[j][2 * h + e];
        if constexpr (kReadout) {
          v[e] = col <= row ? pe * expf(gi - G[col]) : 0.f;
          z[e] = v[e];
        } else {
          v[e] = col < row ? -pe * expf(gi - G[col]) : 0.f;
          z[e] = bi * v[e];
        }
        rs[h] = fmaf(v[e], xe, rs[h]);
        const float c = z[e] * xe;
        cs[j][e] = h == 0 ? c : cs[j][e] + c;
      }
      const int c0 = pn0 + 8 * j + 2 * t;
      *reinterpret_cast<__nv_bfloat162*>(pmc + row * PBC + c0) =
          __floats2bfloat162_rn(z[0] * ks[c0], z[1] * ks[c0 + 1]);
      *reinterpret_cast<__nv_bfloat162*>(pmr + row * PBC + c0) =
          __floats2bfloat162_rn(si * z[0], si * z[1]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rs[h] = quad_sum(rs[h]);
    if (t == 0) rowg[(pi0 + g + 8 * h) * 2 + pn0 / 32] = rs[h];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int off = 4; off < 32; off <<= 1)
        cs[j][e] += __shfl_xor_sync(0xffffffffu, cs[j][e], off);
      if (g == 0) colg[(pn0 + 8 * j + 2 * t + e) * 4 + pi0 / 16] = cs[j][e];
    }
}

/// Thread i < C: the [C][C] phase's shares of dG_i and dbeta_i from bwd_gate_tile's parts (rowg,
/// colg as given to it), in a fixed order (the column parts by quarter_sum):
///   dG_i += sum_j (Pm o Q^K^^T)_ij - sum_j (Pm o Q^K^^T)_ji + beta_i rt_i - sum_j (Z o K^K^^T)_ji,
///   dbeta_i += rt_i,  rt_i = sum_j ((dL o Gamma) o K^K^^T)_ij.
__device__ __forceinline__ void bwd_gate_sums(const float* rowg, const float* colg, int i,
                                              float beta_i, float& dG, float& dbeta) {
  const float* rq = rowg + i * 2;
  const float* rt = rowg + kBwdGateRowParts + i * 2;
  const float r = rq[0] + rq[1], c = quarter_sum(colg, i);
  const float t = rt[0] + rt[1], cbt = quarter_sum(colg + kBwdGateColParts, i);
  dG += (r - c) + (beta_i * t - cbt);
  dbeta += t;
}

/// The per-token writes of every value head, a thread a token (thread i handles token i in every
/// head's pass): deta = dbs + v^ . dR and dg (its dv is written already by bwd_value_grads_tile);
/// and, where t1_sum is given (a key head's value heads before its last, whose dq^, dk^ are summed
/// into the last head's), this head's beta v^ . dR, its share in the last head's t1, added to
/// t1_sum[i] (set by the group's first value head: `first`).
__device__ __forceinline__ void bwd_value_head_grads(const BwdParams& bp, const PrepTile& pt,
                                                     const float* beta, const float* dGs,
                                                     const float* dbs, const float* vparts,
                                                     float* t1_sum, bool first) {
  const int i = threadIdx.x;
  if (i >= pt.L) return;
  const int64_t t = pt.tb + i, b = pt.sr.b;
  const float vdr = quarter_sum(vparts, i);
  if (bp.dg) bp.dg[b * bp.dgs[0] + t * bp.dgs[1] + pt.hv] = dGs[i];
  if (bp.deta) bp.deta[b * bp.des[0] + t * bp.des[1] + pt.hv] = dbs[i] + vdr;
  if (t1_sum) t1_sum[i] = (first ? 0.f : t1_sum[i]) + beta[i] * vdr;
}

/// The prologue backwards of a key head (bwd_token_grads's math) on the warp's tiles of dq^ (dq)
/// and dk^ (dk), rows i0.., columns n0.. in the mma.sync accumulator layout, summed over the key
/// head's value heads (the prologue is linear in them), from the raw q, k at the same elements and
/// the last value head's record scalars rs, the raw q, k rows of the chunk in shared memory (Qr,
/// Kr: [C][PB] bf16, zero past L):
///   dq = qs (dq^ - q^ (q^ . dq^)) under an l2-norm read-out (q^ = qnorm q), else qs dq^;
///   dk1 = vscale (dk^ - k^ t1) (Kaczmarz) or dk^, t1 = k^ . dk^ + beta v^ . dR (+ t1_more[i],
///   the earlier value heads' beta v^ . dR, where given); dk = knorm (dk1 - k1 (k1 . dk1)),
///   k1 = knorm k, under the qk l2-norm, else dk1.
/// Each row dot is the warp's part over its 32 columns (a thread's 8 in a fixed order, then the
/// lane quad's butterfly) put in parts ([3][C][4]: q^ . dq^, k^ . dk^, k1 . dk1 by column
/// quarter) and summed by quarter_sum after a barrier: two barriers, every thread of the block.
/// dq, dk are written as bf16 pairs, rows at or past L not written. dk is overwritten by dk1.
template <class E>
__device__ __forceinline__ void bwd_token_grads_tile(const BwdParams& bp, const PrepTile& pt,
                                                     const float* rs, const float (&dq)[4][4],
                                                     float (&dk)[4][4], int i0, int n0,
                                                     const float* beta, const float* vparts,
                                                     const float* t1_more, const E* Qr, const E* Kr,
                                                     float* parts) {
  const KernelParams& p = bp.f;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, quarter = (threadIdx.x >> 5) & 3;
  const int64_t b = pt.sr.b;
  uint32_t qraw[2][4], kraw[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int at = (i0 + g + 8 * h) * bwd_bf16::PB + n0 + 2 * t;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      qraw[h][j] = *reinterpret_cast<const uint32_t*>(Qr + at + 8 * j);
      kraw[h][j] = *reinterpret_cast<const uint32_t*>(Kr + at + 8 * j);
    }
  }
  auto quad_put = [&](float x, int which, int row) {
    x = quad_sum(x);
    if (t == 0) parts[(which * kChunk + row) * 4 + quarter] = x;
  };
  // q^ . dq^ and k^ . dk^: this warp's parts
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + g + 8 * h;
    const bool ok = row < pt.L;
    const float qn = ok && p.l2norm != 0 ? rs[kScQnorm * kChunk + row] : 0.f;
    const float ksc = ok ? rs[kScKscale * kChunk + row] : 0.f;
    float pq = 0.f, pk = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 q = Dtype<E>::unpack2(qraw[h][j]), k = Dtype<E>::unpack2(kraw[h][j]);
      pq = fmaf(q.y * qn, dq[j][2 * h + 1], fmaf(q.x * qn, dq[j][2 * h], pq));
      pk = fmaf(ksc * k.y, dk[j][2 * h + 1], fmaf(ksc * k.x, dk[j][2 * h], pk));
    }
    quad_put(pq, 0, row);
    quad_put(pk, 1, row);
  }
  __syncthreads();  // the first two dots' parts complete
  // dq out; dk1 and k1 . dk1's parts
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + g + 8 * h;
    const bool ok = row < pt.L;  // rows past L: every factor 0, nothing written
    const float qn = ok && p.l2norm != 0 ? rs[kScQnorm * kChunk + row] : 0.f;
    const float qs = ok ? rs[kScQscale * kChunk + row] : 0.f;
    const float kn = ok ? rs[kScKnorm * kChunk + row] : 0.f;
    const float ksc = ok ? rs[kScKscale * kChunk + row] : 0.f;
    const float vs = ok ? rs[kScVscale * kChunk + row] : 0.f;
    const float dot = quarter_sum(parts, row);
    float t1 = fmaf(beta[row], quarter_sum(vparts, row), quarter_sum(parts + 4 * kChunk, row));
    if (t1_more && ok) t1 += t1_more[row];
    E* dqrow = static_cast<E*>(bp.dq) + b * bp.dqs[0] + (pt.tb + (ok ? row : 0)) * bp.dqs[1] +
               int64_t(pt.h) * bp.dqs[2];
    float pk = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 q = Dtype<E>::unpack2(qraw[h][j]), k = Dtype<E>::unpack2(kraw[h][j]);
      const float x0 = qs * (dq[j][2 * h] - q.x * qn * dot);
      const float x1 = qs * (dq[j][2 * h + 1] - q.y * qn * dot);
      if (ok) *reinterpret_cast<uint32_t*>(dqrow + n0 + 8 * j + 2 * t) = Dtype<E>::pack2(x0, x1);
      float& d0 = dk[j][2 * h];
      float& d1 = dk[j][2 * h + 1];
      if (p.kaczmarz) {
        d0 = vs * (d0 - ksc * k.x * t1);
        d1 = vs * (d1 - ksc * k.y * t1);
      }
      pk = fmaf(k.y * kn, d1, fmaf(k.x * kn, d0, pk));
    }
    quad_put(pk, 2, row);
  }
  __syncthreads();  // k1 . dk1's parts complete
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + g + 8 * h;
    if (row >= pt.L) continue;
    const float kn = rs[kScKnorm * kChunk + row], t2 = quarter_sum(parts + 8 * kChunk, row);
    E* dkrow = static_cast<E*>(bp.dk) + b * bp.dks[0] + (pt.tb + row) * bp.dks[1] +
               int64_t(pt.h) * bp.dks[2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 k = Dtype<E>::unpack2(kraw[h][j]);
      float x0 = dk[j][2 * h], x1 = dk[j][2 * h + 1];
      if (p.l2norm == 2) {
        x0 = kn * (x0 - k.x * kn * t2);
        x1 = kn * (x1 - k.y * kn * t2);
      }
      *reinterpret_cast<uint32_t*>(dkrow + n0 + 8 * j + 2 * t) = Dtype<E>::pack2(x0, x1);
    }
  }
}

/// kla_chunk_backward_saved (kSaved: the kernel instantiated for bp.f.saved): where a head reads
/// its chunk's S (and U, K V elements on) for the record rec, the forward's saved record of the
/// same chunk slot and value head (layout/saved_states.hpp: the record's bf16 S and U tiles,
/// BwdRecord::b_s and b_u, as the state scan writes them there otherwise).
__device__ __forceinline__ const __nv_bfloat16* bwd_saved_states(const BwdParams& bp,
                                                                 const float* rec) {
  using namespace bwd_bf16;
  constexpr BwdRecord R(K, V);
  static_assert(R.b_u == R.b_s + K * V, "U follows S, as in a saved record");
  return static_cast<const bf16*>(bp.f.saved) +
         ((rec - bp.ws) / R.floats) * saved_record_elems(K, V);
}

/// The gradients of one value head's chunk (pt, L > 0), value head j of its key head's bp.group;
/// dq, dk once the key head's last value head is done (bwd_input_grads_bf16_kernel); rec its
/// record. The block's previous head copied in this head's tiles (dO, U, dU, A^-1, S, dS) where
/// `copied`. `next`: the record of the block's next head (null if none: this chunk's next value
/// head or the next chunk's first), whose tiles this head copies in once its own last reads of
/// them are done.
template <class E, bool kSaved>
__device__ __forceinline__ void bwd_input_grads_bf16_head(const BwdParams& bp, const PrepTile& pt,
                                                          int j, float* rec, bool copied,
                                                          const float* next) {
  using namespace bwd_bf16;
  const KernelParams& p = bp.f;
  const int L = pt.L, hv = pt.hv;
  const BwdRecord R(K, V);
  const int tid = thread_index_here();
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

  // Shared memory (bwd_input_grads_bf16_smem). Region 0: dY, U, dU, dR [C][PB] bf16. Region 1: S,
  // dS [K][PB] bf16. Then A^-1 [C][PBC], the raw K, Q [C][PB], Pm diag(ks), Z diag(ks), diag(qs)
  // Pm, diag(ks) Z [C][PBC] bf16; the scalars. A^-1 is
  // free once dR is formed, regions 0 and 1 once the products with dY, U, dU, dR, S and dS are:
  // the next head's tiles are copied in then, behind this head's remaining phases.
  extern __shared__ float4 smem4[];
  char* const r0 = reinterpret_cast<char*>(smem4);
  char* const r1 = r0 + 2 * 4 * C * PB;
  bf16* const dYb = reinterpret_cast<bf16*>(r0);
  bf16* const Ub = dYb + C * PB;
  bf16* const dUb = Ub + C * PB;
  bf16* const dRb = dUb + C * PB;
  bf16* const Sb = reinterpret_cast<bf16*>(r1);
  bf16* const dSb = Sb + K * PB;
  bf16* const Aib = reinterpret_cast<bf16*>(r1 + 2 * 2 * K * PB);
  bf16* const Kraw = Aib + C * PBC;
  bf16* const Qraw = Kraw + C * PB;
  bf16* const Pmc = Qraw + C * PB;
  bf16* const Zc = Pmc + C * PBC;
  bf16* const Pmr = Zc + C * PBC;
  bf16* const Zr = Pmr + C * PBC;
  float* const rowg = reinterpret_cast<float*>(Zr + C * PBC);  // [2][C][2] bwd_gate_tile's parts
  float* const colg = rowg + 2 * kBwdGateRowParts;             // [2][C][4]
  float* const G = colg + 2 * kBwdGateColParts;
  float* const beta = G + C;
  float* const dGs = beta + C;  // dG_i, then dg_i
  float* const dbs = dGs + C;   // dbeta_i
  float* const zs = dbs + C;    // z_i = Gamma_Ci k^_i . (dS u_i)
  float* const eg = zs + C;     // e^G_i
  float* const gc = eg + C;     // Gamma_Ci
  float* const kss = gc + C;    // kscale_i (0 past L)
  float* const qss = kss + C;   // qscale_i (0 past L)
  float* const rowp = qss + C;  // [3][C][4] row terms' parts by quarter, then the prologue's
  float* const red = rowp + 3 * C * 4;                // [16] parts of sum(dS o S), one a warp
  float* const t1_sum = red + kBwdChunkThreads / 32;  // [C] the earlier value heads' beta v^ . dR
  float* const vparts = t1_sum + C;                   // [C][4] v^ . dR by column quarter

  // dO rows (raw bf16: exact), zero past L, and the record's bf16 tiles (BwdRecord::b_*) by
  // cp.async, unless the previous head copied them in; for the key head's first value head, the
  // raw K and Q rows too. They are the key head's and nothing else writes their shared memory, so
  // the block's later value heads find them there.
  const E* kb = static_cast<const E*>(p.k);
  const E* qb = static_cast<const E*>(p.q);
  {
    const bf16* rb = reinterpret_cast<const bf16*>(rec);
    if (!copied) {
      cp_input_rows(dYb, PB, static_cast<const E*>(bp.dO), bp.dos, pt.sr.b, pt.tb, hv, L);
      cp_tile_bf16<V>(dUb, PB, rb + R.b_du, C);
      cp_tile_bf16<V>(Ub, PB, kSaved ? bwd_saved_states(bp, rec) + K * V : rb + R.b_u, C);
      cp_tile_bf16<C>(Aib, PBC, rb + R.b_ainv, C);
      cp_tile_bf16<V>(Sb, PB, kSaved ? bwd_saved_states(bp, rec) : rb + R.b_s, K);
      cp_tile_bf16<V>(dSb, PB, rb + R.b_ds, K);
    }
    if (hv == pt.h * bp.group) {
      cp_input_rows(Kraw, PB, kb, p.ks, pt.sr.b, pt.tb, pt.h, L);
      cp_input_rows(Qraw, PB, qb, p.qs, pt.sr.b, pt.tb, pt.h, L);
    }
    cp_commit();
  }
  if (tid < C) {
    G[tid] = rec[R.sc + kScG * C + tid];
    beta[tid] = rec[R.sc + kScBeta * C + tid];
    eg[tid] = expf(G[tid]);
    gc[tid] = expf(rec[R.sc + kScG * C + C - 1] - G[tid]);
    kss[tid] = tid < L ? rec[R.sc + kScKscale * C + tid] : 0.f;
    qss[tid] = tid < L ? rec[R.sc + kScQscale * C + tid] : 0.f;
  }
  // The warp's tile of every [C][K] product: rows i0.., columns n0..; of the [C][C] ones, warps
  // 0-7 own tile (pi0, pn0) of dY U^T and Q K^T, warps 8-15 the same tile of dR U^T and K K^T.
  const int i0 = (warp >> 2) * 16, n0 = (warp & 3) * 32;
  const int pi0 = ((warp & 7) >> 1) * 16, pn0 = (warp & 1) * 32;
  const bool first_half = warp < 8;
  // The raw v at this thread's elements of the dR tile (bf16 pairs), read while the copies land.
  uint32_t vraw[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + g + 8 * h;
    const E* vrow = static_cast<const E*>(p.v) + pt.sr.b * p.vs[0] +
                    (pt.tb + (row < L ? row : 0)) * p.vs[1] + int64_t(hv) * p.vs[2];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      vraw[h][j] = *reinterpret_cast<const uint32_t*>(vrow + n0 + 8 * j + 2 * t);
  }
  cp_wait<0>();
  __syncthreads();
  {  // sum(dS o S) over the record's bf16 values: this thread's part, then one a warp (fixed order)
    float carry = 0.f;
    for (int idx = tid; idx < K * V / 2; idx += kBwdChunkThreads) {
      const int at = (idx / (V / 2)) * PB + (idx % (V / 2)) * 2;
      const float2 s2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Sb + at));
      const float2 d2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dSb + at));
      carry = fmaf(s2.y, d2.y, fmaf(s2.x, d2.x, carry));
    }
    carry = warp_sum(carry);
    if (lane == 0) red[warp] = carry;
  }

  float a1[4][4] = {}, a2[4][4] = {}, a3[4][4] = {};
  float pd[4][4] = {};  // dY U^T (warps 0-7) or dR U^T (8-15) on tile (pi0, pn0)
  {
    float dr[4][4] = {};
    warp_tile_mma<true, false>(dr, Aib, PBC, i0, dUb, PB, n0, C);  // dR = A^-T dU
    store_tile(dRb, PB, i0, n0, dr);
    bwd_value_grads_tile<E>(bp, pt, rec + R.sc, dr, vraw, i0, n0, beta, vparts);  // dv, v^ . dR
  }
  warp_tile_mma<false, true>(a1, dYb, PB, i0, Sb, PB, n0, V);  // dY S^T
  // Half the warps take dY U^T before dR is complete, the other half U dS^T: the two steps
  // between the barriers hold the same number of k-steps for every warp.
  if (first_half)
    warp_tile_mma<false, true>(pd, dYb, PB, pi0, Ub, PB, pn0, V);  // dY U^T
  else
    warp_tile_mma<false, true>(a2, Ub, PB, i0, dSb, PB, n0, V);  // U dS^T
  __syncthreads();  // dR is complete; A^-1's last reads are done
  const bf16* const next_rb = reinterpret_cast<const bf16*>(next);
  if (next) cp_tile_bf16<C>(Aib, PBC, next_rb + R.b_ainv, C);
  // The [C][C] phase on the warps' tiles (bwd_gate_tile: Pm and Z to shared memory as bf16, their
  // sums' parts), then the products with S and dS.
  if (!first_half) warp_tile_mma<false, true>(pd, dRb, PB, pi0, Ub, PB, pn0, V);  // dR U^T
  {
    float x[4][4] = {};  // Q K^T (warps 0-7), K K^T (8-15), raw
    warp_tile_mma<false, true>(x, first_half ? Qraw : Kraw, PB, pi0, Kraw, PB, pn0, K);
    if (first_half)
      bwd_gate_tile<true>(pd, x, pi0, pn0, G, beta, qss, kss, Pmc, Pmr, rowg, colg);
    else
      bwd_gate_tile<false>(pd, x, pi0, pn0, G, beta, kss, kss, Zc, Zr, rowg, colg);
  }
  warp_tile_mma<false, true>(a3, dRb, PB, i0, Sb, PB, n0, V);                  // dR S^T
  if (first_half) warp_tile_mma<false, true>(a2, Ub, PB, i0, dSb, PB, n0, V);  // U dS^T
  // The row terms' parts over the warp's 32 columns, from fp32 k^, q^: e^G-free q^_i . (S dy_i),
  // k^_i . (dS u_i), k^_i . (S dR_i); summed over the lane quad, then over the column quarters
  // below (fixed orders).
  {
    float pq[2] = {0.f, 0.f}, pz[2] = {0.f, 0.f}, pc[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // q^ = qs q and k^ = ks k of the row from the raw rows, as the prep scales them
      const int row = i0 + g + 8 * h;
      const float qsr = qss[row], ksr = kss[row];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = row * PB + n0 + 8 * j + 2 * t;
        const float2 qr = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Qraw + col));
        const float2 kr = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Kraw + col));
        const float2 q2 = make_float2(qsr * qr.x, qsr * qr.y);
        const float2 k2 = make_float2(ksr * kr.x, ksr * kr.y);
        pq[h] = fmaf(q2.y, a1[j][2 * h + 1], fmaf(q2.x, a1[j][2 * h], pq[h]));
        pz[h] = fmaf(k2.y, a2[j][2 * h + 1], fmaf(k2.x, a2[j][2 * h], pz[h]));
        pc[h] = fmaf(k2.y, a3[j][2 * h + 1], fmaf(k2.x, a3[j][2 * h], pc[h]));
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      pq[h] = quad_sum(pq[h]);
      pz[h] = quad_sum(pz[h]);
      pc[h] = quad_sum(pc[h]);
      if (t == 0) {
        const int row = i0 + g + 8 * h, q = warp & 3;
        rowp[(0 * C + row) * 4 + q] = pq[h];
        rowp[(1 * C + row) * 4 + q] = pz[h];
        rowp[(2 * C + row) * 4 + q] = pc[h];
      }
    }
  }
  __syncthreads();  // Pm, Z, the parts of the sums complete; regions 0 and 1 are free
  if (next) {
    if (!KLA_MUTANT(bwd_grads_next_states_skipped))
      cp_tile_bf16<V>(Sb, PB, kSaved ? bwd_saved_states(bp, next) : next_rb + R.b_s, K);
    cp_tile_bf16<V>(dSb, PB, next_rb + R.b_ds, K);
    // region 0: the next head's dO rows, this chunk's (value head hv + 1) or the next chunk's
    // (its first value head)
    const bool same = j + 1 < bp.group;
    const PrepTile nt = same ? pt : next_chunk_tile(pt);
    cp_input_rows(dYb, PB, static_cast<const E*>(bp.dO), bp.dos, pt.sr.b, nt.tb,
                  same ? hv + 1 : pt.h * bp.group, nt.L);
    cp_tile_bf16<V>(dUb, PB, next_rb + R.b_du, C);
    cp_tile_bf16<V>(Ub, PB, kSaved ? bwd_saved_states(bp, next) + K * V : next_rb + R.b_u, C);
    cp_commit();
  }
  if (tid < C) {
    const int i = tid;
    const float a = quarter_sum(rowp, i);
    const float zk = quarter_sum(rowp + 4 * C, i);
    const float c = quarter_sum(rowp + 8 * C, i);
    const float eG = eg[i], z = gc[i] * zk;
    float dG = eG * a - z - eG * beta[i] * c, dbeta = -eG * c;
    bwd_gate_sums(rowg, colg, i, beta[i], dG, dbeta);
    zs[i] = z;
    dGs[i] = dG;
    dbs[i] = dbeta;
  }
  __syncthreads();  // zs, dG complete
  bwd_carry_and_cumsum(red, kBwdChunkThreads / 32, zs, rec[R.sc + kScChunk * C], dGs);
  // dq^ = e^G o (dY S^T) + Pm K^;  dk^ = Gamma_C o (U dS^T) - e^G beta o (dR S^T) + Pm^T Q^ +
  // Z K^ + Z^T K^, on the warp's tiles.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + g + 8 * h;
    const float eG = eg[row], a = gc[row], bb = eG * beta[row];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        a1[j][e] *= eG;
        a2[j][e] = a * a2[j][e] - bb * a3[j][e];
      }
  }
  warp_tile_mma<false, false>(a1, Pmc, PBC, i0, Kraw, PB, n0, C);  // + Pm K^ = (Pm diag(ks)) K
  warp_tile_mma<true, false>(a2, Pmr, PBC, i0, Qraw, PB, n0, C);   // + Pm^T Q^ = (diag(qs) Pm)^T Q
  warp_tile_mma<false, false>(a2, Zc, PBC, i0, Kraw, PB, n0, C);   // + Z K^ = (Z diag(ks)) K
  warp_tile_mma<true, false>(a2, Zr, PBC, i0, Kraw, PB, n0, C);    // + Z^T K^ = (diag(ks) Z)^T K
  // dq^, dk^ summed over the key head's value heads in value-head order (the prologue backwards
  // is linear in them): the earlier heads' sum from the group's first head's record (R.dq, R.dk,
  // fp32, written there by this thread in the previous head's pass), then either to the record
  // again or, for the last head, through the prologue on the tiles.
  const bool last = j == bp.group - 1;
  float* const sum = bwd_record_of_head(bp, rec, hv, pt.h * bp.group);
  if (j > 0) {
    add_tile(a1, sum + R.dq, K, i0, n0);
    add_tile(a2, sum + R.dk, K, i0, n0);
  }
  if (!last) {
    store_tile(sum + R.dq, K, i0, n0, a1);
    store_tile(sum + R.dk, K, i0, n0, a2);
    __syncthreads();  // dg (thread 0's cumulative sum) complete
  } else {  // its barriers complete dg too; rowp's row terms were read above the gate sums
    bwd_token_grads_tile<E>(bp, pt, rec + R.sc, a1, a2, i0, n0, beta, vparts,
                            j > 0 ? t1_sum : nullptr, Qraw, Kraw, rowp);
  }
  bwd_value_head_grads(bp, pt, beta, dGs, dbs, vparts, last ? nullptr : t1_sum, j == 0);
}

/// Grid (chunk group, key head, sequence): bp.grads_chunks consecutive chunks a block
/// (bwd_block_chunks), each chunk's value heads in turn, their dq^, dk^ summed in value-head order
/// as they go and the prologue backwards run once on the sum (it is linear in them), so no key-head
/// sum kernel follows. Each element of the running sum stays with one thread (the same warp and
/// lane in every head's pass), so it needs no synchronisation beyond that thread's program order.
/// Each head copies in the next one's tiles (dO, U, dU, A^-1, S, dS; the next chunk's first head's
/// after a chunk's last): the gradients are those of one block per chunk, bitwise.
template <class E, bool kSaved = false>
__global__ void __launch_bounds__(kBwdChunkThreads, 1)
    bwd_input_grads_bf16_kernel(const BwdParams bp) {
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 storage (bwd_runs_bf16_input_grads)");
  __builtin_assume(blockDim.x == kBwdChunkThreads);  // the launcher's (bwd_launch.cuh)
  const int hv0 = int(blockIdx.y) * bp.group;
  PrepTile pt = bwd_head_tile(bp.f, int(blockIdx.x) * bp.grads_chunks, hv0);
  if (pt.L == 0) return;
  bool copied = false;  // this head's tiles, by the block's previous head
#pragma unroll 1
  for (int cc = 0;; ++cc) {
    const bool more = bwd_block_has_next_chunk(pt, cc, bp.grads_chunks);
#pragma unroll 1
    for (int j = 0; j < bp.group; ++j) {
      pt.hv = hv0 + j;
      float* const rec = bwd_record(bp, pt.n, pt.sr, pt.c, pt.hv);
      // the next head's record: this chunk's next value head's, or the next chunk's first's
      const float* const next = j + 1 < bp.group ? rec + bp.rec_floats
                                : more ? rec + bwd_record_step(bp) - int64_t(j) * bp.rec_floats
                                       : nullptr;
      if (cc > 0 || j > 0) __syncthreads();  // the previous head's last reads of shared memory
      bwd_input_grads_bf16_head<E, kSaved>(bp, pt, j, rec, copied, next);
      copied = next != nullptr;
    }
    if (!more) break;
    pt = next_chunk_tile(pt);
  }
}

}  // namespace kla::kernels
