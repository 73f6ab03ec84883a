// bf16 tensor-core building blocks of the WY chunkwise path (chunk_wy.cuh): mma.sync m16n8k16
// with fp32 accumulation, ldmatrix fragment loads, the hi + lo split of fp32 values into two
// bf16 (16 significant bits together), and the sm_90 bulk copy completing on an mbarrier.
//
// Fragment conventions (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A (16 x 16, row): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16 x 8, col):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16 x 8):       c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_common.cuh"

namespace kla::kernels {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return unsigned(__cvta_generic_to_shared(p));
}

/// D += A B, bf16 inputs, fp32 accumulation (products exact; fp32 sums).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/// One k-step of a split product into its three parts: d[0] += Ah Bh, d[1] += Ah Bl, d[2] +=
/// Al Bh (Al Bl is below the split's precision and dropped).
__device__ __forceinline__ void mma_bf16_split(float (&d)[3][4], const uint32_t (&ah)[4],
                                               const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                                               uint32_t bl0, uint32_t bl1) {
  mma_bf16(d[0], ah, bh0, bh1);
  mma_bf16(d[1], ah, bl0, bl1);
  mma_bf16(d[2], al, bh0, bh1);
}

/// Four 8 x 8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm2_t(uint32_t (&r)[2], const void* p) {  // lanes 0-15 address
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/// Four 8 x 8 b16 matrices (r0..r3: this thread's pair of each, as an mma C fragment half);
/// lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stsm4(void* p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_addr(p)),
      "r"(r0), "r"(r1), "r"(r2), "r"(r3)
      : "memory");
}
/// Four 8 x 8 b16 matrices stored transposed (r0..r3: this thread's pair of each, as an mma C
/// fragment half); lane l gives the address of row l % 8 of matrix l / 8, which receives column
/// l % 8 of the matrix.
__device__ __forceinline__ void stsm4_t(void* p, uint32_t r0, uint32_t r1, uint32_t r2,
                                        uint32_t r3) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_addr(p)),
      "r"(r0), "r"(r1), "r"(r2), "r"(r3)
      : "memory");
}

// Lane address (element offset; matrix m = lane / 8) of two B tiles (k 16 x n 8, n-tiles n0 and
// n0 + 8) of a [k][n] matrix with pitch P, for ldsm4_t: r0, r1 = b0, b1 of the first n-tile, r2,
// r3 of the second.
__device__ __forceinline__ int frag_b_kn(int P, int k0, int n0, int lane) {
  return (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * P + n0 + (lane >> 4) * 8;
}

/// x, y -> hi = E2(x, y), lo = E2(x - hi.x, y - hi.y) for the 2-byte type E (bf16: 16
/// significant bits together; fp16: 22 while both stay normal, so the caller scales the pair
/// into fp16's range first, fp16_range_scale), both round to nearest; x is the lower half (the
/// element at the lower address / lower index).
template <class E>
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  hi = Dtype<E>::pack2(x, y);
  const float2 hf = Dtype<E>::unpack2(hi);
  lo = Dtype<E>::pack2(x - hf.x, y - hf.y);
}
__device__ __forceinline__ void split_bf16x2(float x, float y, uint32_t& hi, uint32_t& lo) {
  split_pair<__nv_bfloat16>(x, y, hi, lo);
}
/// The power of two 2^(14 - floor(log2 m)) that takes a magnitude m > 0 into [2^14, 2^15), fp16's
/// top binade below 2^15 (rounding may reach 2^15, still finite), its exponent held to [-64, 64]
/// so that values it scales stay inside fp32's range; 1 for m = 0. Exact to apply and to undo.
__device__ __forceinline__ float fp16_range_scale(float m) {
  if (m == 0.f) return 1.f;
  const int e = 268 - (__float_as_int(m) >> 23);  // biased: 127 + 14 - (exponent of m - 127)
  return __int_as_float(min(max(e, 127 - 64), 127 + 64) << 23);
}
/// 1 / s for a power of two s in [2^-126, 2^126] (exact).
__device__ __forceinline__ float pow2_inverse(float s) {
  return __int_as_float((254 << 23) - __float_as_int(s));
}
/// split_bf16x2 of (x, y), the hi pair stored at hi_dst and the lo pair at lo_dst (4-byte
/// aligned; shared or global memory).
__device__ __forceinline__ void store_split_bf16x2(void* hi_dst, void* lo_dst, float x, float y) {
  uint32_t hi, lo;
  split_bf16x2(x, y, hi, lo);
  *static_cast<uint32_t*>(hi_dst) = hi;
  *static_cast<uint32_t*>(lo_dst) = lo;
}
/// An fp16 pair as bf16 hi + lo: exact (11 significant bits fit in 8 + 8, and bf16's range
/// covers fp16's, subnormals included).
__device__ __forceinline__ void split_f16x2(uint32_t r, uint32_t& hi, uint32_t& lo) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r));
  split_bf16x2(f.x, f.y, hi, lo);
}

// ---- named barriers (id 0 is __syncthreads; threads a multiple of 32) -----------------------
/// Waits until `threads` threads have reached barrier id; orders their earlier shared-memory
/// accesses before everyone's later ones.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Counts the calling warp's arrival at barrier id without waiting (the producer side of a
/// producer / consumer hand-off: the consumers call named_bar_sync).
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- sm_90 bulk copies (global -> shared) completing on an mbarrier --------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
/// One box of a 4-d tensor map at coordinates (k0, t, h, b) into shared memory (aligned as the
/// map's swizzle requires).
__device__ __forceinline__ void tile_load(void* dst, const void* map, int k0, int t, int h, int b,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(k0), "r"(t), "r"(h), "r"(b), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

#endif

}  // namespace kla::kernels
