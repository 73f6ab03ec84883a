// Scalar policies for the reference. Every algorithm in kla::ref is a template over the scalar
// type T; this header names the types we instantiate and the few operations that differ
// between them (square root, exponential, conversions). Algorithms never name a concrete type.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <boost/multiprecision/gmp.hpp>
#include <boost/multiprecision/mpfr.hpp>
// Eigen interop (NumTraits for Boost numbers) must come after the number types.
#include <boost/multiprecision/eigen.hpp>
#include <Eigen/Core>

namespace kla::ref {

namespace bmp = boost::multiprecision;

/// Exact rational arithmetic (GMP). Expression templates off: Eigen needs plain value types.
using Rational = bmp::number<bmp::gmp_rational, bmp::et_off>;
/// Multiprecision binary float (MPFR) with `Digits10` decimal digits.
template <unsigned Digits10>
using MpfrFloat = bmp::number<bmp::mpfr_float_backend<Digits10>, bmp::et_off>;
/// The reference's ground truth for rounded computations: 40 decimal digits, 134 significand bits.
using Mpfr = MpfrFloat<40>;
/// Emulated low precision: every arithmetic operation rounds to the 8-bit (bf16) or 11-bit
/// (fp16) significand, so low-precision behaviour can be studied on the CPU.
using bf16 = Eigen::bfloat16;
using fp16 = Eigen::half;

template <class T>
inline constexpr bool is_exact_v = std::is_same_v<T, Rational>;

/// Scalar traits: name, precision and whether sqrt/exp exist (they do not for rationals).
template <class T>
struct ScalarTraits {
  static constexpr bool exact = is_exact_v<T>;
  static constexpr bool has_transcendentals = !exact;
  /// Bits in the significand including the implicit bit (0 = exact).
  static int precision_bits() {
    if constexpr (exact)
      return 0;
    else if constexpr (std::is_same_v<T, bf16>)
      return 8;
    else if constexpr (std::is_same_v<T, fp16>)
      return 11;
    else
      return std::numeric_limits<T>::digits;
  }
  /// Unit roundoff u = 2^-p (0 for exact arithmetic).
  static double unit_roundoff() {
    const int p = precision_bits();
    return p == 0 ? 0.0 : std::ldexp(1.0, -p);
  }
  static std::string name() {
    if constexpr (exact)
      return "rational";
    else if constexpr (std::is_same_v<T, bf16>)
      return "bf16";
    else if constexpr (std::is_same_v<T, fp16>)
      return "fp16";
    else if constexpr (std::is_same_v<T, float>)
      return "fp32";
    else if constexpr (std::is_same_v<T, double>)
      return "fp64";
    else
      return "mpfr" + std::to_string(precision_bits());
  }
};

namespace detail {

template <class L>
L from_bits(std::uint16_t b) {
  return Eigen::numext::bit_cast<L>(b);
}
template <class L>
std::uint16_t to_bits(L x) {
  return Eigen::numext::bit_cast<std::uint16_t>(x);
}

/// x rounded once, to nearest with ties to even, into the 16-bit type L. Converting through
/// float would round twice (x → float lands on a tie that the second rounding breaks the wrong
/// way), so the candidate from float is corrected: the answer is it or one of its neighbours,
/// and their distances to x are exact in U (Sterbenz; U = Rational is exact anyway).
template <class L, class U>
L round_to_16bit(const U& x) {
  float f;
  if constexpr (std::is_arithmetic_v<U>)
    f = static_cast<float>(x);
  else
    f = x.template convert_to<float>();
  const L guess(f);
  if (!std::isfinite(f) || x == U(0)) return guess;  // inf, NaN, beyond float; or ±0
  constexpr std::uint16_t sign_bit = 0x8000;
  const bool negative = x < U(0);
  const std::uint16_t inf_bits = to_bits(Eigen::NumTraits<L>::infinity()) & 0x7fff;
  std::uint16_t mag = to_bits(guess) & 0x7fff;
  if (mag > inf_bits) return guess;  // NaN
  auto value_of = [&](std::uint16_t m) -> U {
    // Infinity's slot stands for 2^(emax+1), one ulp past the largest finite value: x rounds
    // to infinity exactly when it is nearer to that than to the largest finite value.
    U v;
    if (m == inf_bits) {
      const U mx(static_cast<float>(from_bits<L>(static_cast<std::uint16_t>(inf_bits - 1))));
      const U pv(static_cast<float>(from_bits<L>(static_cast<std::uint16_t>(inf_bits - 2))));
      v = mx + (mx - pv);
    } else {
      v = U(static_cast<float>(from_bits<L>(m)));
    }
    return negative ? U(-v) : v;
  };
  auto distance = [&](std::uint16_t m) -> U {
    const U d = x - value_of(m);
    return d < U(0) ? U(-d) : d;
  };
  std::uint16_t best = mag;
  U best_d = distance(mag);
  for (const int step : {-1, 1}) {
    const int m = int(mag) + step;
    if (m < 0 || m > int(inf_bits)) continue;
    const U d = distance(static_cast<std::uint16_t>(m));
    if (d < best_d || (d == best_d && (m & 1) == 0)) {
      best = static_cast<std::uint16_t>(m);
      best_d = d;
    }
  }
  return from_bits<L>(static_cast<std::uint16_t>(best | (negative ? sign_bit : 0)));
}

}  // namespace detail

/// Converts any arithmetic value (double, float, Rational, Mpfr, bf16, fp16) to T with one
/// rounding to nearest, ties to even (exact when T can hold the value).
template <class T, class U>
T scalar_cast(const U& x) {
  if constexpr (std::is_same_v<T, U>) {
    return x;
  } else if constexpr (std::is_same_v<U, bf16> || std::is_same_v<U, fp16>) {
    return scalar_cast<T>(static_cast<float>(x));  // widening to float is exact
  } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) {
    if constexpr (std::is_same_v<U, float>)
      return T(x);  // Eigen's float → bf16/fp16 conversion rounds once, to nearest even
    else
      return detail::round_to_16bit<T>(x);
  } else if constexpr (std::is_arithmetic_v<T> && !std::is_arithmetic_v<U>) {
    return x.template convert_to<T>();  // correctly rounded for GMP rationals and MPFR
  } else {
    return T(x);
  }
}

template <class T>
double to_double(const T& x) {
  return scalar_cast<double>(x);
}

/// Square root. Rationals have none: calling it with T = Rational is a compile error, and
/// exact code paths take the norms they need as inputs instead (see normalized_key.hpp).
template <class T>
T sqrt_of(const T& x) {
  static_assert(ScalarTraits<T>::has_transcendentals, "sqrt is not exact over the rationals");
  using std::sqrt;
  return sqrt(x);
}

template <class T>
T exp_of(const T& x) {
  static_assert(ScalarTraits<T>::has_transcendentals, "exp is not exact over the rationals");
  using std::exp;
  return exp(x);
}

template <class T>
bool is_finite(const T& x) {
  if constexpr (ScalarTraits<T>::exact)
    return true;
  else
    return std::isfinite(to_double(x));
}

}  // namespace kla::ref
