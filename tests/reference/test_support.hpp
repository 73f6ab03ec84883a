// Shared helpers for the reference unit tests: seeding, rational literals, an independent naive
// oracle of the recurrence, random inputs, error norms, and the DERIVED floating-point error
// bounds used by the precision, chunk, normalised-key and tensor tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "kla/ref/chunk.hpp"
#include "kla/ref/normalized_key.hpp"
#include "kla/ref/recurrence.hpp"
#include "kla/ref/scalar.hpp"
#include "kla/ref/types.hpp"

namespace kla::test {

using kla::ref::bf16;
using kla::ref::Coefficient;
using kla::ref::fp16;
using kla::ref::HeadInputs;
using kla::ref::HeadOutputs;
using kla::ref::Mat;
using kla::ref::Mpfr;
using kla::ref::Options;
using kla::ref::Rational;
using kla::ref::Readout;
using kla::ref::scalar_cast;
using kla::ref::ScalarTraits;
using kla::ref::to_double;
using kla::ref::Vec;
using Idx = Eigen::Index;

// ---- seeding -----------------------------------------------------------------------------------

/// A fresh seed from std::random_device, or KLA_TEST_SEED from the environment to replay one.
inline std::uint64_t fresh_seed() {
  if (const char* s = std::getenv("KLA_TEST_SEED")) return std::strtoull(s, nullptr, 0);
  std::random_device rd;
  return (std::uint64_t(rd()) << 32) ^ std::uint64_t(rd());
}

/// Declares `std::mt19937_64 name` with a fresh seed and prints the seed on failure.
#define KLA_SEEDED_RNG(name)                                                                       \
  const std::uint64_t name##_seed = ::kla::test::fresh_seed();                                     \
  SCOPED_TRACE(::testing::Message()                                                                \
               << "seed " << name##_seed << " (replay with KLA_TEST_SEED=" << name##_seed << ")"); \
  std::mt19937_64 name(name##_seed)

// ---- exact literals ----------------------------------------------------------------------------

/// The rational n/d.
inline Rational R(long n, long d = 1) {
  return Rational(n) / Rational(d);
}

/// A matrix from a row-major list of rationals.
inline Mat<Rational> RM(Idx rows, Idx cols, std::initializer_list<Rational> xs) {
  Mat<Rational> m(rows, cols);
  Idx i = 0;
  for (const Rational& x : xs) {
    m(i / cols, i % cols) = x;
    ++i;
  }
  EXPECT_EQ(i, rows * cols) << "RM: wrong number of entries";
  return m;
}
/// A column vector from a list of rationals.
inline Vec<Rational> RV(std::initializer_list<Rational> xs) {
  Vec<Rational> v(static_cast<Idx>(xs.size()));
  Idx i = 0;
  for (const Rational& x : xs) v(i++) = x;
  return v;
}

/// Exact equality of two rational matrices, reporting the first differing entry.
inline ::testing::AssertionResult exactly_equal(const Mat<Rational>& a, const Mat<Rational>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    return ::testing::AssertionFailure() << "shapes differ: " << a.rows() << "x" << a.cols()
                                         << " vs " << b.rows() << "x" << b.cols();
  for (Idx i = 0; i < a.rows(); ++i)
    for (Idx j = 0; j < a.cols(); ++j)
      if (a(i, j) != b(i, j))
        return ::testing::AssertionFailure()
               << "entry (" << i << "," << j << "): " << a(i, j) << " vs " << b(i, j);
  return ::testing::AssertionSuccess();
}

/// Bitwise equality of two matrices of a rounded type (NaN compares unequal).
template <class T>
::testing::AssertionResult identical(const Mat<T>& a, const Mat<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    return ::testing::AssertionFailure() << "shapes differ";
  for (Idx i = 0; i < a.rows(); ++i)
    for (Idx j = 0; j < a.cols(); ++j)
      if (!(a(i, j) == b(i, j)))
        return ::testing::AssertionFailure()
               << "entry (" << i << "," << j << "): " << to_double(a(i, j)) << " vs "
               << to_double(b(i, j));
  return ::testing::AssertionSuccess();
}

// ---- independent oracle ------------------------------------------------------------------------

/// Result of the naive oracle, plus the scale Σ used by the error bounds.
template <class T>
struct OracleRun {
  Mat<T> o;
  Mat<T> state;
  double max_state_norm = 0;  ///< max over t = 0..T of ‖S_t‖_F (including S_0), in double
  double max_v_over_k = 0;    ///< max over tokens with k ≠ 0 of ‖v_t‖/‖k_t‖
  /// Σ = max(max_t ‖S_t‖_F, max_t ‖v_t‖/‖k_t‖): the magnitude every local error is relative to.
  double sigma() const { return std::max(max_state_norm, max_v_over_k); }
};

/// The recurrence of SPEC §1 written independently of kla::ref with scalar loops only (no Eigen
/// expressions, no reference routine). Read-out: o_t = S_tᵀ q_t · scale (q_l2norm: 1/‖q_t‖,
/// rounded types only).
template <class T>
OracleRun<T> oracle(const HeadInputs<T>& in, const Options<T>& opt, const Mat<T>& S0 = Mat<T>()) {
  const Idx n = in.k.rows(), dk = in.k.cols(), dv = in.v.cols();
  OracleRun<T> r;
  Mat<T> S(dk, dv);
  for (Idx i = 0; i < dk; ++i)
    for (Idx j = 0; j < dv; ++j) S(i, j) = S0.size() ? S0(i, j) : T(0);
  auto frob = [&] {
    T acc(0);
    for (Idx i = 0; i < dk; ++i)
      for (Idx j = 0; j < dv; ++j) acc += S(i, j) * S(i, j);
    return std::sqrt(to_double(acc));
  };
  r.max_state_norm = frob();
  r.o.resize(n, dv);
  std::vector<T> e(static_cast<size_t>(dv));
  for (Idx t = 0; t < n; ++t) {
    for (Idx i = 0; i < dk; ++i) {
      const T a = in.alpha.size() == 0 ? T(1) : in.alpha(t, in.alpha.cols() == 1 ? 0 : i);
      for (Idx j = 0; j < dv; ++j) S(i, j) = a * S(i, j);
    }
    T kk(0);
    for (Idx i = 0; i < dk; ++i) kk += in.k(t, i) * in.k(t, i);
    T vv(0);
    for (Idx j = 0; j < dv; ++j) vv += in.v(t, j) * in.v(t, j);
    if (kk != T(0))
      r.max_v_over_k = std::max(r.max_v_over_k, std::sqrt(to_double(vv) / to_double(kk)));
    T beta = in.eta(t);
    if (opt.coefficient == Coefficient::kaczmarz) {
      const T den = kk + opt.eps;
      beta = den == T(0) ? T(0) : T(in.eta(t) / den);
    }
    for (Idx j = 0; j < dv; ++j) {
      T p(0);
      for (Idx i = 0; i < dk; ++i) p += S(i, j) * in.k(t, i);
      e[size_t(j)] = in.v(t, j) - p;
    }
    for (Idx i = 0; i < dk; ++i)
      for (Idx j = 0; j < dv; ++j) S(i, j) += beta * in.k(t, i) * e[size_t(j)];
    r.max_state_norm = std::max(r.max_state_norm, frob());
    T s = opt.scale;
    if (opt.readout == Readout::q_l2norm) {
      if constexpr (ScalarTraits<T>::exact) {
        ADD_FAILURE() << "oracle: q_l2norm needs a rounded type";
      } else {
        T qq(0);
        for (Idx i = 0; i < dk; ++i) qq += in.q(t, i) * in.q(t, i);
        using std::sqrt;
        s = qq == T(0) ? T(0) : T(T(1) / T(sqrt(qq)));
      }
    }
    for (Idx j = 0; j < dv; ++j) {
      T acc(0);
      for (Idx i = 0; i < dk; ++i) acc += S(i, j) * in.q(t, i);
      r.o(t, j) = acc * s;
    }
  }
  r.state = S;
  return r;
}

// ---- random inputs (generated in double) -------------------------------------------------------

enum class DecayKind { none, scalar, diagonal };

struct GenConfig {
  Idx T = 16, dk = 4, dv = 4;
  double k_norm_lo = 0.5, k_norm_hi = 1.5;  ///< ‖k_t‖ uniform in this range (keys "normalised-ish")
  double eta_lo = 0.1, eta_hi = 0.9;        ///< η < 1: the recurrence is a contraction (below)
  DecayKind decay = DecayKind::scalar;
  double alpha_lo = 1, alpha_hi = 1;  ///< α_t (or each channel of it) uniform in this range
  double v_abs = 1;                   ///< v entries uniform in [−v_abs, v_abs]
};

inline HeadInputs<double> random_inputs(std::mt19937_64& rng, const GenConfig& c) {
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto uni = [&](double lo, double hi) { return lo + (hi - lo) * unit(rng); };
  HeadInputs<double> in;
  in.q.resize(c.T, c.dk);
  in.k.resize(c.T, c.dk);
  in.v.resize(c.T, c.dv);
  in.eta.resize(c.T);
  for (Idx t = 0; t < c.T; ++t) {
    Vec<double> dir(c.dk);
    for (Idx i = 0; i < c.dk; ++i) dir(i) = normal(rng);
    dir *= uni(c.k_norm_lo, c.k_norm_hi) / dir.norm();
    in.k.row(t) = dir.transpose();
    for (Idx i = 0; i < c.dk; ++i) in.q(t, i) = normal(rng);
    for (Idx j = 0; j < c.dv; ++j) in.v(t, j) = uni(-c.v_abs, c.v_abs);
    in.eta(t) = uni(c.eta_lo, c.eta_hi);
  }
  if (c.decay != DecayKind::none) {
    in.alpha.resize(c.T, c.decay == DecayKind::scalar ? 1 : c.dk);
    for (Idx t = 0; t < in.alpha.rows(); ++t)
      for (Idx i = 0; i < in.alpha.cols(); ++i) in.alpha(t, i) = uni(c.alpha_lo, c.alpha_hi);
  }
  return in;
}

inline Mat<double> random_matrix(std::mt19937_64& rng, Idx rows, Idx cols, double scale = 1) {
  std::normal_distribution<double> normal;
  Mat<double> m(rows, cols);
  for (Idx i = 0; i < rows; ++i)
    for (Idx j = 0; j < cols; ++j) m(i, j) = scale * normal(rng);
  return m;
}

/// Converts every entry with scalar_cast (exact whenever the value is representable in T).
template <class T, class U>
Mat<T> cast_mat(const Mat<U>& m) {
  Mat<T> r(m.rows(), m.cols());
  for (Idx i = 0; i < m.rows(); ++i)
    for (Idx j = 0; j < m.cols(); ++j) r(i, j) = scalar_cast<T>(m(i, j));
  return r;
}
template <class T, class U>
Vec<T> cast_vec(const Vec<U>& v) {
  Vec<T> r(v.size());
  for (Idx i = 0; i < v.size(); ++i) r(i) = scalar_cast<T>(v(i));
  return r;
}
template <class T, class U>
HeadInputs<T> cast_inputs(const HeadInputs<U>& in) {
  HeadInputs<T> r;
  r.q = cast_mat<T>(in.q);
  r.k = cast_mat<T>(in.k);
  r.v = cast_mat<T>(in.v);
  r.eta = cast_vec<T>(in.eta);
  r.alpha = cast_mat<T>(in.alpha);
  return r;
}
template <class T, class U>
Options<T> cast_options(const Options<U>& o) {
  Options<T> r;
  r.eps = scalar_cast<T>(o.eps);
  r.coefficient = o.coefficient;
  r.readout = o.readout;
  r.scale = scalar_cast<T>(o.scale);
  return r;
}

/// Rounds every entry to T and back: afterwards the data is representable in T (and in every
/// wider type), so all types see identical inputs.
template <class T>
Mat<double> round_mat(const Mat<double>& m) {
  return cast_mat<double>(cast_mat<T>(m));
}
template <class T>
HeadInputs<double> round_inputs(const HeadInputs<double>& in) {
  return cast_inputs<double>(cast_inputs<T>(in));
}

inline double max_eta(const HeadInputs<double>& in) {
  return in.eta.maxCoeff();
}
inline double max_alpha(const HeadInputs<double>& in) {
  return in.alpha.size() ? in.alpha.maxCoeff() : 1.0;
}

// ---- random rational inputs (small numerators/denominators: exact runs stay cheap) ----------

/// n/d with n uniform in [lo, hi] and d uniform in [1, den_max].
inline Rational random_rational(std::mt19937_64& rng, long lo, long hi, long den_max) {
  std::uniform_int_distribution<long> num(lo, hi), den(1, den_max);
  return R(num(rng), den(rng));
}
/// A decay factor in (0, 1]: n/d with 1 <= n <= d <= 4.
inline Rational random_alpha(std::mt19937_64& rng) {
  std::uniform_int_distribution<long> den(1, 4);
  const long d = den(rng);
  std::uniform_int_distribution<long> num(1, d);
  return R(num(rng), d);
}

struct RationalConfig {
  Idx T = 6, dk = 3, dv = 2;
  DecayKind decay = DecayKind::scalar;
  double zero_key_prob = 0;  ///< probability that a token's key is exactly 0
};

inline HeadInputs<Rational> random_rational_inputs(std::mt19937_64& rng, const RationalConfig& c) {
  std::bernoulli_distribution zero_key(c.zero_key_prob);
  HeadInputs<Rational> in;
  in.q.resize(c.T, c.dk);
  in.k.resize(c.T, c.dk);
  in.v.resize(c.T, c.dv);
  in.eta.resize(c.T);
  for (Idx t = 0; t < c.T; ++t) {
    const bool z = zero_key(rng);
    for (Idx i = 0; i < c.dk; ++i) {
      in.q(t, i) = random_rational(rng, -3, 3, 2);
      in.k(t, i) = z ? Rational(0) : random_rational(rng, -2, 2, 2);
    }
    for (Idx j = 0; j < c.dv; ++j) in.v(t, j) = random_rational(rng, -3, 3, 3);
    in.eta(t) = random_alpha(rng);  // η in (0, 1]
  }
  if (c.decay != DecayKind::none) {
    in.alpha.resize(c.T, c.decay == DecayKind::scalar ? 1 : c.dk);
    for (Idx t = 0; t < in.alpha.rows(); ++t)
      for (Idx i = 0; i < in.alpha.cols(); ++i) in.alpha(t, i) = random_alpha(rng);
  }
  return in;
}

inline Mat<Rational> random_rational_matrix(std::mt19937_64& rng, Idx rows, Idx cols) {
  Mat<Rational> m(rows, cols);
  for (Idx i = 0; i < rows; ++i)
    for (Idx j = 0; j < cols; ++j) m(i, j) = random_rational(rng, -2, 2, 2);
  return m;
}

// ---- error norms (differences taken in Mpfr, so the measurement adds no error) -----------------

/// max_t ‖a_t − b_t‖_2 / ‖q_t‖_2 over the rows (tokens); rows with q_t = 0 are skipped.
template <class A, class B>
double max_row_error(const Mat<A>& a, const Mat<B>& b, const Mat<double>& q) {
  double worst = 0;
  for (Idx t = 0; t < a.rows(); ++t) {
    Mpfr acc(0);
    for (Idx j = 0; j < a.cols(); ++j) {
      const Mpfr d = scalar_cast<Mpfr>(a(t, j)) - scalar_cast<Mpfr>(b(t, j));
      acc += d * d;
    }
    const double qn = q.row(t).norm();
    if (qn > 0) worst = std::max(worst, std::sqrt(to_double(acc)) / qn);
  }
  return worst;
}

/// ‖a − b‖_F.
template <class A, class B>
double frob_error(const Mat<A>& a, const Mat<B>& b) {
  Mpfr acc(0);
  for (Idx i = 0; i < a.rows(); ++i)
    for (Idx j = 0; j < a.cols(); ++j) {
      const Mpfr d = scalar_cast<Mpfr>(a(i, j)) - scalar_cast<Mpfr>(b(i, j));
      acc += d * d;
    }
  return std::sqrt(to_double(acc));
}

// ---- derived error bounds ----------------------------------------------------------------------
//
// Model: every rounded operation returns (x op y)(1+θ), |θ| ≤ u = ScalarTraits<T>::unit_roundoff();
// an inner product of length n has absolute error ≤ γ_n |x|ᵀ|y| with γ_n = nu/(1−nu) ≈ nu
// (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). Underflow only adds absolute
// errors far below u·Σ for our data (|entries| ≳ 1e-3), so it is ignored.
//
// Assumptions on the data (they hold for random_inputs): 0 < η_t ≤ η_max < 1, 0 < α ≤ 1, ε ≥ 0.
// Hence β_t‖k_t‖² = η_t‖k_t‖²/(‖k_t‖²+ε) ≤ η_max < 1 and the linear part of one token,
// M_t = (I − β_t k_t k_tᵀ) diag(α_t), has spectral norm ≤ α_max,t ≤ 1 (eigenvalues of the
// projector part are 1 and 1 − β‖k‖² ∈ (0,1]). M_t acts on each column of S, so also
// ‖M_t X‖_F ≤ α_max ‖X‖_F.
//
// Σ := max(max_t ‖S_t‖_F, max_t ‖v_t‖/‖k_t‖) over the exact run (oracle().sigma()). Every
// quantity below is bounded in units of Σ: ‖e_t‖ ≤ ‖v_t‖ + ‖S̃‖‖k_t‖ ≤ 2Σ‖k_t‖, and the update
// W = β k eᵀ has ‖W‖_F ≤ β‖k‖‖e‖ ≤ 2ηΣ ≤ 2Σ.
//
// TOKENWISE (recurrence.hpp): local error δ_t of one token evaluated in T from an exact S_{t−1}:
//   S̃ = diag(α)S                 u‖S̃‖                                     ≤  1 ·uΣ
//   e = v − S̃ᵀk                  (dk+1)u‖S̃‖‖k‖ (+u‖S̃‖‖k‖ from S̃) + u‖e‖     ≤ (dk+4)uΣ‖k‖
//     its effect on W: β‖k‖·‖Δe‖ ≤ (η/‖k‖)(dk+4)uΣ‖k‖                        ≤ (dk+4)·uΣ
//   β = η/(‖k‖²+ε)               relative dk (squared norm) + 1 (+ε) + 1 (÷) = (dk+2)u
//   W = (β k) eᵀ                 relative (dk+2) + 1 + 1 = (dk+4)u of ‖W‖ ≤ 2Σ  ≤ (2dk+8)uΣ
//   S = S̃ + W                    u‖S_t‖                                     ≤  1 ·uΣ
// total ‖δ_t‖_F ≤ c_tok·u·Σ with c_tok = 3dk + 14 (first order in u).
// Errors then propagate through the exact maps M_t (E_t = M_t E_{t−1} + δ_t), so
//   ‖Ŝ_t − S_t‖_F ≤ c_tok·u·Σ·Σ_{m<t} α_max^m ≤ c_tok·u·Σ·L,  L = min(t, 1/(1−α_max)).
// Read-out o = (Sᵀq)·s adds (dk+1)u‖S‖‖q‖s, so
//   ‖ô_t − o_t‖_2 ≤ (c_tok·L + dk + 1)·u·Σ·s·‖q_t‖.
// The factor 2 in the bounds covers what the first-order expansion drops: terms of relative size
// O(c·u) (γ_n vs nu, products of θ's); exp(c·u) ≤ 2 for every configuration we test.
//
// CHUNKWISE (chunk.hpp, chunk of C tokens, incoming S_0 exact). Scale the unknowns by the key
// norms: x̃_j = ‖k_j‖U_j, ỹ_i = ‖k_i‖(rhs)_i, L̃ = D L D⁻¹ with D = diag(‖k_i‖). Then
//   * |Ñ_ij| = ‖k_i‖β_iΓ_ij|k_iᵀk_j|/‖k_j‖ ≤ β_i‖k_i‖² ≤ η  (strict lower part),
//   * U_j = β_j e_j, so ‖x̃_j‖ ≤ 2ηΣ, and ‖ỹ_i‖ ≤ (η/‖k_i‖)(‖v_i‖ + Σ‖k_i‖) ≤ 2ηΣ,
//   * |L̃⁻¹|_ij ≤ η for i > j (and 1 on the diagonal): L⁻¹ applied to a right-hand side y is the
//     recurrence S_i = (I−β_i k_i k_iᵀ)diag(α_i)S_{i−1} + k_i y_iᵀ started from 0, whence
//     ‖x̃_i‖ ≤ ‖ỹ_i‖ + β_i‖k_i‖² Σ_{j<i}‖ỹ_j‖; so every row/column sum of |L̃⁻¹| is ≤ λ := 1+η(C−1).
// Rounding: each Γ_ij is a product of ≤ C factors; entries of Ñ carry relative error
// (2dk + C + 4)u; forward substitution has backward error γ_C|L| (Higham Thm 8.5; diagonal = 1
// exactly), so |ΔL̃| ≤ (2dk+2C+4)u(I + η·strict-lower ones); the rhs carries
// ‖Δỹ_i‖ ≤ (2dk+C+6)u·2ηΣ. By the componentwise (Skeel) forward error bound
// |Δx̃| ≤ |L̃⁻¹|(|ΔL̃||x̃| + |Δỹ|), summed over the C rows:
//   Σ_j ‖Δx̃_j‖ ≤ C·λ·[λ(2dk+2C+4) + (2dk+C+6)]·2η·u·Σ.
// S_out = Γ_C0 S_0 + Σ_j (Γ_Cj∘k_j)U_jᵀ and O_i add (2C+dk+3)u(‖S_0‖ + Σ_j‖k_j‖‖U_j‖) ≤
// (2C+dk+3)(1+2ηC)uΣ. Together the local error of one chunk (state and outputs/(s‖q‖)) is
//   c_chunk = C·λ·[λ(2dk+2C+4) + (2dk+C+6)]·2η + (2C+dk+3)(1+2ηC)   (units uΣ).
// Across chunks errors contract by ρ = α_max^C per full chunk (≤ 1 for the ragged last one), so
// the accumulated error is ≤ c_chunk·u·Σ·(1 + min(M, 1/(1−ρ))) for M chunks.
// This is a worst-case bound (|cos θ| = 1 for all key pairs, all errors aligned); for random
// data it is orders of magnitude above the observed error. Its sharpness comes from Mpfr, where
// u = 2^-134 makes any implementation slip (a double intermediate, a wrong gate) stand out by
// dozens of orders of magnitude.

namespace bounds {

/// Σ_{m=0}^{n−1} ρ^m ≤ min(n, 1/(1−ρ)).
inline double memory(double n, double rho) {
  return rho < 1 ? std::min(n, 1.0 / (1.0 - rho)) : n;
}
inline double token_local(double dk) {
  return 3 * dk + 14;
}

/// ‖Ŝ_n − S_n‖_F / Σ after n tokens.
inline double token_state(double dk, double n, double alpha_max, double u) {
  return 2 * token_local(dk) * memory(n, alpha_max) * u;
}
/// max_t ‖ô_t − o_t‖ / (Σ·s·‖q_t‖) over n tokens.
inline double token_output(double dk, double n, double alpha_max, double u) {
  return 2 * (token_local(dk) * memory(n, alpha_max) + dk + 1) * u;
}

inline double chunk_local(double dk, double C, double eta_max) {
  const double lam = 1 + eta_max * (C - 1);
  return C * lam * (lam * (2 * dk + 2 * C + 4) + (2 * dk + C + 6)) * 2 * eta_max +
         (2 * C + dk + 3) * (1 + 2 * eta_max * C);
}
/// Bound on both the state error /Σ and the output error /(Σ·s·‖q‖) of the chunked form over n
/// tokens in chunks of C.
inline double chunk_total(double dk, double C, double eta_max, double n, double alpha_max,
                          double u) {
  const double chunks = std::ceil(n / C);
  return 2 * chunk_local(dk, C, eta_max) * (1 + memory(chunks, std::pow(alpha_max, C))) * u;
}

}  // namespace bounds

// ---- hand-worked cases shared by the recurrence, chunk and WY tests ----------------------------

// Case A: dk = 2, dv = 1, ε = 1 (eps_one()), scalar decay.
//   token 1: k = (1,0), v = 2,  α = 1/2, η = 1/2, q = (1,1)
//   token 2: k = (1,1), v = 1,  α = 1/2, η = 1,   q = (2,-1)
//   token 3: k = (0,2), v = -1, α = 1,   η = 3/4, q = (1,3)
//   β = (1/2)/2 = 1/4, 1/3, (3/4)/5 = 3/20; γ = 1/2, 1/4, 1/4.
inline HeadInputs<Rational> case_a() {
  HeadInputs<Rational> in;
  in.k = RM(3, 2, {R(1), R(0), R(1), R(1), R(0), R(2)});
  in.v = RM(3, 1, {R(2), R(1), R(-1)});
  in.q = RM(3, 2, {R(1), R(1), R(2), R(-1), R(1), R(3)});
  in.eta = RV({R(1, 2), R(1), R(3, 4)});
  in.alpha = RM(3, 1, {R(1, 2), R(1, 2), R(1)});
  return in;
}
inline Options<Rational> eps_one() {
  Options<Rational> opt;
  opt.eps = R(1);
  return opt;
}

// Case B: dk = 2, dv = 2, ε = 0, per-channel (diagonal) decay, used with S0 = I.
//   token 1: k = (1,1), v = (1,0), α = (1/2, 1), η = 1,   q = (1,0)
//   token 2: k = (2,0), v = (0,1), α = (1, 1/3), η = 1/2, q = (0,6)
inline HeadInputs<Rational> case_b() {
  HeadInputs<Rational> in;
  in.k = RM(2, 2, {R(1), R(1), R(2), R(0)});
  in.v = RM(2, 2, {R(1), R(0), R(0), R(1)});
  in.q = RM(2, 2, {R(1), R(0), R(0), R(6)});
  in.eta = RV({R(1), R(1, 2)});
  in.alpha = RM(2, 2, {R(1, 2), R(1), R(1), R(1, 3)});
  return in;
}

}  // namespace kla::test
