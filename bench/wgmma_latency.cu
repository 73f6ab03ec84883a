// Latency of the WY scan's product shapes on one multiprocessor (sm_90a), in isolation: how many
// cycles a warpgroup waits from the first wgmma of a product to its results, alone and with
// other warpgroups issuing at the same time, an mma.sync chain of the same k-steps for
// comparison, and step A transposed (the state as the register A operand, 64 value columns) as
// a candidate design. A diagnostic for docs/prefill_notes.md (session 9, w50), built as
// kla_wgmma_latency where the build has an sm_90a image; it needs a compute capability 9.0 GPU
// (elsewhere it says so and exits 0).
//
// Operands are zeros in 128-byte-swizzled tiles (values do not change the timing); one block,
// cycles by clock64 around each product (fence, wgmma chain, commit, wait), mean over 512
// products after 32 warm-up ones, printed for the first warp of each warpgroup.
#include <cstdio>
#include <iterator>

#include "arch/split.cuh"
#include "arch/wgmma.cuh"
#include "sm90_device.hpp"

using namespace kla::kernels;

namespace {

constexpr int kIters = 512, kWarm = 32;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/// Commits and waits for the product's wgmma group into d; the cycles since t0. d's sum goes to
/// sink, so that the product is kept.
template <int M>
__device__ __forceinline__ long long end_product(float (&d)[M], long long t0, float& sink) {
  wgmma_commit();
  wgmma_wait_all();
  wgmma_reg_fence(d);
  const long long t1 = clock64();
#pragma unroll
  for (int i = 0; i < M; ++i) sink += d[i];
  return t1 - t0;
}

/// One product of the scan's shape: KSTEPS k-steps of m64nNk16 into one accumulator, A K-major
/// (or M-major, kTransA: the K^T of step C) from a, B K-major from b.
template <int N, int KSTEPS, bool kTransA>
__device__ long long timed_product(const char* a, const char* b, float& sink) {
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const long long t0 = clock64();
  wgmma_reg_fence(d);
  wgmma_fence();
  const uint64_t ad0 = wgmma_desc_sw128(a, kTransA ? 8192 : 16), bd0 = wgmma_desc_sw128(b);
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks)
    wgmma_ss<kTransA ? 1 : 0, __nv_bfloat16>(
        d, wgmma_desc_advance(ad0, kTransA ? ks * 2048 : (ks >> 2) * 8192 + (ks & 3) * 32),
        wgmma_desc_advance(bd0, (ks >> 2) * N * 128 + (ks & 3) * 32));
  return end_product(d, t0, sink);
}

/// Step A transposed for 64 value columns: (K S)^T = S^T K^T, S^T's hi and lo fragments from
/// registers (two products a k-step), the raw K tile as the K-major B operand (N = 64 tokens;
/// N = 128: the tokens of K and Q). ah / al: this thread's fragments (fixed, or drawn from the
/// thread index: the tensor cores' rate may depend on the values).
template <int N>
__device__ long long timed_rs_product(const char* b, const uint32_t (&ah)[4],
                                      const uint32_t (&al)[4], float& sink) {
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const long long t0 = clock64();
  wgmma_reg_fence(d);
  wgmma_fence();
  const uint64_t bd0 = wgmma_desc_sw128(b);
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint64_t bd = wgmma_desc_advance(bd0, (ks >> 2) * N * 128 + (ks & 3) * 32);
    wgmma_rs_bf16<0>(d, ah, bd);
    wgmma_rs_bf16<0>(d, al, bd);
  }
  return end_product(d, t0, sink);
}

/// Register A fragments for 8 k-steps drawn from seed: hi parts in +-[1, 2), lo parts 2^-8 of
/// that, as a split state would give.
__device__ __forceinline__ void draw_fragments(uint32_t seed, uint32_t (&ah)[8][4],
                                               uint32_t (&al)[8][4]) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint32_t x = (seed + 8 * ks + r) * 2654435761u;
      ah[ks][r] = 0x3f803f80u | (x & 0x807f807fu);
      al[ks][r] = 0x3b803b80u | ((x >> 8) & 0x007f007fu);
    }
}

/// timed_rs_product with its own fragments each k-step (as a product of the state takes them):
/// 8 k-steps x hi + lo, N = 64.
__device__ long long timed_rs_product_distinct(const char* b, uint32_t seed, float& sink) {
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  uint32_t ah[8][4], al[8][4];
  draw_fragments(seed, ah, al);
  const long long t0 = clock64();
  wgmma_reg_fence(d);
  wgmma_fence();
  const uint64_t bd0 = wgmma_desc_sw128(b);
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint64_t bd = wgmma_desc_advance(bd0, (ks >> 2) * 64 * 128 + (ks & 3) * 32);
    wgmma_rs_bf16<0>(d, ah[ks], bd);
    wgmma_rs_bf16<0>(d, al[ks], bd);
  }
  return end_product(d, t0, sink);
}

/// The transposed scan's (K S)^T and (Q S)^T k-steps issued in turn into dk and dq (m64n64k16 x
/// 8 x hi, lo each), B from the K rows and the Q rows of [K | Q] panels at b (16 KB a panel).
__device__ __forceinline__ void issue_two_chains(float (&dk)[32], float (&dq)[32],
                                                 const uint32_t (&ah)[8][4],
                                                 const uint32_t (&al)[8][4], const char* b) {
  const uint64_t bd0 = wgmma_desc_sw128(b);
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint64_t bk = wgmma_desc_advance(bd0, (ks >> 2) * 16384 + (ks & 3) * 32);
    const uint64_t bq = wgmma_desc_advance(bk, 8192);
    wgmma_rs_bf16<0>(dk, ah[ks], bk);
    wgmma_rs_bf16<0>(dq, ah[ks], bq);
    wgmma_rs_bf16<0>(dk, al[ks], bk);
    wgmma_rs_bf16<0>(dq, al[ks], bq);
  }
}

/// The transposed scan's (K S)^T and (Q S)^T: two accumulator chains issued in turn (m64n64k16 x
/// 8 k-steps x hi, lo each), B from the K rows and the Q rows of [K | Q] panels (16 KB a panel).
__device__ long long timed_two_chains(const char* b, uint32_t seed, float& sink) {
  float dk[32], dq[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = dq[i] = 0.f;
  uint32_t ah[8][4], al[8][4];
  draw_fragments(seed, ah, al);
  const long long t0 = clock64();
  wgmma_reg_fence(dk);
  wgmma_reg_fence(dq);
  wgmma_fence();
  issue_two_chains(dk, dq, ah, al, b);
  wgmma_commit();
  wgmma_wait_all();
  wgmma_reg_fence(dk);
  wgmma_reg_fence(dq);
  const long long t1 = clock64();
#pragma unroll
  for (int i = 0; i < 32; ++i) sink += dk[i] + dq[i];
  return t1 - t0;
}

/// An mma.sync chain per warp: KSTEPS k-steps of 16 rows x NT 8-column tiles, A and B by
/// ldmatrix from shared memory (the step-A product on mma.sync).
template <int NT, int KSTEPS>
__device__ long long timed_mma_chain(const char* a, const char* b, float& sink) {
  const int lane = threadIdx.x & 31;
  float d[NT][4] = {};
  const long long t0 = clock64();
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    uint32_t af[4];
    ldsm4(af, a + ks * 512 + lane * 16);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bf[4];
      ldsm4_t(bf, b + (ks * NT / 2 + np) * 512 + lane * 16);
      mma_bf16(d[2 * np], af, bf[0], bf[1]);
      mma_bf16(d[2 * np + 1], af, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) asm volatile("" : "+f"(d[j][0]), "+f"(d[j][3])::"memory");
  const long long t1 = clock64();
#pragma unroll
  for (int j = 0; j < NT; ++j) sink += d[j][0] + d[j][3];
  return t1 - t0;
}

#endif

/// Mode m, warpgroup wg: which product the warpgroup times (0: none).
__device__ int product_of(int mode, int wg) {
  switch (mode) {
    case 0: return wg == 0 ? 1 : 0;   // step A (VS = 16) alone
    case 1: return wg == 0 ? 2 : 0;   // step A (VS = 32) / Q S (VS = 16) alone
    case 2: return wg == 0 ? 3 : 0;   // step C (K^T X, VS = 16) alone
    case 3: return wg < 2 ? 1 : 0;    // step A on two warpgroups at once
    case 4: return wg < 2 ? 1 : 2;    // step A on two + Q S on a third, at once
    case 5: return wg < 2 ? 3 : 0;    // step C on two warpgroups at once
    case 6: return wg == 0 ? 4 : 0;   // step A on mma.sync, one warpgroup
    case 7: return wg < 2 ? 4 : 0;    // step A on mma.sync, two warpgroups
    case 8: return wg == 0 ? 5 : 0;   // S^T K^T for 64 columns, A from registers
    case 9: return wg < 2 ? 5 : 0;    // the same on two warpgroups
    case 10: return wg == 0 ? 5 : 0;  // mode 8 on random operands
    case 11: return wg < 2 ? 5 : 0;   // mode 9 on random operands
    case 12:
    case 13: return wg == 0 ? 6 : 0;  // S^T [K^T | Q^T] (N = 128), random operands (13: every SM)
    case 14: return wg == 0 ? 7 : 0;  // mode 10 with its own fragments each k-step
    default:
      return wg == 0 ? 8 : 0;  // the transposed scan's K S and Q S, two chains (17, 18:
                               // after 1,000 / 3,000 cycles without tensor work)
  }
}

__global__ void __launch_bounds__(384, 1)
    latency_kernel(int mode, long long* out, float* sink_out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem[];
  // Zeros, or (modes 10 and later) bf16 values in [1, 2) with random mantissas: the tensor cores
  // may run faster on zeros.
  const bool rnd = mode >= 10, wide = mode == 16;
  const long long gap = mode == 17 ? 1000 : mode == 18 ? 3000 : 0;
  if (mode == 13) mode = 12;
  auto draw = [](uint32_t x) {  // two bf16 in [1, 2)
    x = x * 2654435761u ^ (x >> 13);
    x *= 2246822519u;
    return (0x3f80u | (x & 0x7fu)) | (0x3f80u | ((x >> 16) & 0x7fu)) << 16;
  };
  // Random signs, exponents 2^-14..2^17 and mantissas (mode 16): as many bits toggling as real
  // operands.
  auto draw_wide = [](uint32_t x) {
    x = x * 2654435761u ^ (x >> 13);
    x *= 2246822519u;
    x ^= x >> 16;
    const uint32_t m = x & 0x807f807fu, e = ((x >> 7) & 0x1f001fu) + 0x700070u;
    return m | (e << 7);
  };
  for (int i = threadIdx.x; i < 96 * 1024 / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] =
        wide  ? make_uint4(draw_wide(4 * i), draw_wide(4 * i + 1), draw_wide(4 * i + 2),
                           draw_wide(4 * i + 3))
        : rnd ? make_uint4(draw(4 * i), draw(4 * i + 1), draw(4 * i + 2), draw(4 * i + 3))
              : make_uint4(0, 0, 0, 0);
  uint32_t ah[4] = {0x3f803f80u, 0, 0, 0}, al[4] = {0, 0, 0, 0};  // fixed fragments
  if (rnd)
    for (int r = 0; r < 4; ++r)
      ah[r] = draw(threadIdx.x * 8 + r), al[r] = draw(threadIdx.x * 8 + 4 + r);
  fence_proxy_async_shared();
  __syncthreads();
  const int wg = threadIdx.x / 128, prod = product_of(mode, wg);
  // A tiles (16 KB) at 0 / 16 KB, B tiles at 64 KB + 8 KB per warpgroup.
  const char* a = smem + (wg & 1) * 16384;
  const char* b = smem + 65536 + wg * 8192;
  float sink = 0.f;
  long long total = 0;
  for (int it = 0; it < kWarm + kIters; ++it) {
    long long c = 0;
    // An idle tensor pipe for gap cycles first (the scan's epilogues leave it idle that long).
    for (const long long t = clock64(); clock64() - t < gap;) {
    }
    if (prod == 1) c = timed_product<16, 8, false>(a, b, sink);
    if (prod == 2) c = timed_product<32, 8, false>(a, b, sink);
    if (prod == 3) c = timed_product<32, 4, true>(a, b, sink);
    if (prod == 4) c = timed_mma_chain<4, 8>(a, b, sink);
    if (prod == 5) c = timed_rs_product<64>(a, ah, al, sink);
    if (prod == 6) c = timed_rs_product<128>(smem, ah, al, sink);
    if (prod == 7) c = timed_rs_product_distinct(a, threadIdx.x * 64 + it, sink);
    if (prod == 8) c = timed_two_chains(smem, threadIdx.x * 64 + it, sink);
    if (it >= kWarm) total += c;
    __syncthreads();
  }
  if (blockIdx.x == 0 && threadIdx.x % 128 == 0) out[wg] = prod ? total / kIters : -1;
  if (sink != 0.f) *sink_out = sink;  // keeps the products
#else
  (void)mode, (void)out, (void)sink_out;
#endif
}

/// The two-chain product of the transposed scan in a kernel of one warpgroup (no spills), its
/// register A fragments made three ways: fixed before the timed window (variant 0); split (hi +
/// lo) inside it from a state that stays fixed (1); split inside it from a state updated from
/// the last product's accumulators, as the scan's are (2); (2) with a second, idle warpgroup in
/// the block (3); (2) with 164 KB of dynamic shared memory, as the transposed scan has (4); (2)
/// after an untimed batch whose B is MN-major, as the scan's update (5), or K-major (6); (2) on B
/// tiles written by a bulk copy waited for on an mbarrier just before (7), or on two stages, the
/// next one's copy landing during the product (8), as the scan's stages are.
__global__ void __launch_bounds__(256, 1)
    dependent_kernel(int variant, const char* gsrc, long long* out, float* sink_out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem[];
  for (int i = threadIdx.x; i < 32 * 1024 / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3f803f80u | ((i * 2654435761u) & 0x007f007fu);
  // Variants 7 and 8: two 32 KB stages filled by bulk copies from gsrc, completing on an mbarrier
  // each.
  auto* full = reinterpret_cast<uint64_t*>(smem + 64 * 1024);
  const bool copies = variant >= 7;
  if (copies && threadIdx.x == 0) {
    mbar_init(&full[0], 1);
    mbar_init(&full[1], 1);
  }
  auto copy_in = [&](int st) {
    mbar_expect_tx(&full[st], 32 * 1024);
    bulk_load(smem + st * 32 * 1024, gsrc + st * 32 * 1024, 32 * 1024, &full[st]);
  };
  fence_proxy_async_shared();
  __syncthreads();
  if (variant == 8 && threadIdx.x == 0) copy_in(0);
  float s[64], sink = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = 1.f + (threadIdx.x + i) * 1e-3f;
  uint32_t ah[8][4], al[8][4];
  draw_fragments(threadIdx.x, ah, al);
  long long total = 0;
  for (int it = 0; it < kWarm + kIters; ++it) {
    if (threadIdx.x >= 128) {  // a second warpgroup, waiting at the barrier (variant 3)
      __syncthreads();
      continue;
    }
    float dk[32], dq[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dk[i] = dq[i] = 0.f;
    if (variant >= 5) {  // the scan's update before the product (untimed): B MN-major or K-major
      wgmma_reg_fence(dk);
      wgmma_fence();
      const uint64_t kd = wgmma_desc_sw128(smem);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int part = 0; part < 2; ++part) {
          if (variant == 5)
            wgmma_rs_bf16<1>(dk, part ? al[ks] : ah[ks], wgmma_desc_advance(kd, ks * 2048));
          else
            wgmma_rs_bf16<0>(dk, part ? al[ks] : ah[ks], wgmma_desc_advance(kd, ks * 32));
        }
      wgmma_commit();
      wgmma_wait_all();
      wgmma_reg_fence(dk);
#pragma unroll
      for (int i = 0; i < 32; ++i) sink += dk[i], dk[i] = 0.f;
    }
    // 7: this iteration's copy into stage 0, waited for, then the product; 8: the product on
    // stage it % 2 while the next iteration's copy lands in the other (the scan's order).
    int st = 0;
    if (variant == 7) {
      if (threadIdx.x == 0) copy_in(0);
      mbar_wait(&full[0], unsigned(it) & 1u);
    } else if (variant == 8) {
      st = it & 1;
      mbar_wait(&full[st], unsigned(it >> 1) & 1u);
      if (threadIdx.x == 0) copy_in(st ^ 1);
    }
    const long long t0 = clock64();
    if (variant > 0)
#pragma unroll
      for (int ks = 0; ks < 8; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          split_bf16x2(s[8 * ks + 2 * r], s[8 * ks + 2 * r + 1], ah[ks][r], al[ks][r]);
    wgmma_reg_fence(dk);
    wgmma_reg_fence(dq);
    wgmma_fence();
    issue_two_chains(dk, dq, ah, al, smem + st * 32 * 1024);
    wgmma_reg_fence(dq);
    const long long c = end_product(dk, t0, sink);
    if (variant >= 2)
#pragma unroll
      for (int i = 0; i < 32; ++i)
        s[i] = fmaf(1e-3f, dk[i], 1.f), s[32 + i] = fmaf(1e-3f, dq[i], 1.f);
#pragma unroll
    for (int i = 0; i < 32; ++i) sink += dq[i];
    if (it >= kWarm) total += c;
    __syncthreads();
  }
  if (variant == 8) mbar_wait(&full[(kWarm + kIters) & 1], unsigned((kWarm + kIters) >> 1) & 1u);
  if (threadIdx.x == 0) out[0] = total / kIters;
  if (sink != 0.f) *sink_out = sink;
#else
  (void)variant, (void)out, (void)sink_out;
#endif
}

}  // namespace

int main() {
  const int dev = sm90_device_or_explain("kla_wgmma_latency");
  if (dev < 0) return 0;
  const char* names[] = {"step A (m64n16k16 x 8), one warpgroup",
                         "m64n32k16 x 8 (step A at VS = 32, Q S at VS = 16), one warpgroup",
                         "step C (m64n32k16 x 4, K^T from shared), one warpgroup",
                         "step A on two warpgroups at once",
                         "step A on two warpgroups + Q S (n32 x 8) on a third",
                         "step C on two warpgroups at once",
                         "step A on mma.sync (8 k-steps x 4 tiles a warp), one warpgroup",
                         "step A on mma.sync, two warpgroups",
                         "S^T K^T, 64 columns (A hi + lo in registers, m64n64k16 x 16), one wg",
                         "S^T K^T, 64 columns, two warpgroups",
                         "S^T K^T, 64 columns, one wg, random operands",
                         "S^T K^T, 64 columns, two warpgroups, random operands",
                         "S^T [K^T | Q^T] (m64n128k16 x 16), one wg, random operands",
                         "the same on every multiprocessor at once (block 0's cycles)",
                         "S^T K^T, 64 columns, one wg, random, own fragments a k-step",
                         "(K S)^T and (Q S)^T as two chains in turn (32 x m64n64k16), one wg",
                         "the same, operands with random signs and exponents",
                         "the same after 1,000 cycles without tensor work",
                         "the same after 3,000 cycles without tensor work"};
  long long* out;
  float* sink;
  cudaMalloc(&out, 4 * sizeof(long long));
  cudaMalloc(&sink, sizeof(float));
  cudaFuncSetAttribute(latency_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024);
  for (int mode = 0; mode < int(std::size(names)); ++mode) {
    int sms = 1;
    if (mode == 13) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    latency_kernel<<<sms, 384, 96 * 1024>>>(mode, out, sink);
    long long h[4] = {};
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(h, out, 3 * sizeof(long long), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
      std::printf("mode %d: %s\n", mode, cudaGetErrorString(e));
      return 1;
    }
    std::printf("%-66s cycles a product, warpgroups 0/1/2: %lld / %lld / %lld\n", names[mode], h[0],
                h[1], h[2]);
  }
  const char* dep_names[] = {"two chains, one-warpgroup kernel, fragments fixed",
                             "the same, fragments split in the window from a fixed state",
                             "the same, split from the last product's accumulators",
                             "the same, a second warpgroup waiting at the barrier",
                             "the same (one warpgroup), 164 KB of dynamic shared memory",
                             "(2) after an untimed batch with MN-major B (the update)",
                             "(2) after an untimed batch with K-major B",
                             "(2) on a tile a bulk copy just wrote (mbarrier)",
                             "(2) on two stages, the next one's copy landing meanwhile"};
  cudaFuncSetAttribute(dependent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 164 * 1024);
  char* gsrc = nullptr;
  cudaMalloc(&gsrc, 64 * 1024);
  cudaMemset(gsrc, 0x3f, 64 * 1024);
  for (int v = 0; v < 9; ++v) {
    dependent_kernel<<<1, v == 3 ? 256 : 128, (v == 4 ? 164 * 1024 : 64 * 1024 + 16)>>>(v, gsrc,
                                                                                        out, sink);
    long long h = 0;
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&h, out, sizeof(long long), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
      std::printf("%s: %s\n", dep_names[v], cudaGetErrorString(e));
      return 1;
    }
    std::printf("%-66s cycles a product: %lld\n", dep_names[v], h);
  }
  return 0;
}
