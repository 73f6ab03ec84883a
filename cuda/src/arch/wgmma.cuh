// sm_90a warpgroup MMA (wgmma) for the WY scan (scan/wy_scan.cuh, scan/wy_scan_transposed.cuh,
// prep/wy_prep.cuh) and the backward's segmented chain (bwd/bwd_state_grad_segments.cuh): bf16 or
// fp16 operands read by the tensor cores straight from shared memory (128-byte-swizzled tiles, once
// per warpgroup: no per-warp ldmatrix copies), fp32 accumulation.
//
// Layouts (PTX ISA, wgmma shared-memory matrix layouts, 128-byte swizzle; the same swizzle as
// the TMA boxes, kmajor_sw128_offset in layout/chunk_geometry.hpp): 1024-byte atoms of 8 rows x 128
// B, the 16-byte piece c of row r stored at piece c ^ (r % 8).
//   K-major (A rows = M, or B rows = N; k along the row): [panels of 64 k][rows][128 B]; a k-step
//   of 16 starts 32 B further into the row (or at the next panel); 8-row groups 1024 B apart.
//   M-major A (the transpose of a K-major tile: rows = k): 8-row groups along k 1024 B apart.
//   D (m64nN): warp w of the warpgroup rows 16w.., float d[N/2], d[4j + e] as the mma C fragment
//   of 8-column tile j.
// Only compiled for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); the plan (BuildInfo, KLA_HAVE_SM90A)
// keeps the WY paths away when the build has no sm_90a image.
#pragma once

#include <cstdint>
#include <type_traits>

#include "arch/mma_bf16.cuh"

namespace kla::kernels {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/// Descriptor of a 128-byte-swizzled bf16 operand tile starting at p (a k-step's start inside
/// 1024-byte-aligned atoms of 8 rows x 128 B): 1024 B between 8-row groups (K-major: along M / N;
/// M-major: along K); lbo_bytes between 64-element blocks along M of an M-major A (unused when M
/// = 64 and for K-major tiles, where the ISA asks for 1).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* p, uint32_t lbo_bytes = 16) {
  const uint64_t a = smem_addr(p);
  return ((a & 0x3FFFFu) >> 4) | (uint64_t(lbo_bytes >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

/// The descriptor of the tile bytes bytes after desc's (bytes a multiple of 16): the start
/// address field holds address >> 4 in 14 bits, and shared addresses stay below 2^18, so the sum
/// never carries out of the field.
__device__ __forceinline__ uint64_t wgmma_desc_advance(uint64_t desc, int bytes) {
  return desc + uint64_t(uint32_t(bytes) >> 4);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (wgmma's
/// B reads); call after the writes and before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/// Keeps the compiler from moving accesses of the accumulators across the asynchronous window.
template <int M>
__device__ __forceinline__ void wgmma_reg_fence(float (&d)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// D (64 x N, fp32; N = 2 x the size of d) += A (64 x 16, descriptor; M-major when TA) B (16 x N,
/// descriptor; K-major, or MN-major when TB: the transpose of a K-major tile, rows = k, 8-row
/// groups 1024 B apart), both bf16 or both fp16 (E), read from shared memory. One overload per N
/// (the operand list is the shape). KLA_WGMMA_SS: the instruction for E (the PTX type is part of
/// the string), SHAPE and the accumulator registers DREGS, then the operand numbers of a, b, the
/// scale-d predicate's source, TA and TB, then the accumulators' constraints.
#define KLA_WGMMA_SS_ASM(TYPE, SHAPE, DREGS, IA, IB, IS, ITA, ITB, ...)                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS                                        \
               ", 0;\n"                                                                       \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " DREGS ", %" IA \
               ", %" IB ", p, 1, 1, %" ITA ", %" ITB ";\n}\n"                                 \
               : __VA_ARGS__                                                                  \
               : "l"(a), "l"(b), "r"(1), "n"(TA), "n"(TB))
#define KLA_WGMMA_SS(...)                                                                        \
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>, "2-byte inputs"); \
  if constexpr (std::is_same_v<E, __half>)                                                       \
    KLA_WGMMA_SS_ASM("f16", __VA_ARGS__);                                                        \
  else                                                                                           \
    KLA_WGMMA_SS_ASM("bf16", __VA_ARGS__)
template <int TA, class E, int TB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[8], uint64_t a, uint64_t b) {
  KLA_WGMMA_SS("m64n16k16", "{%0,%1,%2,%3,%4,%5,%6,%7}", "8", "9", "10", "11", "12", "+f"(d[0]),
               "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]));
}
template <int TA, class E, int TB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t a, uint64_t b) {
  KLA_WGMMA_SS("m64n32k16", "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}", "16", "17",
               "18", "19", "20", "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
               "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
               "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]));
}
template <int TA, class E, int TB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t a, uint64_t b) {
  KLA_WGMMA_SS("m64n64k16",
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,"
               "%23,%24,%25,%26,%27,%28,%29,%30,%31}",
               "32", "33", "34", "35", "36", "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
               "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]),
               "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
               "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
               "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
               "+f"(d[29]), "+f"(d[30]), "+f"(d[31]));
}
#undef KLA_WGMMA_SS
#undef KLA_WGMMA_SS_ASM

/// At most N of this warpgroup's committed wgmma groups still pending (groups complete in order).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/// D (64 x N, fp32; N = 2 x the size of d) += A (64 x 16 from registers: this thread's fragment,
/// the mma.sync A layout of its warp's 16 rows, so that reg r of k-step ks is the pair
/// (d[8 ks + 2 r], d[8 ks + 2 r + 1]) of an m64nN accumulator) B (16 x N, descriptor; K-major, or
/// MN-major when TB), both bf16 or both fp16 (E). The A registers must stay unchanged until the
/// group's wait.
template <int TB, class E>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>, "2-byte inputs");
#define KLA_WGMMA_RS_N64(TYPE)                                                                 \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE                     \
               " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                      \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31},"             \
               " {%32,%33,%34,%35}, %36, 1, 1, 1, %37;\n"                                      \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),       \
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),     \
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), \
                 "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
                 "+f"(d[30]), "+f"(d[31])                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TB))
  if constexpr (std::is_same_v<E, __half>)
    KLA_WGMMA_RS_N64("f16");
  else
    KLA_WGMMA_RS_N64("bf16");
#undef KLA_WGMMA_RS_N64
}
template <int TB>
__device__ __forceinline__ void wgmma_rs_bf16(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  wgmma_rs_n64<TB, __nv_bfloat16>(d, a, b);
}
template <int TB>
__device__ __forceinline__ void wgmma_rs_bf16(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%"
      "23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%"
      "44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%6"
      "4,%65,%66,%67}, %68, 1, 1, 1, %69;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TB));
}

#endif

}  // namespace kla::kernels
