// decay.hpp: Γ(i,j) = γ_i/γ_j = α_{j+1}⋯α_i by hand, for scalar, diagonal and absent decay, and
// the floating-point contract (direct products, no quotient, no underflow of γ_i itself).
#include "test_support.hpp"

#include "kla/ref/decay.hpp"

using namespace kla::test;
using kla::ref::DecayTable;
using kla::ref::weighted_dot;

namespace {
HeadInputs<Rational> inputs_with_alpha(const Mat<Rational>& alpha, Idx dk) {
  HeadInputs<Rational> in;
  const Idx n = alpha.rows();
  in.k = Mat<Rational>::Zero(n, dk);
  in.q = Mat<Rational>::Zero(n, dk);
  in.v = Mat<Rational>::Zero(n, 1);
  in.eta = Vec<Rational>::Constant(n, R(1));
  in.alpha = alpha;
  return in;
}
}  // namespace

TEST(DecayHand, ScalarWholeSequence) {
  // α = (1/2, 1/3, 1/5): γ = (1/2, 1/6, 1/30).
  const auto in = inputs_with_alpha(RM(3, 1, {R(1, 2), R(1, 3), R(1, 5)}), 2);
  const DecayTable<Rational> g(in, 0, 3);
  EXPECT_EQ(g.length(), 3);
  auto both = [](const Rational& x) { return RV({x, x}); };
  for (Idx i = 0; i <= 3; ++i) EXPECT_TRUE(exactly_equal(g(i, i), both(R(1))));
  EXPECT_TRUE(exactly_equal(g(1, 0), both(R(1, 2))));
  EXPECT_TRUE(exactly_equal(g(2, 0), both(R(1, 6))));   // 1/2 · 1/3
  EXPECT_TRUE(exactly_equal(g(3, 0), both(R(1, 30))));  // 1/2 · 1/3 · 1/5
  EXPECT_TRUE(exactly_equal(g(2, 1), both(R(1, 3))));   // γ2/γ1 = α2
  EXPECT_TRUE(exactly_equal(g(3, 1), both(R(1, 15))));  // α2 α3
  EXPECT_TRUE(exactly_equal(g(3, 2), both(R(1, 5))));   // α3
}

TEST(DecayHand, ScalarOffsetChunk) {
  // Tokens 2..3 (start = 1, len = 2): local γ = (1/3, 1/15).
  const auto in = inputs_with_alpha(RM(3, 1, {R(1, 2), R(1, 3), R(1, 5)}), 1);
  const DecayTable<Rational> g(in, 1, 2);
  EXPECT_EQ(g(1, 0)(0), R(1, 3));
  EXPECT_EQ(g(2, 0)(0), R(1, 15));
  EXPECT_EQ(g(2, 1)(0), R(1, 5));
}

TEST(DecayHand, Diagonal) {
  // Per channel: α1 = (1/2, 1), α2 = (1/3, 2/3), α3 = (1, 1/4).
  const auto in = inputs_with_alpha(RM(3, 2, {R(1, 2), R(1), R(1, 3), R(2, 3), R(1), R(1, 4)}), 2);
  const DecayTable<Rational> g(in, 0, 3);
  EXPECT_TRUE(exactly_equal(g(1, 0), RV({R(1, 2), R(1)})));
  EXPECT_TRUE(exactly_equal(g(2, 0), RV({R(1, 6), R(2, 3)})));  // (1/2·1/3, 1·2/3)
  EXPECT_TRUE(exactly_equal(g(3, 0), RV({R(1, 6), R(1, 6)})));  // (1/6·1, 2/3·1/4)
  EXPECT_TRUE(exactly_equal(g(3, 1), RV({R(1, 3), R(1, 6)})));  // α2∘α3
  EXPECT_TRUE(exactly_equal(g(3, 2), RV({R(1), R(1, 4)})));     // α3
}

TEST(DecayHand, AbsentDecayIsOne) {
  auto in = inputs_with_alpha(Mat<Rational>(), 3);
  in.k = Mat<Rational>::Zero(4, 3);
  in.q = in.k;
  in.v = Mat<Rational>::Zero(4, 1);
  in.eta = Vec<Rational>::Constant(4, R(1));
  const DecayTable<Rational> g(in, 0, 4);
  for (Idx i = 0; i <= 4; ++i)
    for (Idx j = 0; j <= i; ++j)
      EXPECT_TRUE(exactly_equal(g(i, j), Vec<Rational>(Vec<Rational>::Ones(3))));
}

TEST(DecayHand, WeightedDot) {
  // (1,2)ᵀ diag(1/2, 1/3) (3,4) = 3/2 + 8/3 = 25/6
  EXPECT_EQ(weighted_dot<Rational>(RV({R(1), R(2)}), RV({R(1, 2), R(1, 3)}), RV({R(3), R(4)})),
            R(25, 6));
}

TEST(DecayDouble, StrongDecayNoUnderflowAndSmallError) {
  // 64 tokens with α ∈ [1e-3, 1e-2]: γ_64 ≈ 1e-160 is a normal double, Γ(i,i−1) = α_i exactly
  // (no quotient of cumulative products), and every Γ(i,j) — a product of i−j factors — is within
  // (i−j)·u·(1 + small) of the exact product of the given α's (computed here in Mpfr).
  KLA_SEEDED_RNG(rng);
  std::uniform_real_distribution<double> a(1e-3, 1e-2);
  const Idx n = 64;
  HeadInputs<double> in;
  in.k = Mat<double>::Zero(n, 1);
  in.q = in.k;
  in.v = in.k;
  in.eta = Vec<double>::Ones(n);
  in.alpha.resize(n, 1);
  for (Idx t = 0; t < n; ++t) in.alpha(t, 0) = a(rng);
  const DecayTable<double> g(in, 0, n);
  const double u = ScalarTraits<double>::unit_roundoff();
  for (Idx i = 1; i <= n; ++i) {
    EXPECT_EQ(g(i, i - 1)(0), in.alpha(i - 1, 0));
    Mpfr exact(1);
    for (Idx j = i - 1; j >= 0; --j) {
      exact *= Mpfr(in.alpha(j, 0));
      const double got = g(i, j)(0);
      ASSERT_GT(got, 0.0) << "underflow at (" << i << "," << j << ")";
      ASSERT_TRUE(std::isnormal(got));
      const double rel = to_double(abs(Mpfr(got) - exact) / exact);
      ASSERT_LE(rel, 1.01 * double(i - j) * u) << "(" << i << "," << j << ")";
    }
  }
}
