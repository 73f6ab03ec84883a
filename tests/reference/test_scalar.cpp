// scalar.hpp: the traits must describe the arithmetic the types really perform, and scalar_cast
// must convert with one rounding (exactly when the value is representable).
#include <cmath>

#include "test_support.hpp"

using namespace kla::test;
using kla::ref::sqrt_of;

namespace {

/// 2^e as a rational (exact).
Rational pow2(int e) {
  Rational r(1);
  for (int i = 0; i < std::abs(e); ++i) r = e > 0 ? Rational(r * 2) : Rational(r / 2);
  return r;
}

/// 1 + 2^-p must be representable (distinct from 1) in T and 1 + 2^-(p+1) must round to 1
/// (a tie, rounded to even), where p + 1 = precision_bits(): the precision the traits claim
/// is the one the arithmetic has.
template <class T>
void expect_precision_matches_arithmetic() {
  const int p = ScalarTraits<T>::precision_bits();
  ASSERT_GT(p, 0);
  const T one(1);
  const T ulp = scalar_cast<T>(pow2(-(p - 1)));  // spacing of T just above 1
  const T half_ulp = scalar_cast<T>(pow2(-p));   // = u, the unit roundoff
  EXPECT_EQ(to_double(ulp), std::ldexp(1.0, -(p - 1)));
  EXPECT_TRUE(T(one + ulp) != one) << ScalarTraits<T>::name();
  EXPECT_TRUE(T(one + half_ulp) == one) << ScalarTraits<T>::name() << ": a tie must round to even";
  // 1 + 3u/2 lies above the tie: it must round up to 1 + ulp (round to nearest, not truncation).
  const T above_tie = scalar_cast<T>(Rational(pow2(-p) * 3 / 2));
  EXPECT_TRUE(T(one + above_tie) == T(one + ulp)) << ScalarTraits<T>::name();
  EXPECT_EQ(ScalarTraits<T>::unit_roundoff(), std::ldexp(1.0, -p));
}

}  // namespace

TEST(ScalarTraits, NamesAndExactness) {
  EXPECT_TRUE(ScalarTraits<Rational>::exact);
  EXPECT_FALSE(ScalarTraits<Rational>::has_transcendentals);
  EXPECT_EQ(ScalarTraits<Rational>::precision_bits(), 0);
  EXPECT_EQ(ScalarTraits<Rational>::unit_roundoff(), 0.0);
  EXPECT_FALSE(ScalarTraits<double>::exact);
  EXPECT_EQ(ScalarTraits<double>::name(), "fp64");
  EXPECT_EQ(ScalarTraits<float>::name(), "fp32");
  EXPECT_EQ(ScalarTraits<bf16>::name(), "bf16");
  EXPECT_EQ(ScalarTraits<fp16>::name(), "fp16");
  EXPECT_EQ(ScalarTraits<Rational>::name(), "rational");
  EXPECT_EQ(ScalarTraits<Mpfr>::name(),
            "mpfr" + std::to_string(ScalarTraits<Mpfr>::precision_bits()));
}

TEST(ScalarTraits, UnitRoundoffByHand) {
  // IEEE binary64: 53-bit significand; binary32: 24; bfloat16: 8; binary16: 11.
  EXPECT_EQ(ScalarTraits<double>::unit_roundoff(), std::ldexp(1.0, -53));
  EXPECT_EQ(ScalarTraits<float>::unit_roundoff(), std::ldexp(1.0, -24));
  EXPECT_EQ(ScalarTraits<bf16>::unit_roundoff(), std::ldexp(1.0, -8));
  EXPECT_EQ(ScalarTraits<fp16>::unit_roundoff(), std::ldexp(1.0, -11));
  // The ground truth must carry at least 100 bits (SPEC §5); 40 decimal digits need
  // ceil(40·log2 10) = 133 bits, Boost may add a guard bit.
  EXPECT_GE(ScalarTraits<Mpfr>::precision_bits(), 133);
  EXPECT_LE(ScalarTraits<Mpfr>::precision_bits(), 140);
}

TEST(ScalarTraits, PrecisionMatchesArithmeticDouble) {
  expect_precision_matches_arithmetic<double>();
}
TEST(ScalarTraits, PrecisionMatchesArithmeticFloat) {
  expect_precision_matches_arithmetic<float>();
}
TEST(ScalarTraits, PrecisionMatchesArithmeticBf16) {
  expect_precision_matches_arithmetic<bf16>();
}
TEST(ScalarTraits, PrecisionMatchesArithmeticFp16) {
  expect_precision_matches_arithmetic<fp16>();
}
TEST(ScalarTraits, PrecisionMatchesArithmeticMpfr) {
  expect_precision_matches_arithmetic<Mpfr>();
}

TEST(ScalarCast, ExactWhenRepresentable) {
  // 0.375 = 3/8 and -1.25 = -5/4 are representable in every type.
  EXPECT_EQ(scalar_cast<Rational>(0.375), R(3, 8));
  EXPECT_EQ(scalar_cast<Rational>(-1.25f), R(-5, 4));
  EXPECT_EQ(scalar_cast<Rational>(bf16(-1.25f)), R(-5, 4));
  EXPECT_EQ(scalar_cast<Rational>(fp16(0.375f)), R(3, 8));
  EXPECT_EQ(scalar_cast<double>(R(3, 8)), 0.375);
  EXPECT_EQ(static_cast<float>(scalar_cast<bf16>(R(-5, 4))), -1.25f);
  EXPECT_EQ(static_cast<float>(scalar_cast<fp16>(Mpfr(0.375))), 0.375f);
  EXPECT_EQ(scalar_cast<Mpfr>(R(-5, 4)), Mpfr(-1.25));
  // A double with all 53 bits used survives double -> Rational -> Mpfr -> double.
  const double x = 1.0 / 3.0;
  EXPECT_EQ(scalar_cast<double>(scalar_cast<Mpfr>(scalar_cast<Rational>(x))), x);
  EXPECT_EQ(scalar_cast<Rational>(x) * 3, Rational(1) - pow2(-54) * 1);  // 3·fl(1/3) = 1 − 2^-54
}

TEST(ScalarCast, RoundsToNearest) {
  // 1/10 = 0x1.999999999999a p-4 in binary64 (round up), 0x1.99999a p-4 in binary32.
  EXPECT_EQ(scalar_cast<double>(R(1, 10)), 0x1.999999999999ap-4);
  EXPECT_EQ(scalar_cast<double>(R(-1, 10)), -0x1.999999999999ap-4);
  EXPECT_EQ(scalar_cast<float>(R(1, 10)), 0x1.99999ap-4f);
  EXPECT_EQ(scalar_cast<double>(Mpfr(1) / 10), 0x1.999999999999ap-4);
  EXPECT_EQ(scalar_cast<float>(0.1), 0x1.99999ap-4f);
  // bf16 keeps 8 bits: 1/10 = 1.1001100110011..b × 2^-4 -> 1.1001101b × 2^-4 = 0x1.9ap-4.
  EXPECT_EQ(static_cast<float>(scalar_cast<bf16>(R(1, 10))), 0x1.9ap-4f);
  // fp16 keeps 11 bits: 1.1001100110|011..b -> 1.1001100110b = 0x1.998p-4.
  EXPECT_EQ(static_cast<float>(scalar_cast<fp16>(R(1, 10))), 0x1.998p-4f);
}

TEST(ScalarCast, OneRoundingNearTiesBf16Fp16) {
  // scalar.hpp promises one rounding. Values just above a bf16/fp16 tie expose a double
  // rounding through float: x = 1 + 2^-8 + 2^-30 is nearer to 1 + 2^-7 than to 1 in bf16, but
  // rounding to float first gives the exact tie 1 + 2^-8, which then rounds to even (1).
  const double xb = 1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(static_cast<float>(scalar_cast<bf16>(xb)), 1.0f + 0x1p-7f);
  EXPECT_EQ(static_cast<float>(scalar_cast<bf16>(scalar_cast<Rational>(xb))), 1.0f + 0x1p-7f);
  EXPECT_EQ(static_cast<float>(scalar_cast<bf16>(scalar_cast<Mpfr>(xb))), 1.0f + 0x1p-7f);
  const double xh = 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  EXPECT_EQ(static_cast<float>(scalar_cast<fp16>(xh)), 1.0f + 0x1p-10f);
}

TEST(ScalarCast, FloatToBf16IsSingleRounding) {
  // From float the conversion is direct: 1 + 2^-8 + 2^-20 (above the tie) rounds up.
  EXPECT_EQ(static_cast<float>(scalar_cast<bf16>(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(static_cast<float>(scalar_cast<bf16>(1.0f + 0x1p-8f)), 1.0f);  // tie -> even
  EXPECT_EQ(static_cast<float>(scalar_cast<fp16>(1.0f + 0x1p-11f + 0x1p-20f)), 1.0f + 0x1p-10f);
}

TEST(ScalarOps, SqrtExpAndFiniteness) {
  EXPECT_EQ(sqrt_of(2.25), 1.5);
  EXPECT_EQ(static_cast<float>(sqrt_of(bf16(2.25f))), 1.5f);
  // sqrt(2) in Mpfr squared is 2 to within 2 ulps of its 134-bit precision.
  const Mpfr s = sqrt_of(Mpfr(2));
  EXPECT_LT(to_double(abs(s * s - 2)), std::ldexp(1.0, 2 - ScalarTraits<Mpfr>::precision_bits()));
  EXPECT_GT(to_double(abs(s - Mpfr(1.4142135623730951))), 0.0);  // really more than double
  EXPECT_EQ(kla::ref::exp_of(0.0), 1.0);
  EXPECT_TRUE(kla::ref::is_finite(R(1, 3)));
  EXPECT_FALSE(kla::ref::is_finite(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(kla::ref::is_finite(std::nan("")));
  EXPECT_FALSE(kla::ref::is_finite(fp16(70000.0f)));  // above fp16's max 65504 -> inf
}
