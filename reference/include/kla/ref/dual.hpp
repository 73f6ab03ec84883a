// Dual numbers x + x'·ε with ε² = 0 over a scalar policy Q: forward-mode differentiation of any
// kla::ref routine. Seeding the tangents of the inputs with a direction δ and running the routine
// over Dual<Q> gives its value and its directional derivative J·δ in one pass; over
// Q = Rational both are exact, which is what the adjoint check of the backward pass needs
// (proofs_check/grad.adjoint.cpp: ⟨dO, J·δ⟩ = ⟨Jᵀ·dO, δ⟩ with no tolerance).
//
// Numerical contract: every operation is the exact derivative rule applied in Q (value and tangent
// each rounded as Q rounds them; exact over Rational). Comparisons look at the value part only, as
// in any forward-mode scheme: a branch (the β = 0 convention of the Kaczmarz coefficient, the
// q = 0 read-out) is taken on the value and differentiated as the branch it took. Use
// `exactly_equal` to compare both parts.
#pragma once

#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kla/ref/types.hpp"

namespace kla::ref {

template <class Q>
class Dual {
 public:
  Dual() : value_(0), tangent_(0) {}
  /// A constant (zero tangent); implicit, so literals and Q values mix with duals.
  Dual(const Q& value) : value_(value), tangent_(0) {}  // NOLINT(google-explicit-constructor)
  template <class U>
  requires std::is_arithmetic_v<U> Dual(U value)
      : value_(value), tangent_(0) {}  // NOLINT(google-explicit-constructor)
  Dual(const Q& value, const Q& tangent) : value_(value), tangent_(tangent) {}

  const Q& value() const { return value_; }
  const Q& tangent() const { return tangent_; }

  Dual& operator+=(const Dual& b) {
    value_ += b.value_;
    tangent_ += b.tangent_;
    return *this;
  }
  Dual& operator-=(const Dual& b) {
    value_ -= b.value_;
    tangent_ -= b.tangent_;
    return *this;
  }
  /// (a b)' = a' b + a b'
  Dual& operator*=(const Dual& b) {
    tangent_ = Q(tangent_ * b.value_ + value_ * b.tangent_);
    value_ *= b.value_;
    return *this;
  }
  /// (a / b)' = (a' − (a/b) b') / b
  Dual& operator/=(const Dual& b) {
    value_ /= b.value_;
    tangent_ = Q((tangent_ - value_ * b.tangent_) / b.value_);
    return *this;
  }

  friend Dual operator+(Dual a, const Dual& b) { return a += b; }
  friend Dual operator-(Dual a, const Dual& b) { return a -= b; }
  friend Dual operator*(Dual a, const Dual& b) { return a *= b; }
  friend Dual operator/(Dual a, const Dual& b) { return a /= b; }
  friend Dual operator-(const Dual& a) { return Dual(Q(-a.value_), Q(-a.tangent_)); }
  friend Dual operator+(const Dual& a) { return a; }

  // Value-part comparisons (branches follow the value; see the header comment).
  friend bool operator==(const Dual& a, const Dual& b) { return a.value_ == b.value_; }
  friend bool operator!=(const Dual& a, const Dual& b) { return a.value_ != b.value_; }
  friend bool operator<(const Dual& a, const Dual& b) { return a.value_ < b.value_; }
  friend bool operator<=(const Dual& a, const Dual& b) { return a.value_ <= b.value_; }
  friend bool operator>(const Dual& a, const Dual& b) { return a.value_ > b.value_; }
  friend bool operator>=(const Dual& a, const Dual& b) { return a.value_ >= b.value_; }

  friend std::ostream& operator<<(std::ostream& os, const Dual& a) {
    return os << "(" << a.value_ << " + " << a.tangent_ << "e)";
  }

 private:
  Q value_;
  Q tangent_;
};

/// Both parts equal (operator== compares values only).
template <class Q>
bool exactly_equal(const Dual<Q>& a, const Dual<Q>& b) {
  return a.value() == b.value() && a.tangent() == b.tangent();
}

/// |x| by the sign of the value: derivative ±x'.
template <class Q>
Dual<Q> abs(const Dual<Q>& x) {
  return x.value() < Q(0) ? Dual<Q>(-x) : x;
}

/// sqrt(x)' = x' / (2 sqrt(x)); only where Q has sqrt (never over Rational).
template <class Q>
Dual<Q> sqrt(const Dual<Q>& x) {
  const Q s = sqrt_of(x.value());
  return Dual<Q>(s, Q(x.tangent() / (Q(2) * s)));
}

/// exp(x)' = exp(x) x'; only where Q has exp.
template <class Q>
Dual<Q> exp(const Dual<Q>& x) {
  const Q e = exp_of(x.value());
  return Dual<Q>(e, Q(e * x.tangent()));
}

/// The value and tangent parts of a matrix of duals.
template <class Q>
Mat<Q> value_part(const Mat<Dual<Q>>& m) {
  return m.unaryExpr([](const Dual<Q>& x) { return x.value(); });
}
template <class Q>
Mat<Q> tangent_part(const Mat<Dual<Q>>& m) {
  return m.unaryExpr([](const Dual<Q>& x) { return x.tangent(); });
}
/// A matrix of duals from its value and tangent parts (same shape).
template <class Q>
Mat<Dual<Q>> make_dual(const Mat<Q>& value, const Mat<Q>& tangent) {
  if (value.rows() != tangent.rows() || value.cols() != tangent.cols())
    throw std::invalid_argument("kla::ref: value and tangent must have the same shape");
  Mat<Dual<Q>> m(value.rows(), value.cols());
  for (Eigen::Index i = 0; i < value.rows(); ++i)
    for (Eigen::Index j = 0; j < value.cols(); ++j) m(i, j) = Dual<Q>(value(i, j), tangent(i, j));
  return m;
}

/// Dual<Q> is exact exactly when Q is, and has sqrt/exp exactly when Q has.
template <class Q>
struct ScalarTraits<Dual<Q>> {
  static constexpr bool exact = ScalarTraits<Q>::exact;
  static constexpr bool has_transcendentals = ScalarTraits<Q>::has_transcendentals;
  static int precision_bits() { return ScalarTraits<Q>::precision_bits(); }
  static double unit_roundoff() { return ScalarTraits<Q>::unit_roundoff(); }
  static std::string name() { return "dual<" + ScalarTraits<Q>::name() + ">"; }
};

}  // namespace kla::ref

namespace Eigen {

/// Eigen sees a dual as a real, signed, non-trivially-constructed scalar costing about twice Q.
template <class Q>
struct NumTraits<kla::ref::Dual<Q>> : GenericNumTraits<kla::ref::Dual<Q>> {
  using Real = kla::ref::Dual<Q>;
  using NonInteger = Real;
  using Literal = Real;
  using Nested = Real;
  enum {
    IsComplex = 0,
    IsInteger = 0,
    IsSigned = 1,
    RequireInitialization = 1,
    ReadCost = 2,
    AddCost = 8,
    MulCost = 24,
  };
  static Real epsilon() { return Real(NumTraits<Q>::epsilon()); }
  static Real dummy_precision() { return Real(NumTraits<Q>::dummy_precision()); }
  static int digits10() { return NumTraits<Q>::digits10(); }
};

}  // namespace Eigen
