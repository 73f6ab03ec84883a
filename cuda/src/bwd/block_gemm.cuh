// The backward's products: C = alpha op(A) op(B) (+ C) by a whole block on the tensor cores
// (mma.sync m16n8k8 TF32, arch/mma_tf32.cuh), fp32 accumulation, in one of two arithmetics (the
// call's kla_arithmetic, BwdParams::fast):
// * ACCURATE (kFast = false): both operands split hi + lo, three products a step in three chains
//   summed (d0 + d1) + d2. A is split rounded (hi = tf32(x), lo = x - hi); B by the cheap split:
//   hi is the fp32 value itself, of which the tensor core reads the TF32 bits (it ignores the low
//   13), and lo = x - trunc_tf32(x) is exact in fp32 and read the same way. Each operand keeps
//   about 21 significant bits (relative error below 2^-21 a product: fp32 grade, as the
//   forward's TF32 path).
// * FAST (kFast = true): each operand one part, its fp32 bits as they are, read by the tensor core
//   as TF32 (truncated: below 2^-10 relative an operand, 2^-9 a product): one product a step and
//   no split. Still finer than the 16-bit operands of the peers' backward (bf16 rounded to
//   nearest: below 2^-8 an operand); docs/accuracy.md has both beside each other. (For bf16 at
//   K = V = 128 only the state-gradient scan runs here: the prep, the state scan and the input
//   gradients run bwd/bwd_prep_bf16.cuh, bwd/bwd_state_forward_bf16.cuh and
//   bwd/bwd_input_grads_bf16.cuh on bf16 tensor cores instead.)
// Each warp owns 16 x 8 NT output tiles (BwdTiles: NT = 4, or the widest that still gives every
// warp a tile) and sums over the inner dimension in index order: every output element is the
// same chains over k whatever NT and the block's size, so the result is bitwise the same (no
// atomics, no split of the inner sum).
// Operands are addressed by pointer and row pitch: A and B live in shared memory, C in shared or
// global memory.
//   op(A)(i, k) = TA ? A[k * lda + i] : A[i * lda + k]      [M x KD]
//   op(B)(k, j) = TB ? B[j * ldb + k] : B[k * ldb + j]      [KD x N]
// M is a multiple of 16, N of 8, KD of 8; pitches == 4 mod 32 keep the fragment loads
// conflict-free (bwd_pitch); C's pitch is even and C 8-byte aligned (pairs of columns are stored
// together). No barrier inside: the caller orders the block's accesses.
#pragma once

#include "arch/mma_tf32.cuh"
#include "common/kernel_mutants.hpp"

namespace kla::kernels {

/// The cheap split of x (see above): hi = x (its TF32 bits are what the tensor core reads), lo = x
/// minus those bits.
__device__ __forceinline__ void split_tf32_trunc(float x, uint32_t& h, uint32_t& l) {
  h = __float_as_uint(x);
  l = __float_as_uint(x - __uint_as_float(h & 0xffffe000u));
}

/// B fragment in the permuted k order of arch/mma_tf32.cuh (slots k = t, t + 4 hold columns 2t,
/// 2t + 1), split cheaply; kExact: values exact in TF32 (raw bf16 / fp16), one part, lo = 0.
/// B(k, n) = TB ? s[n P + k] : s[k P + n].
template <bool TB, bool kExact = false>
__device__ __forceinline__ FragB bwd_frag_b(const float* s, int P, int k0, int n0, int g, int t) {
  float x[2];
  if (TB) {
    const float2 a = *reinterpret_cast<const float2*>(s + (n0 + g) * P + k0 + 2 * t);
    x[0] = a.x, x[1] = a.y;
  } else {
    x[0] = s[(k0 + 2 * t) * P + n0 + g], x[1] = s[(k0 + 2 * t + 1) * P + n0 + g];
  }
  FragB f;
  if constexpr (kExact) {
    f.h[0] = __float_as_uint(x[0]), f.h[1] = __float_as_uint(x[1]);
    f.l[0] = f.l[1] = 0u;
  } else {
    split_tf32_trunc(x[0], f.h[0], f.l[0]);
    split_tf32_trunc(x[1], f.h[1], f.l[1]);
  }
  return f;
}

/// The kernel mutant bwd_fast_bf16_operands (common/kernel_mutants.hpp): FAST's operands rounded
/// to bf16 (nearest), the peers' grade, where FAST promises TF32's (the state-gradient path always;
/// every product where the bf16 input-gradient kernel does not run).
__device__ __forceinline__ void bwd_mutant_bf16(uint32_t* h, int n) {
  for (int e = 0; e < n; ++e) h[e] = (h[e] + 0x8000u) & 0xffff0000u;
}

/// How block_gemm cuts C into warp tiles. kEveryWarp: the widest tile (16 x 32, 16 x 16, 16 x 8)
/// that still gives every warp one (a 64 x 32 product on 8 warps runs as 8 tiles of 16 x 16, not 4
/// of 16 x 32 with 4 warps waiting at the next barrier). kWidest: 16 x 32 (16 x 8 where N is not a
/// multiple of 32), the fewest fragment loads and splits, idle warps on small products.
enum class BwdTiles { kWidest, kEveryWarp };

/// The units of block_gemm: 16 x (8 NT) output tiles. kExactB: B holds values exact in TF32 (raw
/// 16-bit inputs), so its lo part is zero and the product A_hi B_lo is skipped (its chain stays
/// +0, as the skipped products would have left it for finite inputs). kFast: one part each (the
/// chains d1, d2 stay +0 and drop out of the sum).
template <bool kFast, bool TA, bool TB, bool kAccumulate, int NT, bool kExactB>
__device__ __forceinline__ void block_gemm_units(int M, int N, int KD, const float* __restrict__ A,
                                                 int lda, const float* __restrict__ B, int ldb,
                                                 float* C, int ldc, float alpha) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int un = N / (8 * NT), units = (M / 16) * un;
  constexpr bool kOnePartB = kExactB || kFast;  // B read as one part (lo = 0)
  for (int u = warp; u < units; u += nwarps) {
    const int i0 = (u / un) * 16, n0 = (u % un) * 8 * NT;
    float d[NT][3][4] = {};  // [n tile][chain][element]
#pragma unroll 2             // the next k-step's fragment loads overlap this one's products
    for (int k = 0; k < KD; k += 8) {
      FragA a = TA ? load_a_t_perm<!kFast>(A, lda, i0, k, g, t)
                   : load_a_perm<!kFast>(A, lda, i0, k, g, t);
      if (kFast && KLA_MUTANT(bwd_fast_bf16_operands)) bwd_mutant_bf16(a.h, 4);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        FragB b = bwd_frag_b<TB, kOnePartB>(B, ldb, k, n0 + 8 * j, g, t);
        if (kFast && KLA_MUTANT(bwd_fast_bf16_operands)) bwd_mutant_bf16(b.h, 2);
        mma3<!kFast, !kExactB && !kFast>(d[j][0], d[j][1], d[j][2], a, b);
      }
    }
    // Elements (e, e + 1) of a tile are adjacent columns of one row: one 8-byte access each.
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        float2 x = make_float2((d[j][0][e] + d[j][1][e]) + d[j][2][e],
                               (d[j][0][e + 1] + d[j][1][e + 1]) + d[j][2][e + 1]);
        float2* dst = reinterpret_cast<float2*>(C + int64_t(i0 + g + (e >> 1) * 8) * ldc + n0 +
                                                8 * j + 2 * t);
        if (kAccumulate) {
          const float2 c = *dst;
          x = make_float2(fmaf(alpha, x.x, c.x), fmaf(alpha, x.y, c.y));
        } else {
          x = make_float2(alpha * x.x, alpha * x.y);
        }
        *dst = x;
      }
  }
}

/// C = alpha op(A) op(B) (+ C) by the whole block in the arithmetic kFast; see the top of this
/// file.
template <bool kFast, bool TA, bool TB, bool kAccumulate, BwdTiles kTiles = BwdTiles::kEveryWarp,
          bool kExactB = false>
__device__ __forceinline__ void block_gemm(int M, int N, int KD, const float* __restrict__ A,
                                           int lda, const float* __restrict__ B, int ldb, float* C,
                                           int ldc, float alpha) {
  const int warps = int(blockDim.x >> 5), rows = M / 16;
  constexpr bool every = kTiles == BwdTiles::kEveryWarp;
  if (N % 32 == 0 && (!every || rows * (N / 32) >= warps)) {
    block_gemm_units<kFast, TA, TB, kAccumulate, 4, kExactB>(M, N, KD, A, lda, B, ldb, C, ldc,
                                                             alpha);
  } else if (every && N % 16 == 0 && rows * (N / 16) >= warps) {
    block_gemm_units<kFast, TA, TB, kAccumulate, 2, kExactB>(M, N, KD, A, lda, B, ldb, C, ldc,
                                                             alpha);
  } else {
    block_gemm_units<kFast, TA, TB, kAccumulate, 1, kExactB>(M, N, KD, A, lda, B, ldb, C, ldc,
                                                             alpha);
  }
}

}  // namespace kla::kernels
