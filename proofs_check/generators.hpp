// RapidCheck generators of exact inputs for the proof checks. Every value is a Rational with a
// small numerator and denominator, so it is exactly representable and the checks compare with
// `==`, no tolerance. Corners (ε = 0, η = 1, α = 1, k = 0) are drawn on purpose.
#pragma once

#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "kla/ref.hpp"

namespace kla::ref {
// Counterexamples print as Eigen matrices.
inline void showValue(const Mat<Rational>& m, std::ostream& os) {
  os << "[" << m.rows() << "x" << m.cols() << "]\n" << m;
}
inline void showValue(const Vec<Rational>& v, std::ostream& os) {
  os << "[" << v.size() << "] " << v.transpose();
}
inline void showValue(const HeadInputs<Rational>& in, std::ostream& os) {
  os << "HeadInputs T=" << in.length() << " dk=" << in.dk() << " dv=" << in.dv() << "\nk=\n"
     << in.k << "\nv=\n"
     << in.v << "\nq=\n"
     << in.q << "\neta=" << in.eta.transpose() << "\nalpha=\n"
     << in.alpha;
}
}  // namespace kla::ref

namespace kla::proofs {

using ref::Mat;
using ref::Rational;
using ref::Vec;
using Q = Rational;
using Idx = Eigen::Index;

/// p/q with |p| ≤ num_max and q from a small set (dyadic and non-dyadic).
inline rc::Gen<Q> rational(int num_max = 8) {
  return rc::gen::apply([](int p, int q) { return Q(p) / Q(q); },
                        rc::gen::inRange(-num_max, num_max + 1),
                        rc::gen::element(1, 2, 3, 4, 5, 7, 8, 16));
}

/// A rational in (0, 1], with 1 drawn often.
inline rc::Gen<Q> unit_interval() {
  return rc::gen::weightedOneOf<Q>(
      {{1, rc::gen::just(Q(1))},
       {3, rc::gen::apply([](int p, int q) { return Q(std::min(p, q)) / Q(q); },
                          rc::gen::inRange(1, 17), rc::gen::element(1, 2, 3, 4, 5, 8, 16))}});
}

/// A rational in (0, 1), never 1: numerator 1..q-1 over a small q (dyadic and non-dyadic).
inline rc::Gen<Q> proper_fraction() {
  return rc::gen::apply([](int p, int q) { return Q(1 + p % (q - 1)) / Q(q); },
                        rc::gen::inRange(0, 16), rc::gen::element(2, 3, 4, 5, 7, 8, 16));
}

/// A rational p/q > 0.
inline rc::Gen<Q> positive_rational(int num_max = 8) {
  return rc::gen::apply([](int p, int q) { return Q(p) / Q(q); }, rc::gen::inRange(1, num_max + 1),
                        rc::gen::element(1, 2, 3, 4, 5, 7, 8, 16));
}

/// η ∈ (0, 1] with the corner η = 1.
inline rc::Gen<Q> eta() {
  return unit_interval();
}
/// α ∈ (0, 1] with the corner α = 1 (no decay) one time in four. The rest is a proper decay
/// α < 1 (unit_interval() alone gives 1 most of the time at large sizes), so that faults in the
/// decay bookkeeping (γ ratios off by one token) cannot hide behind α = 1.
inline rc::Gen<Q> alpha() {
  return rc::gen::weightedOneOf<Q>({{1, rc::gen::just(Q(1))}, {3, proper_fraction()}});
}
/// ε ≥ 0 with the corner ε = 0, small and large values.
inline rc::Gen<Q> eps() {
  return rc::gen::weightedOneOf<Q>(
      {{2, rc::gen::just(Q(0))},
       {2, rc::gen::apply([](int p, int q) { return Q(p) / Q(q); }, rc::gen::inRange(1, 9),
                          rc::gen::element(1, 4, 64, 1024))}});
}
/// ε > 0 (for statements that exclude ε = 0).
inline rc::Gen<Q> positive_eps() {
  return rc::gen::apply([](int p, int q) { return Q(p) / Q(q); }, rc::gen::inRange(1, 9),
                        rc::gen::element(1, 4, 64, 1024));
}

inline rc::Gen<Vec<Q>> vector(Idx n) {
  return rc::gen::map(rc::gen::container<std::vector<Q>>(static_cast<size_t>(n), rational()),
                      [n](const std::vector<Q>& xs) {
                        Vec<Q> v(n);
                        for (Idx i = 0; i < n; ++i) v(i) = xs[static_cast<size_t>(i)];
                        return v;
                      });
}
/// A key that is nonzero (statements that divide by ‖k‖²).
inline rc::Gen<Vec<Q>> nonzero_vector(Idx n) {
  return rc::gen::suchThat(vector(n), [](const Vec<Q>& v) { return v.squaredNorm() != Q(0); });
}
/// A key that is zero one time in eight (the degenerate corner).
inline rc::Gen<Vec<Q>> key(Idx n) {
  return rc::gen::weightedOneOf<Vec<Q>>(
      {{1, rc::gen::just(Vec<Q>(Vec<Q>::Zero(n)))}, {7, vector(n)}});
}

inline rc::Gen<Mat<Q>> matrix(Idx rows, Idx cols) {
  return rc::gen::map(
      rc::gen::container<std::vector<Q>>(static_cast<size_t>(rows * cols), rational()),
      [rows, cols](const std::vector<Q>& xs) {
        Mat<Q> m(rows, cols);
        for (Idx i = 0; i < rows; ++i)
          for (Idx j = 0; j < cols; ++j) m(i, j) = xs[static_cast<size_t>(i * cols + j)];
        return m;
      });
}

/// A dimension in [1, max] (SPEC §2: dk, dv in 1..16).
inline Idx dim(int max = 16) {
  return *rc::gen::inRange(1, max + 1);
}

enum class DecayKind { none, scalar, diagonal };

/// One head of T tokens: keys with the k = 0 corner, η ∈ (0,1], decay of the given kind.
inline ref::HeadInputs<Q> head_inputs(Idx T, Idx dk, Idx dv, DecayKind decay) {
  ref::HeadInputs<Q> in;
  in.q.resize(T, dk);
  in.k.resize(T, dk);
  in.v.resize(T, dv);
  in.eta.resize(T);
  if (decay == DecayKind::scalar) in.alpha.resize(T, 1);
  if (decay == DecayKind::diagonal) in.alpha.resize(T, dk);
  for (Idx t = 0; t < T; ++t) {
    in.q.row(t) = (*vector(dk)).transpose();
    in.k.row(t) = (*key(dk)).transpose();
    in.v.row(t) = (*vector(dv)).transpose();
    in.eta(t) = *eta();
    for (Idx c = 0; c < in.alpha.cols(); ++c) in.alpha(t, c) = *alpha();
  }
  return in;
}

/// An integer uniform in [lo, hi], NOT scaled by RapidCheck's size (shrinks towards lo). For
/// sequence and chunk lengths, whose coverage must not depend on the size schedule.
inline Idx uniform(Idx lo, Idx hi) {
  std::vector<Idx> xs;
  for (Idx i = lo; i <= hi; ++i) xs.push_back(i);
  return *rc::gen::elementOf(xs);
}

/// The decay of one token as a per-channel vector: scalar α broadcast, or one α per channel.
inline Vec<Q> decay_vector(Idx dk, bool diagonal) {
  if (!diagonal) return Vec<Q>::Constant(dk, *alpha());
  Vec<Q> a(dk);
  for (Idx c = 0; c < dk; ++c) a(c) = *alpha();
  return a;
}

/// Options over the rationals: ε with its corners, a nonzero read-out scale and the Kaczmarz
/// coefficient, or (one time in four, when `allow_given`) the given GDN coefficient β = η.
inline ref::Options<Q> options(bool allow_given = true) {
  ref::Options<Q> opt;
  opt.eps = *eps();
  if (allow_given && *rc::gen::element(false, false, false, true))
    opt.coefficient = ref::Coefficient::given;
  opt.scale = *rc::gen::weightedOneOf<Q>({{1, rc::gen::just(Q(1))}, {1, positive_rational()}});
  return opt;
}

inline DecayKind any_decay() {
  return *rc::gen::element(DecayKind::none, DecayKind::scalar, DecayKind::diagonal);
}

/// One token's setting, shared by the tokenwise statements: incoming state, decay (scalar or
/// per-channel), key and value, and what every statement derives from them.
struct TokenCase {
  Idx dk, dv;
  Mat<Q> S_prev;
  Vec<Q> a, k, v;
  Q kk;            ///< ‖k‖²
  Mat<Q> S_tilde;  ///< diag(a) S_prev
  Vec<Q> e;        ///< v − S̃ᵀk
};

/// Draws a TokenCase; `nonzero_key` excludes the k = 0 corner (statements that divide by ‖k‖²).
inline TokenCase token_case(bool nonzero_key) {
  TokenCase c;
  c.dk = dim();
  c.dv = dim();
  c.S_prev = *matrix(c.dk, c.dv);
  c.a = decay_vector(c.dk, any_decay() == DecayKind::diagonal);
  c.k = nonzero_key ? *nonzero_vector(c.dk) : *key(c.dk);
  c.v = *vector(c.dv);
  c.kk = c.k.squaredNorm();
  c.S_tilde = c.a.asDiagonal() * c.S_prev;
  c.e = c.v - c.S_tilde.transpose() * c.k;
  return c;
}

/// sqrt(x) when x ≥ 0 is the square of a rational, else -1.
inline Q rational_sqrt(const Q& x) {
  using boost::multiprecision::mpz_int;
  const mpz_int n = boost::multiprecision::numerator(x), d = boost::multiprecision::denominator(x);
  if (n < 0) return Q(-1);
  const mpz_int sn = boost::multiprecision::sqrt(n), sd = boost::multiprecision::sqrt(d);
  if (sn * sn != n || sd * sd != d) return Q(-1);
  return Q(sn) / Q(sd);
}

/// A rational vector of norm 1: inverse stereographic projection of y ∈ Q^{dk-1}, s = ‖y‖²,
/// u = ((1−s), 2y)/(1+s), cyclically shifted, random sign.
inline Vec<Q> unit_direction(Idx dk) {
  Vec<Q> u(dk);
  if (dk == 1) {
    u(0) = Q(1);
  } else {
    const Vec<Q> y = *vector(dk - 1);
    const Q s = y.squaredNorm();
    Vec<Q> w(dk);
    w(0) = Q(1) - s;
    w.tail(dk - 1) = Q(2) * y;
    const Idx shift = uniform(0, dk - 1);
    for (Idx c = 0; c < dk; ++c) u((c + shift) % dk) = w(c) / (Q(1) + s);
  }
  return *rc::gen::element(false, true) ? Vec<Q>(-u) : u;
}

/// Redraws the keys of `in` so that every norm r_t = sqrt(‖k_t‖²+ε) is rational, and returns r
/// (the normalised-key form k̂ = k/r, v̂ = v/r is then exact). Per token, k = ρu with u a
/// unit_direction, ‖k‖² = ρ². For ε > 0 draw a > 0 and set ρ = (ε/a − a)/2, r = (ε/a + a)/2,
/// so r² − ρ² = ε (ρ = 0 when a² = ε gives a zero key); for ε = 0 draw ρ ≠ 0 and set r = |ρ|.
/// One token in eight has k = 0 when ε is a rational square (r = sqrt(ε), or r = 0 for ε = 0,
/// the degenerate β = 0 token).
inline Vec<Q> keys_with_rational_norms(ref::HeadInputs<Q>& in, const Q& eps) {
  const Idx T = in.length(), dk = in.dk();
  const Q root_eps = rational_sqrt(eps);
  Vec<Q> r(T);
  for (Idx t = 0; t < T; ++t) {
    if (root_eps >= Q(0) && *rc::gen::element(0, 1, 2, 3, 4, 5, 6, 7) == 0) {
      in.k.row(t).setZero();
      r(t) = root_eps;
      continue;
    }
    Q rho;
    if (eps > Q(0)) {
      const Q a = *positive_rational();
      rho = (eps / a - a) / Q(2);
      r(t) = (eps / a + a) / Q(2);
    } else {
      rho = *rc::gen::suchThat(rational(), [](const Q& x) { return x != Q(0); });
      r(t) = rho > Q(0) ? rho : Q(-rho);
    }
    in.k.row(t) = (rho * unit_direction(dk)).transpose();
  }
  return r;
}

/// A random cut of T tokens into segments (seg.*): lengths summing to T, empty segments one in
/// four, sometimes an empty last one, so one segment, one token each and zeros all occur.
inline std::vector<Idx> segment_lengths(Idx T) {
  std::vector<Idx> lengths;
  for (Idx left = T; left > 0;) {
    const Idx n = *rc::gen::element(0, 1, 2, 3) == 0 ? 0 : uniform(1, left);
    lengths.push_back(n);
    left -= n;
  }
  if (*rc::gen::element(false, false, true)) lengths.push_back(0);  // an empty last segment
  return lengths;
}

/// Exact-equality assertion for matrices that names what differed.
inline void require_equal(const Mat<Q>& a, const Mat<Q>& b, const char* what) {
  if (a.rows() != b.rows() || a.cols() != b.cols() || a != b) {
    std::ostringstream os;
    os << what << " differ:\n" << a << "\n  vs\n" << b;
    RC_FAIL(os.str());
  }
}

/// Exact equality of every gradient of two backward passes (dq, dk, dv, dη, dα, dS_0); `names`
/// names the two ("chunked and tokenwise").
inline void require_equal(const kla::ref::HeadGradients<Q>& a, const kla::ref::HeadGradients<Q>& b,
                          const std::string& names) {
  require_equal(a.q, b.q, (names + " dq").c_str());
  require_equal(a.k, b.k, (names + " dk").c_str());
  require_equal(a.v, b.v, (names + " dv").c_str());
  require_equal(a.eta, b.eta, (names + " d eta").c_str());
  require_equal(a.alpha, b.alpha, (names + " d alpha").c_str());
  require_equal(a.state, b.state, (names + " dS_0").c_str());
}

}  // namespace kla::proofs
