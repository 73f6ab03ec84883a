// wy.hpp: the w/u recurrences and the WY matrices P_i, H_i on case A (worked by hand), then
// random exact checks against explicit products and the independent oracle.
#include "test_support.hpp"

#include "kla/ref/wy.hpp"

using namespace kla::test;
using kla::ref::DecayTable;
using kla::ref::wy_factors;
using kla::ref::wy_H;
using kla::ref::wy_P;
using kla::ref::wy_state;

namespace {

// case_a() of test_support.hpp: β = 1/4, 1/3, 3/20; γ = 1/2, 1/4, 1/4;
//   Γ(2,1) = 1/2, Γ(3,1) = 1/2, Γ(3,2) = 1.

/// M_t = (I − β_t k_t k_tᵀ) diag(α_t): the exact linear part of token t, built here.
Mat<Rational> transition(const HeadInputs<Rational>& in, const Options<Rational>& opt, Idx t) {
  const Vec<Rational> k = in.k.row(t).transpose();
  const Rational kk = k.squaredNorm();
  Rational beta = in.eta(t);
  if (opt.coefficient == Coefficient::kaczmarz)
    beta = kk + opt.eps == 0 ? Rational(0) : Rational(in.eta(t) / (kk + opt.eps));
  Mat<Rational> a = Mat<Rational>::Zero(k.size(), k.size());
  for (Idx i = 0; i < k.size(); ++i)
    a(i, i) = in.alpha.size() == 0 ? Rational(1) : in.alpha(t, in.alpha.cols() == 1 ? 0 : i);
  return (Mat<Rational>(Mat<Rational>::Identity(k.size(), k.size())) - beta * k * k.transpose()) *
         a;
}

/// Tokens start..start+len-1 of `in` as their own sequence.
HeadInputs<Rational> slice(const HeadInputs<Rational>& in, Idx start, Idx len) {
  HeadInputs<Rational> s;
  s.q = in.q.middleRows(start, len);
  s.k = in.k.middleRows(start, len);
  s.v = in.v.middleRows(start, len);
  s.eta = in.eta.segment(start, len);
  if (in.alpha.size()) s.alpha = in.alpha.middleRows(start, len);
  return s;
}

}  // namespace

TEST(WyHand, FactorsCaseA) {
  // w_i = β_i (Γ(i,0) k_i − Σ_{r<i} c_ir w_r),  u_i = β_i (v_i − Σ_{r<i} c_ir u_r),
  // c_ir = k_rᵀ Γ(i,r) k_i:  c21 = (1/2)(k1·k2 = 1) = 1/2, c31 = (1/2)(k1·k3 = 0) = 0,
  //                          c32 = 1·(k2·k3 = 2) = 2.
  // w1 = (1/4)(1/2)(1,0) = (1/8, 0);                     u1 = (1/4)·2 = 1/2
  // w2 = (1/3)((1/4)(1,1) − (1/2)(1/8,0)) = (1/3)(3/16, 1/4) = (1/16, 1/12)
  //                                                       u2 = (1/3)(1 − 1/4) = 1/4
  // w3 = (3/20)((1/4)(0,2) − 2(1/16,1/12)) = (3/20)(−1/8, 1/3) = (−3/160, 1/20)
  //                                                       u3 = (3/20)(−1 − 2/4) = −9/40
  const auto in = case_a();
  const DecayTable<Rational> g(in, 0, 3);
  const auto f = wy_factors(in, eps_one(), 0, 3, g);
  EXPECT_TRUE(exactly_equal(f.beta, RV({R(1, 4), R(1, 3), R(3, 20)})));
  EXPECT_TRUE(
      exactly_equal(f.w, RM(3, 2, {R(1, 8), R(0), R(1, 16), R(1, 12), R(-3, 160), R(1, 20)})));
  EXPECT_TRUE(exactly_equal(f.u, RM(3, 1, {R(1, 2), R(1, 4), R(-9, 40)})));
}

TEST(WyHand, PAndHCaseA) {
  // P_i = Γ(i,0) I − Σ_{r≤i} Γ(i,r) k_r w_rᵀ.
  //  P1 = (1/2)I − (1,0)ᵀ(1/8,0) = [[3/8,0],[0,1/2]]
  //  P2 = (1/4)I − (1/2)(1,0)ᵀ(1/8,0) − (1,1)ᵀ(1/16,1/12) = [[1/8,−1/12],[−1/16,1/6]]
  //  P3 = (1/4)I − [[1/16,0],[0,0]] − [[1/16,1/12],[1/16,1/12]] − [[0,0],[−3/80,1/10]]
  //     = [[1/8, −1/12],[−1/40, 1/15]]
  // Cross-check P3 = M3 M2 M1 with M_t = α_t(I − β_t k_t k_tᵀ):
  //  M1 = [[3/8,0],[0,1/2]], M2 = (1/2)[[2/3,−1/3],[−1/3,2/3]], M3 = [[1,0],[0,2/5]]:
  //  M2 M1 = [[1/8,−1/12],[−1/16,1/6]], M3 M2 M1 = [[1/8,−1/12],[−1/40,1/15]].
  // H_i = Σ Γ(i,r) k_r u_rᵀ:  H1 = (1/2, 0), H2 = (1/2)(1,0)(1/2) + (1,1)(1/4) = (1/2, 1/4),
  //  H3 = (1/4, 0) + (1/4, 1/4) + (0,2)(−9/40) = (1/2, −1/5)  (= the states of case A from 0).
  const auto in = case_a();
  const DecayTable<Rational> g(in, 0, 3);
  const auto f = wy_factors(in, eps_one(), 0, 3, g);
  EXPECT_TRUE(exactly_equal(wy_P(in, 0, f, g, 1), RM(2, 2, {R(3, 8), R(0), R(0), R(1, 2)})));
  EXPECT_TRUE(
      exactly_equal(wy_P(in, 0, f, g, 2), RM(2, 2, {R(1, 8), R(-1, 12), R(-1, 16), R(1, 6)})));
  EXPECT_TRUE(
      exactly_equal(wy_P(in, 0, f, g, 3), RM(2, 2, {R(1, 8), R(-1, 12), R(-1, 40), R(1, 15)})));
  EXPECT_TRUE(exactly_equal(wy_H(in, 0, f, g, 1), RM(2, 1, {R(1, 2), R(0)})));
  EXPECT_TRUE(exactly_equal(wy_H(in, 0, f, g, 2), RM(2, 1, {R(1, 2), R(1, 4)})));
  EXPECT_TRUE(exactly_equal(wy_H(in, 0, f, g, 3), RM(2, 1, {R(1, 2), R(-1, 5)})));
}

TEST(WyHand, CombinedStateCaseA) {
  // S0 = (1, −1): S3 = P3 S0 + H3 = (1/8 + 1/12, −1/40 − 1/15) + (1/2, −1/5)
  //                              = (5/24 + 1/2, −11/120 − 1/5) = (17/24, −7/24),
  // the state worked token by token in test_recurrence.cpp (CaseAWithInitialState).
  const auto in = case_a();
  const DecayTable<Rational> g(in, 0, 3);
  const auto f = wy_factors(in, eps_one(), 0, 3, g);
  const Mat<Rational> S0 = RM(2, 1, {R(1), R(-1)});
  EXPECT_TRUE(exactly_equal(wy_state(in, 0, f, g, 3, S0), RM(2, 1, {R(17, 24), R(-7, 24)})));
  // S1 = (7/8, −1/2), S2 = (17/24, 1/48) (same hand computation).
  EXPECT_TRUE(exactly_equal(wy_state(in, 0, f, g, 1, S0), RM(2, 1, {R(7, 8), R(-1, 2)})));
  EXPECT_TRUE(exactly_equal(wy_state(in, 0, f, g, 2, S0), RM(2, 1, {R(17, 24), R(1, 48)})));
}

TEST(WyProperty, MatchesExplicitProductsAndRecurrence) {
  KLA_SEEDED_RNG(rng);
  std::uniform_int_distribution<int> pick(0, 2), len(1, 7), dim(1, 3), off(0, 3);
  for (int it = 0; it < 25; ++it) {
    RationalConfig c;
    const Idx start = off(rng), L = len(rng);
    c.T = start + L + off(rng);
    c.dk = dim(rng);
    c.dv = dim(rng);
    c.decay = static_cast<DecayKind>(pick(rng));
    c.zero_key_prob = 0.15;
    const auto in = random_rational_inputs(rng, c);
    Options<Rational> opt;
    opt.eps = pick(rng) == 0 ? R(0) : random_alpha(rng);
    opt.coefficient = pick(rng) == 0 ? Coefficient::given : Coefficient::kaczmarz;
    const Mat<Rational> S0 = random_rational_matrix(rng, c.dk, c.dv);
    const DecayTable<Rational> g(in, start, L);
    const auto f = wy_factors(in, opt, start, L, g);
    Mat<Rational> P = Mat<Rational>::Identity(c.dk, c.dk);
    for (Idx i = 1; i <= L; ++i) {
      SCOPED_TRACE(::testing::Message() << "iteration " << it << " i " << i);
      P = transition(in, opt, start + i - 1) * P;  // M_i ⋯ M_1
      ASSERT_TRUE(exactly_equal(wy_P(in, start, f, g, i), P));
      const auto sub = slice(in, start, i);
      ASSERT_TRUE(exactly_equal(wy_H(in, start, f, g, i), oracle(sub, opt).state));
      ASSERT_TRUE(exactly_equal(wy_state(in, start, f, g, i, S0), oracle(sub, opt, S0).state));
    }
  }
}
