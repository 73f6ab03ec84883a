// The backward's workspace record and shared-memory sizes, shared by the host (validation,
// kla_backward_workspace_size) and the kernels. Plain C++.
//
// One record per (chunk slot, value head) (chunk slots as the forward's, chunk_geometry.hpp), all
// fp32, row-major, C = 64 rows per chunk (rows past the sequence's end zero):
//   kh, qh [C][K]  the chunk's keys k^ = kscale k and queries q^ = qscale q (read-out scale in);
//                  v^ = vscale v is not kept: its readers scale the raw row
//   w      [C][K]  W = A^-1 diag(beta e^G) K^            (A = I + L, the chunk system)
//   u      [C][V]  U0 = A^-1 diag(beta) V^, then U = U0 - W S (the state scan)
//   du     [C][V]  X = M^T dY (the prep), then dU = X + K_G dS_out (the state-gradient scan), then
//                  dR = A^-T dU (bwd_chunk_grads_kernel; the bf16 kernels keep X and dR on chip)
//   ainv   [C][C]  A^-1 (lower)
//   sc     [16][C] per-token scalars (BwdScalar rows)
//   s, ds  [K][V]  the chunk's incoming state S; Y = Q^^T diag(e^G) dY (the prep), then the
//                  gradient of the chunk's outgoing state (the bf16 kernels: below)
//   dq, dk [C][K]  per value head dq, dk (summed over the group afterwards), or (bf16 kernel) a
//                  running sum of dq^, dk^ over the group, in its first value head's record
// Where the bf16 kernels run (bwd_runs_bf16_input_grads), S, U, dS, dU and A^-1 also go to the
// record as bf16, for the input-gradient kernel alone (BwdRecord::b_*, below); k^, q^ and W in
// fp32 are not written (the kernels after the prep scale the raw keys and queries themselves):
// their slots hold W split into two bf16 parts and the raw keys for the two scans, U0 is kept by
// value slice, and neither X nor Y is formed: the du slot holds M's two bf16 parts and the ds slot
// the raw queries and dY, from which the state-gradient scan forms X and Y (bwd_bf16_record_fits,
// below).
#pragma once

#include <cstdint>

#include "layout/chunk_geometry.hpp"

namespace kla::layout {

/// Largest head dims of the backward (its per-chunk kernel keeps three [C][K] accumulators and a
/// [C][K] key tile in shared memory).
constexpr int kBwdMaxHeadDim = 128;
/// Threads of every backward kernel; value columns per state-scan block; V panel of the
/// per-chunk kernels.
// Threads a block: the two scans and the key-head sums run 8 warps; the fully parallel kernels
// (prep, input gradients) 16 (kBwdChunkThreads): one such block fills a
// multiprocessor's shared memory, and 16 warps hide the latency of its loads and products that 8
// left exposed (docs/prefill_notes.md, backward v7). The sum of dS o S in the input-gradient kernel
// keeps kBwdCarryParts fixed parts, so its order does not depend on the block's size.
constexpr int kBwdThreads = 256, kBwdChunkThreads = 512, kBwdCarryParts = 256, kBwdPanel = 32;
/// Value columns per state-scan block: 32 (one wave of blocks where N HV V / 32 fits the device),
/// 16 where V is not a multiple of 32.
constexpr int bwd_scan_slice(int V) {
  return V % 32 == 0 ? 32 : 16;
}

/// The head dims a backward kernel runs at: kHD = K = V compiled in (its loop bounds, pitches
/// and record offsets become constants, which removes much of the address arithmetic the
/// kernels issue), or the call's p.K, p.V where kHD = 0. kBwdCompiledHeadDim has kernels of its
/// own (bwd/backward_<dtype>_k128.cu); every other shape runs the kHD = 0 kernels.
constexpr int kBwdCompiledHeadDim = 128;
template <int kHD>
constexpr int bwd_head_dim(int runtime) {
  return kHD != 0 ? kHD : runtime;
}

/// Rows of the record's per-token scalars.
enum BwdScalar : int {
  kScKscale = 0,  // k^ = kscale k (0 for a degenerate key)
  kScVscale,      // v^ = vscale v; also the Kaczmarz normalisation 1 / sqrt(|k1|^2 + eps)
  kScKnorm,       // qk l2-norm factor of the key (1 otherwise): k1 = knorm k
  kScQnorm,       // q l2-norm factor (1 / |q|, 1 / sqrt(|q|^2 + 1e-6), or 1)
  kScQscale,      // q^ = qscale q (read-out scale included)
  kScBeta,        // beta (0 past the end and for degenerate keys)
  kScG,           // inclusive cumulative log decay G_i
  kScChunk,       // [0] = gamma_C = e^{G_{C-1}}; [kChunkBound..] the chunk's bounds, below
  kBwdScalarRows = 16
};

/// Entries of the kScChunk row past gamma_C, for the segmented state-gradient chain
/// (bwd/bwd_state_grad_segments.cuh), bf16 prep only. The prep's two spare warps write, per warp w
/// of its 32 tokens each: kChunkBound + w, the sum of |q^_i| |dy_i| (the norm of the outputs'
/// rank-one gradients q^_i dy_i^T that enter the chunk's state gradient); kChunkBound + 2 + w and
/// kChunkBound + 4 + w, the largest and smallest beta_i |k^_i|^2 (the token maps I - beta k^ k^^T
/// are contractions where it lies in [0, 2]). The window kernel writes, in the record of each
/// segment's first chunk, kChunkWindow: the chunk where that segment's chain starts (as an int),
/// and in the record of chunk 0, kChunkCertified: 1 where every segment of the head has a
/// certified window (bwd_chain_windows_kernel).
constexpr int kChunkBound = 1, kChunkWindow = 8, kChunkCertified = 9;

/// Float offsets of one backward record, and (b_*) the bf16 element offsets of its bf16 tiles.
struct BwdRecord {
  int64_t kh, qh, w, u, du, ainv, sc, s, ds, dq, dk, floats;
  int64_t b_s, b_u, b_ds, b_du, b_ainv, b_wh, b_wl, b_kr, b_qr, b_do, b_mh, b_ml;
  constexpr BwdRecord(int64_t K, int64_t V)
      : kh(0),
        qh(kh + kChunk * K),
        w(qh + kChunk * K),
        u(w + kChunk * K),
        du(u + kChunk * V),
        ainv(du + kChunk * V),
        sc(ainv + kChunk * kChunk),
        s(sc + kBwdScalarRows * kChunk),
        ds(s + K * V),
        dq(ds + K * V),
        dk(dq + kChunk * K),
        floats(dk + kChunk * K),
        b_s(2 * s),
        b_u(b_s + K * V),
        b_ds(2 * dq),
        b_du(2 * dk),
        b_ainv(b_du + kChunk * V),
        b_wh(2 * kh),
        b_wl(b_wh + kChunk * (K + 8)),
        b_kr(b_wl + kChunk * (K + 8)),
        b_qr(2 * ds),
        b_do(b_qr + kChunk * (K + 8)),
        b_mh(2 * du),
        b_ml(b_mh + kChunk * (kChunk + 8)) {}
};
/// Where the bf16 input-gradient kernel runs (bwd_runs_bf16_input_grads), the record holds S, U,
/// dS, dU and A^-1 as bf16 (rounded to nearest; row pitch K, V or C elements) for it alone, in
/// slots no other block reads meanwhile: S and U in the s slot; dS in the dq slot; dU and A^-1 in
/// the dk slot (dq and dk are written only at that kernel's end, after its own reads). For its
/// two scans (bwd/bwd_state_forward_bf16.cuh, bwd/bwd_state_backward_bf16.cuh), which copy each
/// chunk's tiles in by a few bulk copies (one a tile), the prep lays out what they read as their
/// shared memory holds it:
///   - in the kh and qh slots, which that configuration leaves free: W split into bf16 hi + lo
///     (bwd/bwd_warp_tile_bf16.cuh split_bf16x2) and the chunk's raw keys (zero rows past the
///     sequence's end), each [C][K + 8] bf16 (the 8 padding elements a row zero);
///   - U0 (fp32, in the u slot) by value slice (bwd_sliced_index);
///   - for the state-gradient scan to form X = M^T dY and Y = Q^T diag(qs e^G) dY (the prep forms
///     neither): in the du slot M's two parts, M = (Q^K^^T) o Gamma split hi + lo, each [C][C + 8]
///     bf16 (b_mh, b_ml; the padding zero); in the ds slot, in the key head's first value head's
///     record, the chunk's raw queries [C][K + 8] bf16 as the raw keys (b_qr), and in every value
///     head's record the raw dY by value slice (b_do: slice s [C][VS + 8] bf16 whole, the padding
///     zero).
/// Value columns of a slice of the bf16 scans (one block each), and the bf16 pitch of their
/// [rows][slice] tiles (rows 16 bytes apart mod 128: conflict-free ldmatrix).
constexpr int kBwdBf16Slice = 32, kBwdBf16SlicePitch = kBwdBf16Slice + 8;
/// Whether the tiles fit their slots:
constexpr bool bwd_bf16_record_fits(int64_t K, int64_t V) {
  return K * V + kChunk * V <= 2 * K * V && K * V <= 2 * kChunk * K &&
         kChunk * V + kChunk * kChunk <= 2 * kChunk * K && 3 * kChunk * (K + 8) <= 4 * kChunk * K &&
         2 * kChunk * (kChunk + 8) <= 2 * kChunk * V && V % kBwdBf16Slice == 0 &&
         kChunk * (K + 8) + (V / kBwdBf16Slice) * kChunk * kBwdBf16SlicePitch <= 2 * K * V;
}
/// Where element (r, c) of a [rows][V] fp32 tile the bf16 scans read by value slice (U0)
/// is kept: slice c / 32 whole ([rows][32], one bulk copy), its columns permuted within each row
/// by c ^ 8 (r mod 4), so that a half warp's pair reads in the scans (rows i + g, g < 4, columns
/// c + 2t, t < 4, c a multiple of 8) fall on 32 distinct banks without padding. Pairs and aligned
/// fours of columns stay together.
constexpr int bwd_sliced_index(int rows, int r, int c) {
  return (c / kBwdBf16Slice) * rows * kBwdBf16Slice + r * kBwdBf16Slice +
         ((c % kBwdBf16Slice) ^ ((r & 3) << 3));
}

/// Shared-memory row pitch (floats) of a matrix `width` wide: rows 16-byte aligned, offset by 4
/// banks from row to row.
constexpr int bwd_pitch(int width) {
  return width + 4;
}

/// Dynamic shared memory (bytes) of each backward kernel at head dims K, V.
constexpr int64_t bwd_prep_smem(int K, int V) {
  // K^, Q^, V^, dY, two [C][C], the scalars, the inverse's scratch
  return 4 * (2 * kChunk * bwd_pitch(K) + 2 * kChunk * bwd_pitch(V) +
              2 * kChunk * bwd_pitch(kChunk) + 10 * kChunk + kInvScratch);
}
/// Floats of one copy stage of a state scan: W and k^ [C][pitch K], then the forward's U0 slice
/// [C][VS + 4] or the backward's X [C][VS + 4] and Y [K][VS + 4] slices, then G [C].
constexpr int64_t bwd_scan_stage_floats(int K, int VS, bool backward) {
  return 2 * kChunk * bwd_pitch(K) + kChunk * bwd_pitch(VS) +
         (backward ? int64_t(K) * bwd_pitch(VS) : 0) + kChunk;
}
constexpr int64_t bwd_scan_smem(int K, int VS) {
  // two stages of the backward scan (the larger), then dS [K][VS + 4] and dU [C][VS + 4]
  return 4 * (2 * bwd_scan_stage_floats(K, VS, true) + int64_t(K) * bwd_pitch(VS) +
              kChunk * bwd_pitch(VS));
}
constexpr int64_t bwd_grads_smem(int K) {
  const int64_t acc = 3 * kChunk * bwd_pitch(K);        // dY S^T, U dS^T, dR S^T
  const int64_t mats = 3 * kChunk * bwd_pitch(kChunk);  // A^-1 (then Q^K^^T, K^K^^T), Pm, Z
  // the S and dS panels ([K][VP]), the dU, U, dY, dR panels; then K^, Q^
  const int64_t panels = 2 * int64_t(K) * bwd_pitch(kBwdPanel) + 4 * kChunk * bwd_pitch(kBwdPanel);
  const int64_t tiles = 2 * kChunk * bwd_pitch(K);
  return 4 * (acc + mats + (tiles > panels ? tiles : panels) + 8 * kChunk + kBwdCarryParts);
}

/// The two copy groups' mbarriers at the end of each bf16 scan's shared memory.
constexpr int64_t kBwdBf16ScanBarrierBytes = 16;
/// The bf16 state scan's shared memory (bytes), K = V = kBwdCompiledHeadDim, VS = 32
/// (bwd/bwd_state_forward_bf16.cuh): one copy stage of W hi, lo and the raw keys [C][K + 8] bf16,
/// the U0 slice [C][VS] fp32 (bwd_sliced_index), G and kscale [C]; then S hi, lo [K][VS + 8] and
/// the scaled U hi, lo [C][VS + 8] bf16; the barriers.
constexpr int64_t bwd_state_forward_bf16_smem() {
  constexpr int64_t K = kBwdCompiledHeadDim, C = kChunk, VS = kBwdBf16Slice;
  return 2 * (3 * C * (K + 8) + 2 * K * (VS + 8) + 2 * C * (VS + 8)) + 4 * (C * VS + 2 * C) +
         kBwdBf16ScanBarrierBytes;
}
/// The bf16 state-gradient scan's shared memory (bytes), K = V = kBwdCompiledHeadDim, VS = 32
/// (bwd/bwd_state_backward_bf16.cuh): one copy stage of the raw keys and queries and W hi, lo
/// [C][K + 8] bf16, M hi, lo [C][C + 8] bf16, the raw dY slice [C][VS + 8] bf16, G, kscale and
/// qscale [C]; then dS hi, lo [K][VS + 8], dU hi, lo and the scaled dY's hi, lo [C][VS + 8] bf16;
/// the barriers.
constexpr int64_t bwd_state_backward_bf16_smem() {
  constexpr int64_t K = kBwdCompiledHeadDim, C = kChunk, VS = kBwdBf16Slice;
  return 2 * (4 * C * (K + 8) + 2 * C * (C + 8) + C * (VS + 8) + 2 * K * (VS + 8) +
              4 * C * (VS + 8)) +
         4 * (3 * C) + kBwdBf16ScanBarrierBytes;
}
/// The two bf16 scans run side by side (bwd/bwd_launch.cuh: the state-gradient scan launched
/// programmatically after the state scan, which it does not read): a block of each fits one
/// multiprocessor, in shared memory (kSm90SmemPerMultiprocessor, each block reserving its share)
/// and in registers (each kernel capped, __maxnreg__, so that 256 threads of each fit the 64 K of
/// the register file).
constexpr int kBwdStateForwardBf16Regs = 104, kBwdStateBackwardBf16Regs = 152;
static_assert((kBwdStateForwardBf16Regs + kBwdStateBackwardBf16Regs) * kBwdThreads <= 65536,
              "a block of each bf16 scan in one register file");
constexpr bool bwd_scans_share_multiprocessors = bwd_state_forward_bf16_smem() +
                                                     bwd_state_backward_bf16_smem() +
                                                     2 * kSm90SmemReservedPerBlock <=
                                                 kSm90SmemPerMultiprocessor;
static_assert(bwd_scans_share_multiprocessors, "a block of each bf16 scan on one multiprocessor");
/// Whether the input gradients run bwd/bwd_input_grads_bf16.cuh (bf16 operands) instead of
/// bwd/bwd_chunk_grads.cuh: arithmetic FAST, bf16 storage, K = V = kBwdCompiledHeadDim. The prep
/// and the scans then write the record's bf16 tiles (BwdRecord::b_*).
constexpr bool bwd_runs_bf16_input_grads(bool fast, bool bf16, int K, int V) {
  return fast && bf16 && K == kBwdCompiledHeadDim && V == kBwdCompiledHeadDim;
}
static_assert(bwd_bf16_record_fits(kBwdCompiledHeadDim, kBwdCompiledHeadDim));
/// The segmented state-gradient chain (bwd/bwd_state_grad_segments.cuh; sm_90a, bf16 FAST, K = V
/// = kBwdCompiledHeadDim, saved states): 256 threads (two warpgroups, each 64 value columns of dS
/// in registers), one block a multiprocessor. Shared memory: the chunk's raw K and Q, W hi, lo
/// [C][K], M hi, lo [C][C], the raw dY [C][V], all bf16 in 128-byte-swizzled 64-column panels; dS
/// hi, lo [K][V], -dU hi, lo and D hi, lo [C][V] bf16; G, kscale, qscale [C] fp32.
constexpr int kBwdChainThreads = 256;
constexpr int64_t bwd_chain_smem() {
  constexpr int64_t K = kBwdCompiledHeadDim, V = kBwdCompiledHeadDim, C = kChunk;
  return 2 * (4 * C * K + 2 * C * C + C * V + 2 * K * V + 4 * C * V) + 4 * 3 * C;
}
static_assert(bwd_chain_smem() + kSm90SmemReservedPerBlock <= kSm90SmemPerMultiprocessor,
              "the segmented chain's block fits a multiprocessor");
/// The chain's segments: chunks a block owns, a power of two from kBwdChainMinSegment to
/// kBwdChainMaxSegment, from a model of the chain's time in chunk steps of one block a
/// multiprocessor: max(the steps of all blocks over `sms`, the longest block's), a block's steps
/// its own chunks plus kBwdChainWarmupGuess of warm-up unless its segment ends its sequence (the
/// window kernel finds the real windows; 8 is about what a trained model's gates need). `chunks`:
/// each of the n sequences' chunk counts. The longest segment within kBwdChainSlackPercent of the
/// best modelled time is taken: measured on an H200 (docs/prefill_notes.md, round 2 session 44),
/// longer segments ran faster than the model says where it ranks them close.
constexpr int kBwdChainMinSegment = 8, kBwdChainMaxSegment = 128, kBwdChainWarmupGuess = 8,
              kBwdChainSlackPercent = 5;
constexpr int64_t bwd_chain_steps(const int64_t* chunks, int64_t n, int64_t heads_v, int64_t sms,
                                  int seg) {
  int64_t total = 0, longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = chunks[i], segs = (c + seg - 1) / seg;
    total += c + (segs > 1 ? (segs - 1) * kBwdChainWarmupGuess : 0);
    const int64_t first = c < seg ? c : seg + (segs > 1 ? kBwdChainWarmupGuess : 0);
    longest = first > longest ? first : longest;
  }
  total *= heads_v;
  const int64_t per_sm = sms > 0 ? (total + sms - 1) / sms : total;
  return per_sm > longest ? per_sm : longest;
}
constexpr int bwd_chain_segment(const int64_t* chunks, int64_t n, int64_t heads_v, int64_t sms) {
  int64_t best = -1;
  for (int seg = kBwdChainMinSegment; seg <= kBwdChainMaxSegment; seg *= 2) {
    const int64_t t = bwd_chain_steps(chunks, n, heads_v, sms, seg);
    best = best < 0 || t < best ? t : best;
  }
  int pick = kBwdChainMinSegment;
  for (int seg = kBwdChainMinSegment; seg <= kBwdChainMaxSegment; seg *= 2)
    if (bwd_chain_steps(chunks, n, heads_v, sms, seg) * 100 <= best * (100 + kBwdChainSlackPercent))
      pick = seg;
  return pick;
}
namespace detail {
constexpr int64_t kChain32768[1] = {512}, kChain8192[1] = {128};
}
static_assert(bwd_chain_segment(detail::kChain32768, 1, 32, 132) == 128 &&
                  bwd_chain_segment(detail::kChain8192, 1, 32, 132) == 32,
              "issue 25's rows (H 16, HV 32) on 132 multiprocessors: the segments measured best");

/// The bf16 prep (bwd/bwd_prep_bf16.cuh): threads a block, and blocks a multiprocessor (its
/// __launch_bounds__) without and with saved states (kla_chunk_backward_saved), which the shared
/// memory below lets fit (kSm90SmemPerMultiprocessor).
constexpr int kBwdPrepBf16Threads = 256, kBwdPrepBf16Blocks[2] = {2, 3};
/// Its shared memory (bytes), K = V = kBwdCompiledHeadDim: the raw K and Q [C][K + 8] bf16 (L
/// [C][C + 4] fp32 in Q's place), the inverse's scratch, A^-1 [C][C + 4] fp32, the scalars [11][C];
/// but where the forward saved S and U (`saved`), the raw V [C][K + 8] and A^-1 diag(beta vs)'s two
/// parts [C][C + 8] bf16.
constexpr int64_t bwd_prep_bf16_smem(bool saved) {
  constexpr int64_t K = kBwdCompiledHeadDim, C = kChunk;
  return 2 * 2 * C * (K + 8) + 4 * (C * bwd_pitch(C) + kInvScratch + 11 * C) +
         (saved ? 0 : 2 * (C * (K + 8) + 2 * C * (C + 8)));
}
static_assert(kBwdPrepBf16Blocks[0] * (bwd_prep_bf16_smem(false) + kSm90SmemReservedPerBlock) <=
                      kSm90SmemPerMultiprocessor &&
                  kBwdPrepBf16Blocks[1] * (bwd_prep_bf16_smem(true) + kSm90SmemReservedPerBlock) <=
                      kSm90SmemPerMultiprocessor,
              "the bf16 prep's blocks a multiprocessor");
/// The saved backward's prep beside its state-gradient scan (bwd/bwd_prep_beside_scan.cuh). Where
/// the forward saved S and U (kla_chunk_backward_saved) and the scan's blocks are one wave (one a
/// multiprocessor: N HV V / kBwdBf16Slice of them on `sms`), the prep runs as a resident grid of
/// kBwdPrepBf16Blocks[1] blocks a multiprocessor taking the (chunk, value head) items in the order
/// the scan reads them, the scan launched programmatically beside it, waiting for each chunk's
/// records by their ready flags. Until `first` items are taken every prep block works; then all
/// but one a multiprocessor leave, the scan's blocks take their place, and the one left feeds the
/// scan (docs/prefill_notes.md, round 2 session 39: the schedule and its model). Elsewhere
/// (several waves of scan blocks: a wave would wait for the prep of its sequences at one block a
/// multiprocessor) the prep runs before the scan, as a grid of its own.
/// (max_chunks: of the longest sequence; the items, max_chunks N HV, are counted in int.)
/// The bf16 state-gradient scan's blocks: one a (sequence, value head, kBwdBf16Slice columns).
constexpr int64_t bwd_bf16_scan_blocks(int64_t N, int64_t HV, int64_t V) {
  return N * HV * (V / kBwdBf16Slice);
}
constexpr bool bwd_saved_prep_beside_scan(bool saved, bool bf16_grads, bool programmatic,
                                          int64_t max_chunks, int64_t N, int64_t HV, int64_t V,
                                          int64_t sms) {
  return saved && bf16_grads && programmatic && sms > 0 && max_chunks > 0 &&
         bwd_bf16_scan_blocks(N, HV, V) <= sms && max_chunks * N * HV <= (int64_t(1) << 30);
}
/// Items (chunk steps x sequences x value heads) that every block of the prep beside the scan
/// works on before all but one a multiprocessor leave: kBwdBesideFirstPermille of them. The
/// balance point, where the scan, started when the two leave, ends just after the one block left
/// makes the last item: measured on an H100 at 350, 500 and 650 (docs/prefill_notes.md, round 2
/// session 40: 350 the fastest at 1x32768, the three within 1% at 1x8192).
constexpr int kBwdBesideFirstPermille = 350;
constexpr int64_t bwd_beside_first_items(int64_t items) {
  return items * kBwdBesideFirstPermille / 1000;
}
/// Item i (< max_chunks N HV) of the prep beside the scan, in the order the scan reads the records:
/// step s = i / (N HV) from each sequence's last chunk (chunk nch_n - 1 - s of sequence n, nch_n
/// its chunks; no tile once s >= nch_n), then sequence n, then value head hv.
struct BwdBesideItem {
  int step, n, hv;
};
constexpr BwdBesideItem bwd_beside_item(int i, int N, int HV) {
  return {i / (N * HV), (i % (N * HV)) / HV, (i % (N * HV)) % HV};
}
/// Where the prep beside the scan keeps its ready flags and schedule, in the record's u slot (U0's,
/// which a saved backward's prep does not form, and which nothing reads in that configuration):
/// each record's first kBwdReadyFlagBytes bytes (its flag the first int, set to 1 once the
/// record's tiles are written), and after record 0's flag the schedule's counters (two item
/// counters, then one arrival counter a multiprocessor, at most kBwdBesideMaxSms); the host zeroes
/// both (two memsets on the call's stream) before the prep starts.
constexpr int64_t kBwdReadyFlagBytes = 16;
constexpr int kBwdBesideMaxSms = 1024;
constexpr int64_t kBwdBesideCounterBytes = 4 * (2 + kBwdBesideMaxSms);
static_assert(kBwdReadyFlagBytes + kBwdBesideCounterBytes <= 4 * kChunk * kBwdCompiledHeadDim,
              "the flags and counters fit record 0's u slot");
/// Chunks a block of the bf16 input gradients (bwd/bwd_input_grads_bf16.cuh;
/// BwdParams::grads_chunks) takes in turn, a key head's: while a chunk's last value head is worked
/// on, the next chunk's first tiles are copied in, which a block of one chunk waits for at its
/// start. As many as leave at least kBwdBlockMinWaves blocks a multiprocessor (max_chunks chunks
/// of the longest sequence, `heads` key heads, n sequences, sms multiprocessors; the kernel one
/// block a multiprocessor), at most kBwdBlockMaxChunks, at least 1.
constexpr int kBwdBlockMaxChunks = 4, kBwdBlockMinWaves = 4;
constexpr int bwd_block_chunks(int64_t max_chunks, int64_t heads, int64_t n, int64_t sms) {
  int c = kBwdBlockMaxChunks;
  while (c > 1 && ((max_chunks + c - 1) / c) * heads * n < kBwdBlockMinWaves * sms) c /= 2;
  return c;
}
/// Its shared memory (bytes), K = V = kBwdCompiledHeadDim: two regions of four [C][K + 8] and two
/// [K][K + 8] bf16 tiles, A^-1, the raw K and Q rows, Pm and Z each scaled by column and by row,
/// in bf16, the parts of the [C][C] sums, the scalars, the row terms' partial sums, the carried
/// sum's parts (one a warp), the earlier value heads' share of t1 and the parts of v^ . dR.
constexpr int64_t bwd_input_grads_bf16_smem() {
  constexpr int64_t K = kBwdCompiledHeadDim, C = kChunk;
  return 2 * (4 * C * (K + 8) + 2 * K * (K + 8) + 5 * C * (C + 8) + 2 * C * (K + 8)) +
         4 * (2 * C * 2 + 2 * C * 4 + 10 * C + 4 * C * 4 + kBwdChunkThreads / 32);
}
static_assert(bwd_input_grads_bf16_smem() + kSm90SmemReservedPerBlock <= kSm90SmemPerMultiprocessor,
              "the bf16 input gradients' block fits a multiprocessor");

}  // namespace kla::layout
