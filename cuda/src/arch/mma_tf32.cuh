// TF32 tensor-core building blocks (mma.sync m16n8k8, fp32 accumulation) of the TF32 path and of
// both preps' triangular inverse: fp32 values split into hi = tf32(x), rounded, and lo = x - hi,
// exact in fp32, of which the tensor core reads the TF32 bits (it ignores the low 13: lo
// truncated, below 2^-10 of lo, 2^-21 of x), so about 21 significant bits together, at three
// instructions an element; fragments loaded in a permuted k order (two elements a load).
//
// Fragment conventions (PTX ISA, mma.m16n8k8.tf32, g = lane / 4, t = lane % 4): A (16 x 8) a0
// (g, k t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B (8 x 8) b0 (k t, n g), b1 (k t+4, n g);
// C (16 x 8) c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
#pragma once

#include <cstdint>

#include "common/kernel_common.cuh"

namespace kla::kernels {

/// x rounded to TF32 (nearest, ties away, on the bit pattern). A NaN can come out as any value (the
/// carry turns the canonical 0x7fffffff into -0); split_lo keeps it a NaN.
__device__ __forceinline__ uint32_t tf32_bits(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
/// lo = x - hi as an fp32 pattern (exact), read by the tensor core as its TF32 bits. For a NaN x
/// it is the canonical NaN 0x7fffffff (an fp32 subtraction returns it for any NaN operand), whose
/// TF32 bits are a NaN: every split product carries a lo term, so NaN stays NaN whatever hi became
/// (docs/bad_input.md, 'Values').
__device__ __forceinline__ uint32_t split_lo(float x, uint32_t hi) {
  return __float_as_uint(x - __uint_as_float(hi));
}

struct FragA {
  uint32_t h[4], l[4];
};
struct FragB {
  uint32_t h[2], l[2];
};

__device__ __forceinline__ float tof(float x) {
  return x;
}
__device__ __forceinline__ float tof(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float tof(__half x) {
  return __half2float(x);
}

template <bool kSplit, class T>
__device__ __forceinline__ void set_frag(uint32_t& h, uint32_t& l, T v) {
  const float x = tof(v);
  if constexpr (kSplit) {
    h = tf32_bits(x);
    l = split_lo(x, h);
  } else {
    h = __float_as_uint(x);  // already exact in TF32 (a bf16 / fp16 value)
    l = 0u;
  }
}

__device__ __forceinline__ void store_split(uint32_t* hi, uint32_t* lo, int idx, float x) {
  const uint32_t h = tf32_bits(x);
  hi[idx] = h;
  lo[idx] = split_lo(x, h);
}

// Permuted k order. Within one 8-wide k step the products only need A and B to agree on
// which column is which, so fragment slots k = t and k = t + 4 take the adjacent columns 2t
// and 2t + 1: two elements per 32-bit (2-byte types) or 64-bit (fp32) shared load.
__device__ __forceinline__ void pair_to_f32(const float* s, float& x, float& y) {
  const float2 v = *reinterpret_cast<const float2*>(s);
  x = v.x, y = v.y;
}
__device__ __forceinline__ void pair_to_f32(const __nv_bfloat16* s, float& x, float& y) {
  const uint32_t u = *reinterpret_cast<const uint32_t*>(s);
  x = __uint_as_float(u << 16), y = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void pair_to_f32(const __half* s, float& x, float& y) {
  const float2 v = __half22float2(*reinterpret_cast<const __half2*>(s));
  x = v.x, y = v.y;
}
/// A (16 x 8), permuted k, from a row-major matrix with pitch P (even).
template <bool kSplit, class T>
__device__ __forceinline__ FragA load_a_perm(const T* s, int P, int r0, int k0, int g, int t) {
  float x0, x1, x2, x3;
  pair_to_f32(s + (r0 + g) * P + k0 + 2 * t, x0, x2);
  pair_to_f32(s + (r0 + g + 8) * P + k0 + 2 * t, x1, x3);
  FragA f;
  set_frag<kSplit>(f.h[0], f.l[0], x0);
  set_frag<kSplit>(f.h[1], f.l[1], x1);
  set_frag<kSplit>(f.h[2], f.l[2], x2);
  set_frag<kSplit>(f.h[3], f.l[3], x3);
  return f;
}
/// A (16 x 8), permuted k, A(r, k) = s[k * P + r] (transposed storage).
template <bool kSplit, class T>
__device__ __forceinline__ FragA load_a_t_perm(const T* s, int P, int r0, int k0, int g, int t) {
  FragA f;
  set_frag<kSplit>(f.h[0], f.l[0], s[(k0 + 2 * t) * P + r0 + g]);
  set_frag<kSplit>(f.h[1], f.l[1], s[(k0 + 2 * t) * P + r0 + g + 8]);
  set_frag<kSplit>(f.h[2], f.l[2], s[(k0 + 2 * t + 1) * P + r0 + g]);
  set_frag<kSplit>(f.h[3], f.l[3], s[(k0 + 2 * t + 1) * P + r0 + g + 8]);
  return f;
}
/// B (8 x 8), permuted k, B(k, n) = s[n * P + k] (row-major [n][k], pitch even).
template <bool kSplit, class T>
__device__ __forceinline__ FragB load_b_nk_perm(const T* s, int P, int k0, int n0, int g, int t) {
  float x0, x1;
  pair_to_f32(s + (n0 + g) * P + k0 + 2 * t, x0, x1);
  FragB f;
  set_frag<kSplit>(f.h[0], f.l[0], x0);
  set_frag<kSplit>(f.h[1], f.l[1], x1);
  return f;
}
/// B (8 x 8), permuted k, B(k, n) = hi/lo[k * P + n], already split.
__device__ __forceinline__ FragB load_b_pre_perm(const uint32_t* hi, const uint32_t* lo, int P,
                                                 int k0, int n0, int g, int t) {
  FragB f;
  f.h[0] = hi[(k0 + 2 * t) * P + n0 + g];
  f.h[1] = hi[(k0 + 2 * t + 1) * P + n0 + g];
  f.l[0] = lo[(k0 + 2 * t) * P + n0 + g];
  f.l[1] = lo[(k0 + 2 * t + 1) * P + n0 + g];
  return f;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// d0 += Ah Bh; d1 += Ah Bl (B split); d2 += Al Bh (A split): three independent accumulation
/// chains that the caller sums (the TF32 scan as (d0 + d1) + d2, the inverse by parts_sum).
template <bool kSplitA, bool kSplitB>
__device__ __forceinline__ void mma3(float (&d0)[4], float (&d1)[4], float (&d2)[4], const FragA& a,
                                     const FragB& b) {
  mma_tf32(d0, a.h, b.h);
  if constexpr (kSplitB) mma_tf32(d1, a.h, b.l);
  if constexpr (kSplitA) mma_tf32(d2, a.l, b.h);
}

/// B (8 x 8), permuted k, B(k, n) = s[k * P + n] (row-major [k][n], fp32), split.
__device__ __forceinline__ FragB load_b_kn_perm(const float* s, int P, int k0, int n0, int g,
                                                int t) {
  FragB f;
  set_frag<true>(f.h[0], f.l[0], s[(k0 + 2 * t) * P + n0 + g]);
  set_frag<true>(f.h[1], f.l[1], s[(k0 + 2 * t + 1) * P + n0 + g]);
  return f;
}

}  // namespace kla::kernels
