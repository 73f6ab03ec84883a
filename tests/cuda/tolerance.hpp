// The GPU tests' tolerances, derived per path from its arithmetic (docs/accuracy.md, 'Per-path
// tolerances', has the table of these bounds beside the measured worst).
//
// Notation: u32 = 2^-24 (fp32); u_d the unit roundoff of the call's dtype (fp32 2^-24, bf16 2^-8,
// fp16 2^-11); one rounding to nearest of a value x errs by at most u|x|, and by u|x|/sqrt(3) in
// RMS when the error is uniform over its interval. A split x = hi + lo into two parts of p
// significant bits each errs by at most 2^-2p |x| (hi by 2^-p |x|, lo by 2^-p of that), and by
// 2^-2p |x| / 3 in RMS (the product of two uniform errors).
//
// Model of a path's state error. The state is fp32 throughout. At each hand-off (every token on the
// tokenwise kernel, every chunk of C tokens on the chunkwise paths) m products carry the state
// forward (the decode: the decay, S^T k, the residual and the rank-1 update; a chunk: K S, the
// chunk system's inverse, T R and K^T X; arithmetic FAST adds the rounded K and Q: m = 6). Each
// takes rounded operands (RMS r_op, the path's split) and a sum of n terms (RMS r_acc): in fp32 FMA
// (tokenwise, generic) a random walk, r_acc = u32 sqrt(n / 3) (the decode's S^T k enters the state
// scaled by beta |k|^2 <= 1 and counts as one rounding, u32 / sqrt(3)); on the tensor cores, whose
// fp32 accumulation truncates once per k-step of k = 8 (TF32) or 16 (bf16 / fp16) products,
// r_acc = u32 sqrt(ceil(n / k)), n = max(K, C). The chunkwise paths also sum the log decays in fp32
// (a log2 C-level scan) into G of magnitude about C g_max / 4 over a chunk: every decay factor
// exp(G_i - G_j) errs by r_G = u32 (C g_max / 4) sqrt(log2 C). The injections are independent, so
// they add in RMS over the hand-offs the state remembers: with no decay all of them (n_h =
// ceil(T / C) for the longest sequence); with per-token log decays g uniform in [-g_max, 0] an
// error is forgotten after about M = 2 / g_max tokens, so n_h = min(ceil(T / C), 1 + ceil(M / C)).
// No credit is taken for the projection's contraction (Proposition 2: each token removes the
// error's component along its key), which the generators cannot guarantee (tiny keys at eps > 0 do
// not contract). Hence
//   sigma = sqrt(n_h) (sqrt(m) (r_op + r_acc) + r_G),   state rel-RMS <= 2 sigma,
// the factor 2 for the spread of an RMS over few elements. Elementwise: |S - ref| <= 6 sigma
// max(peak, |ref|) (a six-sigma tail of independent errors), peak the largest RMS the element's
// head (one sequence and value head) took over the sequence, decayed to the end as the state is
// (harness.hpp, magnitudes): the hand-offs sum terms that size. The final RMS alone is too small a
// scale where later tokens cancel most of an earlier state: tiny keys at eps = 0 store v / |k|
// along k, a later key along them removes it (measured: fp32 on the TF32 path, K = 16, 60 tokens,
// key norms 1e-4 to 1e2, one element at 1.71 times the final-RMS allowance, 0.71 times this one;
// the generic FMA path on the same inputs 0.66 and 0.34).
//
// Outputs. o is the path's unrounded fp32 result o^ rounded once to the dtype. o^ is a read-out of
// the state, sum_i S_t[i, j] q_t[i] times the scale, whose terms err independently by sigma: it
// errs by sigma times m = |scale| (sum_i S_t[i, j]^2 q_t[i]^2)^(1/2) (harness.hpp,
// readout_magnitudes: double, on the same inputs), which cancellation can make far larger than
// |o^|. For any value y representable in
// the dtype, |o - o^| <= |y - o^| (o is the nearest), so |o - ref| <= |y - ref| + 2 |o^ - ref|.
// With y = the reference rounded to the dtype (computed from the reference alone):
//   o rel-RMS <= ||y - ref|| / ||ref|| + 2 (2 sigma) ||m|| / ||ref||,
//   |o - ref| <= |y - ref| + 2 (6 sigma) max(m, |ref|)   elementwise.
// The first term is the exact cost of the final rounding on this very sample (about 0.42 u_d for
// bf16 / fp16 outputs), so the bf16 / fp16 output tolerance sits within a few percent of what the
// rounding alone gives, and any arithmetic error shows.
//
// Per path (r_op; r_acc):
//   tokenwise                 fp32 FMA                          u32 / sqrt(3);  u32 / sqrt(3)
//   generic                   fp32 FMA                          u32 / sqrt(3);  u32 sqrt(n / 3)
//   tf32                      fp32 operands as TF32 hi + lo      2^-21 / 3;      u32 sqrt(n / 8)
//     (hi rounded, lo = x - hi read truncated by the tensor core: twice the RMS of a rounded lo)
//   wy, wy_transposed         the state as bf16 hi + lo          2^-16 / 3;      u32 sqrt(n / 16)
//     (fp16 inputs: fp16 K and Q are exact as bf16 hi + lo; the transposed fp16 scan holds the
//      state in 22 bits but its products on the chunk records keep 16: r_op as above.)
//   wy_transposed, arithmetic FAST (bf16 / fp16): the state in K S and Q S and the update X in
//     K^T X rounded once to the dtype, u_d / sqrt(3) (u_d 2^-8, 2^-11; fp16 rows scaled by powers
//     of two into range first), m = 3 (K S and K^T X carry it forward, Q S reads it out once); the
//     chunk system's products keep 2^-16 / 3, far below.
//   wy, arithmetic FAST (fp32): K and Q rounded to bf16 hi + lo as well, m = 6.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kla/kla.h"

namespace kla::test {

constexpr double kU32 = 1.0 / 16777216.0;

/// What one call ran: the plan's path (KLA_PATH_TOKENWISE for the decode entry), its value slice,
/// the tokens a hand-off spans and the arithmetic its kernels ran (kla_plan.arithmetic).
struct Ran {
  kla_path path = KLA_PATH_AUTO;
  int32_t value_slice = 0;
  int32_t chunk = 64;
  kla_arithmetic arithmetic = KLA_ARITHMETIC_ACCURATE;
  int32_t segments = 1;  // > 1: the sequence split (kla_plan.segments)
};

/// The arithmetic of the path a call ran, for its dtype: RMS relative error of one rounded
/// operand, products per hand-off, tokens per hand-off, and the ledger's key.
struct PathArithmetic {
  double r_op = 0, r_acc = 0;
  int m = 4;
  int C = 64;
  bool chunked = true;  // sums its log decays over a chunk (r_G)
  bool split = false;   // the sequence split: see model_sigma
  std::string key;
};

inline PathArithmetic path_arithmetic(const Ran& ran, kla_dtype dt, int K) {
  PathArithmetic a;
  const double u21 = std::ldexp(1.0, -21) / 3, u16 = std::ldexp(1.0, -16) / 3;
  const double fma = kU32 / std::sqrt(3.0);
  const bool fast = ran.arithmetic == KLA_ARITHMETIC_FAST;
  const std::string dn = std::string(dt == KLA_DTYPE_FP32   ? "fp32"
                                     : dt == KLA_DTYPE_BF16 ? "bf16"
                                                            : "fp16") +
                         (fast ? "-fast" : "");
  const auto steps = [&](int k) { return std::sqrt(std::ceil(std::max(K, a.C) / double(k))); };
  switch (ran.path) {
    case KLA_PATH_TOKENWISE: a.r_op = fma, a.r_acc = fma, a.C = 1, a.chunked = false; break;
    case KLA_PATH_GENERIC:
      a.C = ran.chunk > 0 ? ran.chunk : 64;
      a.r_op = fma, a.r_acc = kU32 * std::sqrt(std::max(K, a.C) / 3.0);
      break;
    case KLA_PATH_TF32: a.r_op = u21, a.r_acc = kU32 * steps(8); break;
    case KLA_PATH_WY:
    case KLA_PATH_WY_TRANSPOSED:
      a.r_op = u16, a.r_acc = kU32 * steps(16);
      if (fast && dt == KLA_DTYPE_FP32) a.m = 6;
      if (fast && dt != KLA_DTYPE_FP32)  // the state and the update rounded once to the dtype
        a.r_op = std::ldexp(1.0, dt == KLA_DTYPE_BF16 ? -8 : -11) / std::sqrt(3.0), a.m = 3;
      break;
    default:  // not recorded: the loosest chunkwise arithmetic
      a.r_op = u16, a.r_acc = kU32 * steps(8), a.m = 6;
      break;
  }
  a.split = ran.segments > 1;
  a.key = std::string(ran.path == KLA_PATH_AUTO ? "unknown" : kla_path_name(ran.path)) + "/" + dn +
          (a.split ? "+split" : "");
  return a;
}

/// The model's sigma (see the file comment) for the longest sequence T_max and the decay bound
/// (g_max = 0: no decay).
inline double model_sigma(const PathArithmetic& a, long T_max, double g_max) {
  if (T_max <= 0) return 0.0;
  const long C = std::max(1, a.C);
  long n_h = (T_max + C - 1) / C;
  if (g_max > 0) {
    const double M = 2.0 / g_max;
    n_h = std::min<long>(n_h, 1 + long(std::ceil(M / double(C))));
  }
  const double r_G = a.chunked ? kU32 * (C * g_max / 4) * std::sqrt(std::log2(double(C))) : 0.0;
  // The split: a segment's incoming state comes from the maps pass (the same hand-offs, on [A | L]
  // from [I | 0]) and the fold (one fp32 product of K terms a segment, r = u32 sqrt(K / 3), far
  // below r_op); the second pass then adds its own hand-offs within the segment. Both chains are
  // at most the n_h hand-offs the state remembers: twice the variance.
  const double chains = a.split ? 2.0 : 1.0;
  return std::sqrt(chains * double(n_h)) * (std::sqrt(double(a.m)) * (a.r_op + a.r_acc) + r_G);
}

}  // namespace kla::test
