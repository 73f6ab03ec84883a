// projection.hpp: the tokenwise theory (loss, gradient, exact projection, proximal step,
// contraction factor) on one hand-worked example in exact rationals.
#include "test_support.hpp"

#include "kla/ref/projection.hpp"

using namespace kla::test;
using namespace kla::ref;  // the projection routines

namespace {
// dk = 2, dv = 1: S̃ = (1, 2), k = (1, 1), v = 1. S̃ᵀk = 3, e = v − S̃ᵀk = −2, ‖k‖² = 2.
const Mat<Rational> kS = RM(2, 1, {R(1), R(2)});
const Vec<Rational> kK = RV({R(1), R(1)});
const Vec<Rational> kV = RV({R(1)});
}  // namespace

TEST(ProjectionHand, LossAndGradient) {
  // L(S̃) = ½(3 − 1)² = 2; ∇L(S̃) = k (S̃ᵀk − v)ᵀ = (1,1)·2 = (2, 2).
  EXPECT_EQ(token_loss(kS, kK, kV), R(2));
  EXPECT_TRUE(exactly_equal(token_loss_gradient(kS, kK, kV), RM(2, 1, {R(2), R(2)})));
}

TEST(ProjectionHand, ExactProjection) {
  // S̃ + k eᵀ/‖k‖² = (1,2) + (1,1)(−2)/2 = (0, 1); it satisfies Sᵀk = 0 + 1 = 1 = v.
  const Mat<Rational> P = exact_projection(kS, kK, kV);
  EXPECT_TRUE(exactly_equal(P, RM(2, 1, {R(0), R(1)})));
  // Pythagoras with S* = (1, 0) (S*ᵀk = 1 = v): ‖S*−S̃‖² = 0 + 4 = 4, ‖S*−P‖² = 1 + 1 = 2,
  // ‖P−S̃‖² = 1 + 1 = 2.
  const Mat<Rational> Sstar = RM(2, 1, {R(1), R(0)});
  EXPECT_EQ(Rational((Sstar - kS).squaredNorm()), R(4));
  EXPECT_EQ(Rational((Sstar - P).squaredNorm()), R(2));
  EXPECT_EQ(Rational((P - kS).squaredNorm()), R(2));
  // It is the Kaczmarz step with η = 1, ε = 0 (no decay).
  Mat<Rational> S = kS;
  token_step<Rational>(S, Vec<Rational>::Constant(2, R(1)), kK, kV, R(1), Options<Rational>{});
  EXPECT_TRUE(exactly_equal(S, P));
  EXPECT_THROW(exact_projection(kS, Vec<Rational>(Vec<Rational>::Zero(2)), kV),
               std::invalid_argument);
}

TEST(ProjectionHand, ProximalStep) {
  // η = 1/2, ε = 1: μ = η/((1−η)‖k‖² + ε) = (1/2)/(1 + 1) = 1/4.
  const Rational mu = proximal_weight(R(2), R(1, 2), R(1));
  EXPECT_EQ(mu, R(1, 4));
  // argmin J = S̃ + μ/(1+μ‖k‖²) k eᵀ = S̃ + (1/4)/(3/2)·(1,1)(−2) = (1,2) − (1/3,1/3) = (2/3, 5/3)
  const Mat<Rational> Sp = proximal_minimizer(kS, kK, kV, mu);
  EXPECT_TRUE(exactly_equal(Sp, RM(2, 1, {R(2, 3), R(5, 3)})));
  // The KLA step has β = (1/2)/(2+1) = 1/6: S̃ + (1/6)(1,1)(−2) = (2/3, 5/3) as well.
  Options<Rational> opt;
  opt.eps = R(1);
  Mat<Rational> S = kS;
  token_step<Rational>(S, Vec<Rational>::Constant(2, R(1)), kK, kV, R(1, 2), opt);
  EXPECT_TRUE(exactly_equal(S, Sp));
  // J(Sp) = ½‖Sp − S̃‖² + μ·½(Spᵀk − v)² = ½(1/9 + 1/9) + (1/4)·½(7/3 − 1)² = 1/9 + 2/9 = 1/3
  EXPECT_EQ(proximal_objective(Sp, kS, kK, kV, mu), R(1, 3));
  // ∇J(Sp) = (Sp − S̃) + μ k (Spᵀk − v) = (−1/3,−1/3) + (1/4)(1,1)(4/3) = 0
  EXPECT_TRUE(exactly_equal(proximal_gradient(Sp, kS, kK, kV, mu), Mat<Rational>::Zero(2, 1)));
  // ∇J(S̃) = 0 + (1/4)(1,1)(2) = (1/2, 1/2)
  EXPECT_TRUE(exactly_equal(proximal_gradient(kS, kS, kK, kV, mu), RM(2, 1, {R(1, 2), R(1, 2)})));
  // J(S̃) = μ·L(S̃) = (1/4)·2 = 1/2 > J(Sp)
  EXPECT_EQ(proximal_objective(kS, kS, kK, kV, mu), R(1, 2));
}

TEST(ProjectionHand, ProximalWeightDomain) {
  // μ is undefined for η = 1, ε = 0 (exact projection) and for k = 0, ε = 0.
  EXPECT_THROW(proximal_weight(R(2), R(1), R(0)), std::invalid_argument);
  EXPECT_THROW(proximal_weight(R(0), R(1, 2), R(0)), std::invalid_argument);
  // η = 1, ε = 1/2: μ = 1/(0 + 1/2) = 2.
  EXPECT_EQ(proximal_weight(R(2), R(1), R(1, 2)), R(2));
}

TEST(ProjectionHand, ContractionFactor) {
  // 1 − η‖k‖²/(‖k‖²+ε): (‖k‖²=2, η=1/2, ε=1) -> 1 − (1/2)(2/3) = 2/3
  EXPECT_EQ(contraction_factor(R(2), R(1, 2), R(1)), R(2, 3));
  EXPECT_EQ(contraction_factor(R(4), R(1), R(0)), R(0));  // exact projection kills the residual
  EXPECT_EQ(contraction_factor(R(0), R(1), R(0)), R(1));  // degenerate: state only decays
  // The new residual is the factor times the old one: v − Spᵀk = 1 − 7/3 = −4/3 = (2/3)(−2).
  Options<Rational> opt;
  opt.eps = R(1);
  Mat<Rational> S = kS;
  token_step<Rational>(S, Vec<Rational>::Constant(2, R(1)), kK, kV, R(1, 2), opt);
  EXPECT_EQ(Rational(kV(0) - (S.transpose() * kK)(0)), R(-4, 3));
}
