// Fuzz target 3: rounded differential. The emulated-precision reference (fp32, bf16, fp16, fp64)
// against the MPFR (134-bit) reference on the SAME rounded inputs, plus the special-value policy.
//
// Inputs: type, T in [1,16], dk, dv in [1,4], chunk in [1,8], decay (none / scalar / diagonal,
// given as factors alpha), Kaczmarz or given coefficient, scale or q-l2norm read-out. Values are
// either "tame" (0 or +-m 2^e with |x| in [2^-6, 2^6]) or raw bit patterns of the type (NaN,
// +-Inf, subnormals, huge values), chosen per input.
//
// POLICY, asserted for every input (tokenwise and chunkwise, no exception, no sanitizer report):
//  (P1) NaN in gives NaN out: if S0, some k_t, v_t, alpha_t, eps (Kaczmarz) or eta_t holds a NaN
//       that is live, the final state and the last output row contain a NaN; a NaN in q_t or in
//       the scale gives a NaN in o_t. "Live" excludes eta_t on a degenerate token, where
//       beta = 0 by convention whatever eta is.
//  (P2) degenerate token (Kaczmarz, computed ||k_t||^2 + eps == 0: k_t = 0 with eps = 0, or a
//       tiny k_t whose squared norm underflows to 0 with eps = 0): beta = +0 and, when v_t and
//       the decayed state S~ = diag(alpha_t) S are finite, S_t == S~ exactly (replayed with
//       token_step). With v_t non-finite the reference gives 0 * Inf = NaN: not "only decayed".
//
// ERROR BOUND, asserted only for the well-conditioned class W:
//   every input finite; nonzero entries of q, k, v, S0 in [2^-6, 2^6] in magnitude; Kaczmarz
//   coefficient; eta_t in [0, 1]; alpha in [2^-6, 1]; eps = 0 or in [2^-6, 2^6]; scale in
//   [2^-6, 2^6] (or q-l2norm with q_t != 0); ||k_t|| in [2^-3, 2^3]; and 4 T gamma_m <= 1/2 with
//   m = 2 dk + 10, gamma_m = m u / (1 - m u), u = ScalarTraits<T>::unit_roundoff().
// Derivation (tokenwise). The exact step S -> P diag(alpha) S + beta k v^T with
// P = I - beta k k^T has ||P diag(alpha)||_2 <= 1 because beta ||k||^2 = eta ||k||^2/(||k||^2+eps)
// is in [0, 1]. Hence the computed state error obeys E_t = P diag(alpha) E_{t-1} + L_t, so
// ||E_T|| <= sum_t ||L_t||, where L_t is the rounding of one step applied to the computed state.
// With w = beta k, ||w|| <= 1/||k||, e = v - S~^T k, ||w e^T|| <= ||v||/||k|| + ||S||, the
// standard model (|fl(a op b) - a op b| <= u |a op b|, dot products of length n within gamma_n)
// gives per step: decay u||S||; e within gamma_{dk+2}(||v|| + ||S|| ||k||); ||k||^2 + eps and
// eta/(.) and beta k within gamma_{dk+3} relatively; outer product and sum 2u. Collecting terms,
// ||L_t|| <= gamma_m (||S_{t-1}|| + ||v_t||/||k_t||), m = 2 dk + 10. The state itself obeys
// ||S_t|| <= ||S_{t-1}|| + ||v_t||/||k_t||, so ||S_t|| <= M_t := ||S0||_F + sum_{s<=t}
// ||v_s||/||k_s||, and while ||E|| <= M/2 the computed state is at most 1.5 M_t; therefore
//   ||S^_T - S_T||_F <= 1.5 T gamma_m M_T  <=  ErrS_T := 4 T gamma_m M_T  (+ underflow slack),
// where 4 T gamma_m <= 1/2 keeps the premise ||E|| <= M/2 true by induction.
// Outputs o_t = S_t^T q_t s_t: a dot of length dk (gamma_dk), one product (u) and, for the
// l2-norm read-out, s = 1/sqrt(q.q) within gamma_{dk+3}:
//   ||o^_t - o_t|| <= |s_t| ||q_t|| (ErrS_t + gamma_{2dk+6} (M_t + ErrS_t)) (1 + gamma_{dk+3}).
// Underflow (fp16 and bf16 states decay towards subnormals): every operation may add an absolute
// error of denorm_min/2; with at most 4 (dk+1)(dv+1) operations per token, amplified by at most
// ||w|| <= 8, the slack is 64 t (dk+1)(dv+1) denorm_min per t tokens. The MPFR reference adds
// 2^-100 (M_t + 1). The chunkwise emulated form is checked for the policy only: its rounding
// error depends on the conditioning of the chunk system (chunk.hpp), not on u alone.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "bytes.hpp"
#include "kla/ref/chunk.hpp"
#include "kla/ref/recurrence.hpp"

namespace ref = kla::ref;
using kla::fuzz::Bytes;
using M = ref::Mpfr;
using Idx = Eigen::Index;

namespace {

[[noreturn]] void die(const char* type, const char* what) {
  std::fprintf(stderr, "fuzz_rounded[%s]: %s\n", type, what);
  std::abort();
}

// The value of a raw bit pattern of T (all patterns, NaN and Inf included).
template <class T>
T from_bits(Bytes& r) {
  if constexpr (std::is_same_v<T, ref::bf16> || std::is_same_v<T, ref::fp16>) {
    return Eigen::numext::bit_cast<T>(r.u16());
  } else if constexpr (std::is_same_v<T, float>) {
    return Eigen::numext::bit_cast<float>(r.u32());
  } else {
    return Eigen::numext::bit_cast<double>(r.u64());
  }
}

// A tame value: 0 or +-(1 + j/8) 2^e, e in [-6, 5], rounded to T.
template <class T>
T tame(Bytes& r) {
  const std::uint8_t a = r.u8(), b = r.u8();
  if (a % 8 == 0) return T(0.0f);
  const double m = (1.0 + double(b % 8) / 8.0) * std::ldexp(1.0, int(a / 8 % 12) - 6);
  return ref::scalar_cast<T>((a & 0x80) ? -m : m);
}

template <class T>
bool isnan_(const T& x) {
  return std::isnan(ref::to_double(x));
}
template <class T>
bool finite_(const T& x) {
  return std::isfinite(ref::to_double(x));
}
template <class Derived>
bool any_nan(const Eigen::MatrixBase<Derived>& m) {
  for (Idx i = 0; i < m.rows(); ++i)
    for (Idx j = 0; j < m.cols(); ++j)
      if (isnan_(m(i, j))) return true;
  return false;
}
template <class Derived>
bool all_finite(const Eigen::MatrixBase<Derived>& m) {
  for (Idx i = 0; i < m.rows(); ++i)
    for (Idx j = 0; j < m.cols(); ++j)
      if (!finite_(m(i, j))) return false;
  return true;
}
bool in_band(double x, double lo, double hi) {
  return x == 0 || (std::fabs(x) >= lo && std::fabs(x) <= hi);
}

template <class T>
ref::Mat<M> to_mpfr(const ref::Mat<T>& a) {
  ref::Mat<M> b(a.rows(), a.cols());
  for (Idx i = 0; i < a.rows(); ++i)
    for (Idx j = 0; j < a.cols(); ++j) b(i, j) = ref::scalar_cast<M>(a(i, j));
  return b;
}
double fro(const ref::Mat<M>& a) {
  return ref::to_double(M(sqrt(M(a.squaredNorm()))));
}

template <class T>
void run(Bytes& r) {
  const std::string tname = ref::ScalarTraits<T>::name();
  const char* name = tname.c_str();
  const bool raw = r.u8() % 3 == 0;  // raw bit patterns for a share of the values
  auto val = [&]() -> T { return raw && r.u8() % 4 == 0 ? from_bits<T>(r) : tame<T>(r); };
  const Idx T_ = r.range(1, 16), dk = r.range(1, 4), dv = r.range(1, 4), chunk = r.range(1, 8);
  const int decay_kind = r.range(0, 3);
  ref::Options<T> opt;
  opt.coefficient = r.u8() % 4 == 0 ? ref::Coefficient::given : ref::Coefficient::kaczmarz;
  opt.readout = r.u8() % 4 == 0 ? ref::Readout::q_l2norm : ref::Readout::scale;
  opt.eps = r.flag() ? T(0.0f)
                     : (raw ? val() : ref::scalar_cast<T>(std::fabs(ref::to_double(tame<T>(r)))));
  opt.scale = val();
  ref::HeadInputs<T> in;
  in.q.resize(T_, dk), in.k.resize(T_, dk), in.v.resize(T_, dv), in.eta.resize(T_);
  if (decay_kind == 1) in.alpha.resize(T_, 1);
  if (decay_kind == 2) in.alpha.resize(T_, dk);
  const int zero_k_every = r.range(0, 4);
  for (Idx t = 0; t < T_; ++t) {
    for (Idx c = 0; c < dk; ++c) in.q(t, c) = val();
    for (Idx c = 0; c < dk; ++c) in.k(t, c) = val();
    if (zero_k_every && t % zero_k_every == 0) in.k.row(t).setConstant(T(0.0f));
    for (Idx c = 0; c < dv; ++c) in.v(t, c) = val();
    in.eta(t) =
        raw && r.u8() % 4 == 0 ? from_bits<T>(r) : ref::scalar_cast<T>(double(r.u8() % 17) / 16.0);
    for (Idx c = 0; c < in.alpha.cols(); ++c)
      in.alpha(t, c) = raw && r.u8() % 4 == 0 ? from_bits<T>(r)
                                              : ref::scalar_cast<T>(double(r.range(1, 64)) / 64.0);
  }
  ref::Mat<T> S0 = ref::Mat<T>::Zero(dk, dv);
  if (r.flag())
    for (Idx i = 0; i < dk; ++i)
      for (Idx j = 0; j < dv; ++j) S0(i, j) = val();

  ref::HeadOutputs<T> tok, chk;
  try {
    tok = ref::recurrent_forward(in, opt, S0);
    chk = ref::chunk_forward(in, opt, chunk, S0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    die(name, "reference threw on well-shaped input");
  }

  if (std::getenv("KLA_FUZZ_DUMP")) {  // print the decoded problem (debugging a reproducer)
    auto dump = [](const char* n, const auto& m) {
      std::fprintf(stderr, "%s [%ldx%ld]:", n, long(m.rows()), long(m.cols()));
      for (Idx i = 0; i < m.rows(); ++i)
        for (Idx j = 0; j < m.cols(); ++j) std::fprintf(stderr, " %.9g", ref::to_double(m(i, j)));
      std::fprintf(stderr, "\n");
    };
    std::fprintf(stderr,
                 "%s T=%ld dk=%ld dv=%ld chunk=%ld coef=%d readout=%d eps=%.9g scale=%.9g\n", name,
                 long(T_), long(dk), long(dv), long(chunk), int(opt.coefficient), int(opt.readout),
                 ref::to_double(opt.eps), ref::to_double(opt.scale));
    dump("q", in.q), dump("k", in.k), dump("v", in.v), dump("eta", in.eta);
    dump("alpha", in.alpha), dump("S0", S0), dump("tok.state", tok.state);
    dump("chk.state", chk.state), dump("tok.o", tok.o), dump("chk.o", chk.o);
  }

  // (P2) degenerate tokens, replayed.
  const bool kacz = opt.coefficient == ref::Coefficient::kaczmarz;
  std::vector<bool> degenerate(static_cast<size_t>(T_));
  {
    ref::Mat<T> S = S0;
    for (Idx t = 0; t < T_; ++t) {
      const ref::Vec<T> k = in.k.row(t).transpose();
      // Degenerate means the COMPUTED ||k||^2 + eps is 0: k = 0 with eps = 0, but also a tiny
      // nonzero k whose squared norm underflows (e.g. |k| ~ 1e-42 in fp32) with eps = 0.
      const T denom = T(T(k.squaredNorm()) + opt.eps);
      degenerate[size_t(t)] = kacz && ref::to_double(denom) == 0;
      const ref::Mat<T> decayed = in.decay(t).asDiagonal() * S;
      const ref::Vec<T> v = in.v.row(t).transpose();
      const auto tr = ref::token_step<T>(S, in.decay(t), k, v, in.eta(t), opt);
      if (!degenerate[size_t(t)]) continue;
      if (ref::to_double(tr.beta) != 0 || std::signbit(ref::to_double(tr.beta)))
        die(name, "k = 0, eps = 0: beta != +0");
      if (all_finite(decayed) && all_finite(v)) {
        for (Idx i = 0; i < dk; ++i)
          for (Idx j = 0; j < dv; ++j)
            if (!(ref::to_double(S(i, j)) == ref::to_double(decayed(i, j))))
              die(name, "k = 0, eps = 0: state is not exactly the decayed state");
      }
    }
  }

  // (P1) NaN in gives NaN out.
  bool live_nan = any_nan(S0) || (kacz && isnan_(opt.eps));
  for (Idx t = 0; t < T_; ++t) {
    live_nan = live_nan || any_nan(in.k.row(t)) || any_nan(in.v.row(t));
    live_nan = live_nan || (in.alpha.size() && any_nan(in.alpha.row(t)));
    live_nan = live_nan || (isnan_(in.eta(t)) && !degenerate[size_t(t)]);
  }
  if (live_nan) {
    if (!any_nan(tok.state)) die(name, "NaN input, tokenwise final state has no NaN");
    if (!any_nan(chk.state)) die(name, "NaN input, chunkwise final state has no NaN");
    if (!any_nan(tok.o.row(T_ - 1))) die(name, "NaN input, tokenwise last output has no NaN");
    if (!any_nan(chk.o.row(T_ - 1))) die(name, "NaN input, chunkwise last output has no NaN");
  }
  const bool scale_nan = opt.readout == ref::Readout::scale && isnan_(opt.scale);
  for (Idx t = 0; t < T_; ++t)
    if (any_nan(in.q.row(t)) || scale_nan) {
      if (!any_nan(tok.o.row(t))) die(name, "NaN in q_t / scale, tokenwise o_t has no NaN");
      if (!any_nan(chk.o.row(t))) die(name, "NaN in q_t / scale, chunkwise o_t has no NaN");
    }

  // Error bound on the well-conditioned class W.
  const double u = ref::ScalarTraits<T>::unit_roundoff();
  auto gamma = [&](double n) { return n * u / (1 - n * u); };
  const double gm = gamma(double(2 * dk + 10));
  if (!kacz || 4 * double(T_) * gm > 0.5) return;
  const double lo = std::ldexp(1.0, -6), hi = std::ldexp(1.0, 6);
  auto tame_mat = [&](const auto& m) {
    for (Idx i = 0; i < m.rows(); ++i)
      for (Idx j = 0; j < m.cols(); ++j)
        if (!in_band(ref::to_double(m(i, j)), lo, hi)) return false;
    return true;
  };
  if (!tame_mat(in.q) || !tame_mat(in.k) || !tame_mat(in.v) || !tame_mat(S0)) return;
  if (!in_band(ref::to_double(opt.eps), lo, hi) || ref::to_double(opt.eps) < 0) return;
  const double sc = ref::to_double(opt.scale);
  if (opt.readout == ref::Readout::scale && !(std::fabs(sc) >= lo && std::fabs(sc) <= hi)) return;
  for (Idx t = 0; t < T_; ++t) {
    const double e = ref::to_double(in.eta(t));
    if (!(e >= 0 && e <= 1)) return;
    for (Idx c = 0; c < in.alpha.cols(); ++c) {
      const double a = ref::to_double(in.alpha(t, c));
      if (!(a >= lo && a <= 1)) return;
    }
    double kk = 0, qq = 0;
    for (Idx c = 0; c < dk; ++c) {
      kk += ref::to_double(in.k(t, c)) * ref::to_double(in.k(t, c));
      qq += ref::to_double(in.q(t, c)) * ref::to_double(in.q(t, c));
    }
    if (!(std::sqrt(kk) >= 0.125 && std::sqrt(kk) <= 8)) return;
    if (opt.readout == ref::Readout::q_l2norm && qq == 0) return;
  }
  // MPFR on the same rounded inputs.
  ref::HeadInputs<M> inM;
  inM.q = to_mpfr(in.q), inM.k = to_mpfr(in.k), inM.v = to_mpfr(in.v);
  inM.eta = to_mpfr<T>(ref::Mat<T>(in.eta));
  inM.alpha = to_mpfr(in.alpha);
  ref::Options<M> optM;
  optM.eps = ref::scalar_cast<M>(opt.eps), optM.scale = ref::scalar_cast<M>(opt.scale);
  optM.coefficient = opt.coefficient, optM.readout = opt.readout;
  const ref::Mat<M> S0M = to_mpfr(S0);
  const auto want = ref::recurrent_forward(inM, optM, S0M);
  const double denorm = ref::to_double(std::numeric_limits<T>::denorm_min());
  const double g_o = gamma(double(2 * dk + 6)), g_s = gamma(double(dk + 3));
  double Mt = fro(S0M);
  for (Idx t = 0; t < T_; ++t) {
    const ref::Vec<M> k = inM.k.row(t).transpose(), v = inM.v.row(t).transpose();
    Mt += fro(v) / fro(k);
    const double tt = double(t + 1);
    const double slack = 64 * tt * double((dk + 1) * (dv + 1)) * denorm + std::ldexp(Mt + 1, -100);
    const double errS = 4 * tt * gm * Mt * (1 + 1e-9) + slack;
    const ref::Vec<M> q = inM.q.row(t).transpose();
    const double qn = fro(q);
    const double s = opt.readout == ref::Readout::scale ? std::fabs(sc) : 1 / qn;
    const double errO = s * qn * (errS + g_o * (Mt + errS)) * (1 + g_s) + slack;
    const ref::Mat<M> got = to_mpfr<T>(ref::Mat<T>(tok.o.row(t)));
    const double eo = fro(ref::Mat<M>(got - want.o.row(t)));
    if (!(eo <= errO)) {
      std::fprintf(stderr, "t=%ld |o err|=%.6g bound=%.6g M=%.6g\n", long(t), eo, errO, Mt);
      die(name, "tokenwise output error exceeds the derived bound");
    }
    if (t == T_ - 1) {
      const double es = fro(ref::Mat<M>(to_mpfr(tok.state) - want.state));
      if (!(es <= errS)) {
        std::fprintf(stderr, "|S err|=%.6g bound=%.6g M=%.6g\n", es, errS, Mt);
        die(name, "tokenwise state error exceeds the derived bound");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes r(data, size);
  switch (r.u8() % 4) {
    case 0: run<float>(r); break;
    case 1: run<ref::bf16>(r); break;
    case 2: run<ref::fp16>(r); break;
    default: run<double>(r); break;
  }
  return 0;
}
