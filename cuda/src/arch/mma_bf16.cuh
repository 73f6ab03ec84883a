// bf16 tensor-core building blocks (sm_80 level) of the WY path: mma.sync m16n8k16 with fp32
// accumulation, ldmatrix / stmatrix fragment moves.
//
// Fragment conventions (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A (16 x 16, row): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16 x 8, col):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16 x 8):       c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "arch/copy.cuh"

namespace kla::kernels {

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

}  // namespace kla::kernels
