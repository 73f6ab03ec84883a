// The backward's products: C = alpha op(A) op(B) (+ C) by a whole block on CUDA cores, fp32
// operands and accumulation, each thread owning 4 x 4 outputs at a time and summing over the
// inner dimension in index order (the same inputs give bitwise the same result: no atomics, no
// split of the inner sum). Operands are addressed by pointer and row pitch, so A and B live in
// shared memory and C in shared or global memory.
//   op(A)(i, k) = TA ? A[k * lda + i] : A[i * lda + k]      [M x KD]
//   op(B)(k, j) = TB ? B[j * ldb + k] : B[k * ldb + j]      [KD x N]
// M and N are multiples of 4. No barrier inside: the caller orders the block's accesses.
#pragma once

namespace kla::kernels {

template <bool TA, bool TB, bool kAccumulate>
__device__ __forceinline__ void block_gemm(int M, int N, int KD, const float* __restrict__ A,
                                           int lda, const float* __restrict__ B, int ldb, float* C,
                                           int ldc, float alpha) {
  const int tn = N / 4, tiles = (M / 4) * tn;
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
    const int i0 = (t / tn) * 4, j0 = (t % tn) * 4;
    float acc[4][4] = {};
#pragma unroll 4
    for (int k = 0; k < KD; ++k) {
      float a[4], b[4];
      if (TA) {
        const float4 x = *reinterpret_cast<const float4*>(A + k * lda + i0);
        a[0] = x.x, a[1] = x.y, a[2] = x.z, a[3] = x.w;
      } else {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = A[(i0 + r) * lda + k];
      }
      if (TB) {
#pragma unroll
        for (int c = 0; c < 4; ++c) b[c] = B[(j0 + c) * ldb + k];
      } else {
        const float4 y = *reinterpret_cast<const float4*>(B + k * ldb + j0);
        b[0] = y.x, b[1] = y.y, b[2] = y.z, b[3] = y.w;
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float* dst = C + int64_t(i0 + r) * ldc + j0 + c;
        *dst = kAccumulate ? fmaf(alpha, acc[r][c], *dst) : alpha * acc[r][c];
      }
  }
}

}  // namespace kla::kernels
