// recurrence.hpp: hand-worked cases in exact rationals, the degenerate-denominator convention,
// given-β (GDN) mode, read-out scale and q l2-norm read-out, and a property check against the
// independent oracle of test_support.hpp.
#include "test_support.hpp"

using namespace kla::test;
using kla::ref::coefficient;
using kla::ref::readout_scale;
using kla::ref::recurrent_forward;
using kla::ref::token_step;

// case_a(), case_b() and eps_one() are the hand-worked cases of test_support.hpp.

TEST(RecurrenceHand, CaseAFromZero) {
  // t1: S̃ = 0, e = 2, β = (1/2)/(1+1) = 1/4, S1 = (1/4)(1,0)·2 = (1/2, 0);     o1 = 1/2
  // t2: S̃ = (1/4, 0), e = 1 − 1/4 = 3/4, β = 1/(2+1) = 1/3,
  //     S2 = (1/4,0) + (1/3)(1,1)(3/4) = (1/2, 1/4);                          o2 = 1 − 1/4 = 3/4
  // t3: S̃ = S2, e = −1 − 2·(1/4) = −3/2, β = (3/4)/(4+1) = 3/20,
  //     S3 = (1/2, 1/4) + (3/20)(0,2)(−3/2) = (1/2, 1/4 − 9/20) = (1/2, −1/5); o3 = 1/2 − 3/5 =
  //     −1/10
  const auto out = recurrent_forward(case_a(), eps_one());
  EXPECT_TRUE(exactly_equal(out.state, RM(2, 1, {R(1, 2), R(-1, 5)})));
  EXPECT_TRUE(exactly_equal(out.o, RM(3, 1, {R(1, 2), R(3, 4), R(-1, 10)})));
  // The oracle (independent code) agrees with the hand numbers too.
  const auto orc = oracle(case_a(), eps_one());
  EXPECT_TRUE(exactly_equal(orc.state, out.state));
  EXPECT_TRUE(exactly_equal(orc.o, out.o));
}

TEST(RecurrenceHand, CaseAReadoutScale) {
  // o_t = S_tᵀ q_t · scale with scale = 1/2 halves every output of CaseAFromZero.
  auto opt = eps_one();
  opt.scale = R(1, 2);
  const auto out = recurrent_forward(case_a(), opt);
  EXPECT_TRUE(exactly_equal(out.o, RM(3, 1, {R(1, 4), R(3, 8), R(-1, 20)})));
  EXPECT_TRUE(exactly_equal(out.state, RM(2, 1, {R(1, 2), R(-1, 5)})));  // state unaffected
}

TEST(RecurrenceHand, CaseAWithInitialState) {
  // S0 = (1, −1).
  // t1: S̃ = (1/2, −1/2), e = 2 − 1/2 = 3/2, β = 1/4, S1 = (1/2 + 3/8, −1/2) = (7/8, −1/2)
  //     o1 = 7/8 − 1/2 = 3/8
  // t2: S̃ = (7/16, −1/4), e = 1 − (7/16 − 1/4) = 13/16, β = 1/3,
  //     S2 = (7/16 + 13/48, −1/4 + 13/48) = (17/24, 1/48);  o2 = 34/24 − 1/48 = 67/48
  // t3: S̃ = S2, e = −1 − 2/48 = −25/24, β = 3/20,
  //     S3 = (17/24, 1/48 + (3/20)·2·(−25/24)) = (17/24, 1/48 − 5/16) = (17/24, −7/24)
  //     o3 = 17/24 − 21/24 = −1/6
  const auto out = recurrent_forward(case_a(), eps_one(), RM(2, 1, {R(1), R(-1)}));
  EXPECT_TRUE(exactly_equal(out.state, RM(2, 1, {R(17, 24), R(-7, 24)})));
  EXPECT_TRUE(exactly_equal(out.o, RM(3, 1, {R(3, 8), R(67, 48), R(-1, 6)})));
}

TEST(RecurrenceHand, CaseAGivenBetaGdn) {
  // Coefficient::given: β_t = η_t, ε is ignored.
  // t1: S1 = (1/2)(1,0)·2 = (1, 0);                                 o1 = 1
  // t2: S̃ = (1/2, 0), e = 1 − 1/2 = 1/2, β = 1, S2 = (1, 1/2);      o2 = 2 − 1/2 = 3/2
  // t3: e = −1 − 2·(1/2) = −2, β = 3/4, S3 = (1, 1/2 − 3) = (1, −5/2); o3 = 1 − 15/2 = −13/2
  auto opt = eps_one();
  opt.coefficient = Coefficient::given;
  const auto out = recurrent_forward(case_a(), opt);
  EXPECT_TRUE(exactly_equal(out.state, RM(2, 1, {R(1), R(-5, 2)})));
  EXPECT_TRUE(exactly_equal(out.o, RM(3, 1, {R(1), R(3, 2), R(-13, 2)})));
}

TEST(RecurrenceHand, CaseBDiagonalDecayInitialState) {
  // S0 = I. t1: S̃ = diag(1/2,1) I = [[1/2,0],[0,1]], S̃ᵀk = (1/2, 1), e = (1/2, −1),
  //   β = 1/2, βk eᵀ = [[1/4,−1/2],[1/4,−1/2]], S1 = [[3/4,−1/2],[1/4,1/2]]; o1 = row 0 =
  //   (3/4,−1/2) (η = 1, ε = 0: S1ᵀk = (1, 0) = v, Theorem 1)
  // t2: S̃ = diag(1,1/3) S1 = [[3/4,−1/2],[1/12,1/6]], S̃ᵀk = 2·row 0 = (3/2,−1),
  //   e = (−3/2, 2), β = (1/2)/4 = 1/8, βk = (1/4, 0),
  //   S2 = [[3/4−3/8, −1/2+1/2],[1/12,1/6]] = [[3/8,0],[1/12,1/6]]; o2 = 6·row 1 = (1/2, 1)
  const Options<Rational> opt;  // Kaczmarz, ε = 0, scale 1
  const auto out = recurrent_forward(case_b(), opt, Mat<Rational>(Mat<Rational>::Identity(2, 2)));
  EXPECT_TRUE(exactly_equal(out.state, RM(2, 2, {R(3, 8), R(0), R(1, 12), R(1, 6)})));
  EXPECT_TRUE(exactly_equal(out.o, RM(2, 2, {R(3, 4), R(-1, 2), R(1, 2), R(1)})));
}

TEST(RecurrenceHand, TokenStepTrace) {
  // Token 2 of case A from S1 = (1/2, 0): S̃ = (1/4, 0), e = 3/4, β = 1/3, S2 = (1/2, 1/4).
  const auto in = case_a();
  Mat<Rational> S = RM(2, 1, {R(1, 2), R(0)});
  const auto tr = token_step<Rational>(S, in.decay(1), in.k.row(1).transpose(),
                                       in.v.row(1).transpose(), in.eta(1), eps_one());
  EXPECT_TRUE(exactly_equal(tr.decayed, RM(2, 1, {R(1, 4), R(0)})));
  EXPECT_TRUE(exactly_equal(tr.residual, RM(1, 1, {R(3, 4)})));
  EXPECT_EQ(tr.beta, R(1, 3));
  EXPECT_TRUE(exactly_equal(S, RM(2, 1, {R(1, 2), R(1, 4)})));
}

TEST(RecurrenceHand, DegenerateZeroKeyZeroEps) {
  // k = 0 and ε = 0: ‖k‖²+ε = 0, convention β = 0, the token only decays the state.
  //   S0 = (1, 2); t1: α = 1/3 -> S1 = (1/3, 2/3), q = (3,3): o1 = 1 + 2 = 3
  //                t2: α = 1/2 -> S2 = (1/6, 1/3), q = (6,0): o2 = 1
  HeadInputs<Rational> in;
  in.k = Mat<Rational>::Zero(2, 2);
  in.v = RM(2, 1, {R(5), R(-7)});
  in.q = RM(2, 2, {R(3), R(3), R(6), R(0)});
  in.eta = RV({R(1), R(1, 2)});
  in.alpha = RM(2, 1, {R(1, 3), R(1, 2)});
  const Options<Rational> opt;  // ε = 0
  EXPECT_EQ(coefficient(R(0), R(1), opt), R(0));
  const auto out = recurrent_forward(in, opt, RM(2, 1, {R(1), R(2)}));
  EXPECT_TRUE(exactly_equal(out.state, RM(2, 1, {R(1, 6), R(1, 3)})));
  EXPECT_TRUE(exactly_equal(out.o, RM(2, 1, {R(3), R(1)})));
  // With ε > 0 the coefficient is η/ε = 1/2 but k eᵀ = 0: same result.
  Options<Rational> opt2;
  opt2.eps = R(2);
  EXPECT_EQ(coefficient(R(0), R(1), opt2), R(1, 2));
  const auto out2 = recurrent_forward(in, opt2, RM(2, 1, {R(1), R(2)}));
  EXPECT_TRUE(exactly_equal(out2.state, out.state));
  EXPECT_TRUE(exactly_equal(out2.o, out.o));
}

TEST(RecurrenceHand, DegenerateInDouble) {
  // The convention must hold in floating point too (no 0/0 = NaN).
  HeadInputs<double> in;
  in.k = Mat<double>::Zero(1, 3);
  in.v = Mat<double>::Constant(1, 2, 4.0);
  in.q = Mat<double>::Constant(1, 3, 1.0);
  in.eta = Vec<double>::Constant(1, 0.5);
  in.alpha = Mat<double>::Constant(1, 1, 0.5);
  const auto out =
      recurrent_forward(in, Options<double>{}, Mat<double>(Mat<double>::Constant(3, 2, 2.0)));
  EXPECT_TRUE(identical(out.state, Mat<double>(Mat<double>::Constant(3, 2, 1.0))));  // 0.5·2, exact
  EXPECT_TRUE(
      identical(out.o, Mat<double>(Mat<double>::Constant(1, 2, 3.0))));  // 3 rows of 1, exact
}

TEST(RecurrenceHand, CoefficientByHand) {
  Options<Rational> opt;
  opt.eps = R(1, 2);
  // Kaczmarz: β = η/(‖k‖²+ε) = (3/4)/(2 + 1/2) = 3/10.
  EXPECT_EQ(coefficient(R(2), R(3, 4), opt), R(3, 10));
  opt.coefficient = Coefficient::given;  // GDN: β = η
  EXPECT_EQ(coefficient(R(2), R(3, 4), opt), R(3, 4));
}

TEST(RecurrenceHand, QL2NormReadoutInDouble) {
  // dk = 2, dv = 1, ε = 0, q l2-normalised.
  //  t1: k = (1,0), v = 2, η = 1, α = 1: S1 = (2, 0); q = (3,4), ‖q‖ = 5: o1 = 6/5
  //  t2: k = (0,1), v = −1, η = 1/2, α = 1/2: S̃ = (1,0), e = −1, β = 1/2, S2 = (1, −1/2);
  //      q = (−5,12), ‖q‖ = 13: o2 = (−5 − 6)/13 = −11/13
  //  t3: k = (1,1), v = 1/2, η = 1/2, α = 1: e = 1/2 − (1 − 1/2) = 0, S3 = S2;
  //      q = 0: o3 = 0 by convention (scale 1/‖q‖ taken as 0)
  HeadInputs<double> in;
  in.k.resize(3, 2);
  in.k << 1, 0, 0, 1, 1, 1;
  in.v.resize(3, 1);
  in.v << 2, -1, 0.5;
  in.q.resize(3, 2);
  in.q << 3, 4, -5, 12, 0, 0;
  in.eta.resize(3);
  in.eta << 1, 0.5, 0.5;
  in.alpha.resize(3, 1);
  in.alpha << 1, 0.5, 1;
  Options<double> opt;
  opt.readout = Readout::q_l2norm;
  opt.scale = 1000;  // must be ignored in q_l2norm mode
  const auto out = recurrent_forward(in, opt);
  // S and Sᵀq are exact in double (dyadic), sqrt(25) = 5 and sqrt(169) = 13 are exact; 1/‖q‖ and
  // the final product round once each: |error| ≤ 2u|o|.
  const double u = ScalarTraits<double>::unit_roundoff();
  EXPECT_NEAR(out.o(0, 0), 6.0 / 5.0, 2 * u * 1.2);
  EXPECT_NEAR(out.o(1, 0), -11.0 / 13.0, 2 * u * 11.0 / 13.0);
  EXPECT_EQ(out.o(2, 0), 0.0);
  EXPECT_EQ(out.state(0, 0), 1.0);
  EXPECT_EQ(out.state(1, 0), -0.5);
  // The read-out is invariant under q -> c q (c > 0): q scaled by 7.
  HeadInputs<double> in7 = in;
  in7.q *= 7;
  const auto out7 = recurrent_forward(in7, opt);
  EXPECT_NEAR(out7.o(0, 0), 6.0 / 5.0, 2 * u * 1.2);
  EXPECT_NEAR(out7.o(1, 0), -11.0 / 13.0, 2 * u * 11.0 / 13.0);
  EXPECT_DOUBLE_EQ(readout_scale<double>(Vec<double>::Zero(2), opt), 0.0);
}

TEST(RecurrenceHand, QkL2NormNormalisesQueryAndKeyAndKeepsScale) {
  // FLA's use_qk_l2norm_in_kernel with eps_n = 0 (Options::l2norm_eps), Kaczmarz, eps = 0,
  // scale 2, from S = 0:
  //  t1: k = (0,2) -> k^ = (0,1), beta = 1/1, v = 3: S1 = (0,3)^T; q = (3,4) -> q^ = (3/5,4/5):
  //      o1 = 2 * 3 * 4/5 = 24/5 (raw keys would give beta = 1/4, S1 = (0,3/2), o1 = 12)
  //  t2: k = (4,0) -> k^ = (1,0), v = 1: e = 1, S2 = (1,3)^T; q = (0,8) -> (0,1): o2 = 2 * 3 = 6
  HeadInputs<double> in;
  in.k.resize(2, 2);
  in.k << 0, 2, 4, 0;
  in.q.resize(2, 2);
  in.q << 3, 4, 0, 8;
  in.v.resize(2, 1);
  in.v << 3, 1;
  in.eta = Vec<double>::Ones(2);
  Options<double> opt;
  opt.eps = 0;
  opt.scale = 2;
  opt.l2norm_eps = 0;
  opt.readout = Readout::qk_l2norm;
  const auto out = recurrent_forward(in, opt);
  const double u = ScalarTraits<double>::unit_roundoff();
  EXPECT_NEAR(out.o(0, 0), 24.0 / 5.0, 3 * u * 4.8);  // q^ rounds once, the product twice
  EXPECT_EQ(out.o(1, 0), 6.0);
  EXPECT_EQ(out.state(0, 0), 1.0);
  EXPECT_EQ(out.state(1, 0), 3.0);
  // The chunkwise form applies the same change of inputs: equal to the last bit here.
  const auto chk = kla::ref::chunk_forward(in, opt, 2);
  EXPECT_EQ(chk.o(1, 0), 6.0);
  EXPECT_NEAR(chk.o(0, 0), 24.0 / 5.0, 3 * u * 4.8);
  // With FLA's eps_n = 1e-6 the key (0,2) becomes k1 = (0, 2/sqrt(4 + 1e-6)), |k1| < 1, and
  // S1 = 3 / |k1| (eps = 0): the read-out moves by about 1.2e-7 relative, not more.
  opt.l2norm_eps = 1e-6;
  const auto fla = recurrent_forward(in, opt);
  EXPECT_NEAR(fla.o(0, 0), 24.0 / 5.0, 24.0 / 5.0 * 1e-6);
  EXPECT_NE(fla.o(0, 0), out.o(0, 0));
  // Rationals have no sqrt: refused, as for the q l2-norm read-out.
  Options<Rational> ropt;
  ropt.readout = Readout::qk_l2norm;
  EXPECT_THROW(recurrent_forward(case_a(), ropt), std::invalid_argument);
}

TEST(RecurrenceHand, QL2NormNeedsSqrt) {
  Options<Rational> opt;
  opt.readout = Readout::q_l2norm;
  EXPECT_THROW(recurrent_forward(case_a(), opt), std::invalid_argument);
}

TEST(RecurrenceValidation, BadShapesThrow) {
  const Options<Rational> opt;
  {
    auto in = case_a();
    in.q = Mat<Rational>::Zero(3, 3);  // q must be [T, dk]
    EXPECT_THROW(recurrent_forward(in, opt), std::invalid_argument);
  }
  {
    auto in = case_a();
    in.v = Mat<Rational>::Zero(2, 1);  // one value row per token
    EXPECT_THROW(recurrent_forward(in, opt), std::invalid_argument);
  }
  {
    auto in = case_a();
    in.eta = RV({R(1), R(1)});
    EXPECT_THROW(recurrent_forward(in, opt), std::invalid_argument);
  }
  {
    auto in = case_a();
    in.alpha = Mat<Rational>::Constant(3, 3, R(1));  // neither [T,1] nor [T,dk]
    EXPECT_THROW(recurrent_forward(in, opt), std::invalid_argument);
  }
  {
    auto in = case_a();
    in.alpha = Mat<Rational>::Constant(2, 1, R(1));  // wrong number of tokens
    EXPECT_THROW(recurrent_forward(in, opt), std::invalid_argument);
  }
  EXPECT_THROW(recurrent_forward(case_a(), opt, Mat<Rational>(Mat<Rational>::Zero(1, 2))),
               std::invalid_argument);
}

TEST(RecurrenceProperty, MatchesOracleExactly) {
  KLA_SEEDED_RNG(rng);
  std::uniform_int_distribution<int> pick(0, 2), len(1, 8), dim(1, 3);
  for (int it = 0; it < 40; ++it) {
    RationalConfig c;
    c.T = len(rng);
    c.dk = dim(rng);
    c.dv = dim(rng);
    c.decay = static_cast<DecayKind>(pick(rng));
    c.zero_key_prob = 0.2;
    const auto in = random_rational_inputs(rng, c);
    Options<Rational> opt;
    opt.eps = pick(rng) == 0 ? R(0) : random_alpha(rng);
    opt.coefficient = pick(rng) == 0 ? Coefficient::given : Coefficient::kaczmarz;
    opt.scale = random_alpha(rng);
    const Mat<Rational> S0 = random_rational_matrix(rng, c.dk, c.dv);
    const auto out = recurrent_forward(in, opt, S0);
    const auto orc = oracle(in, opt, S0);
    ASSERT_TRUE(exactly_equal(out.o, orc.o)) << "iteration " << it;
    ASSERT_TRUE(exactly_equal(out.state, orc.state)) << "iteration " << it;
  }
}

TEST(RecurrenceProperty, ResidualContractsByExactFactor) {
  // After a token, the residual on that token is (1 − β‖k‖²) e (Proposition 2), computed here
  // from the step's own trace: v − S_tᵀk = (1 − β‖k‖²)(v − S̃ᵀk).
  KLA_SEEDED_RNG(rng);
  for (int it = 0; it < 30; ++it) {
    RationalConfig c;
    c.T = 1;
    const auto in = random_rational_inputs(rng, c);
    Options<Rational> opt;
    opt.eps = random_alpha(rng);
    const Mat<Rational> S_prev = random_rational_matrix(rng, c.dk, c.dv);
    Mat<Rational> S = S_prev;
    const Vec<Rational> k = in.k.row(0).transpose(), v = in.v.row(0).transpose();
    const auto tr = token_step<Rational>(S, in.decay(0), k, v, in.eta(0), opt);
    const Rational kk = k.squaredNorm();
    const Rational beta = Rational(in.eta(0) / (kk + opt.eps));  // ε > 0 here
    const Mat<Rational> decayed = in.decay(0).asDiagonal() * S_prev;
    const Vec<Rational> e = v - decayed.transpose() * k;
    EXPECT_EQ(tr.beta, beta);
    EXPECT_TRUE(exactly_equal(tr.decayed, decayed));
    EXPECT_TRUE(exactly_equal(tr.residual, e));
    const Vec<Rational> after = v - S.transpose() * k;
    EXPECT_TRUE(exactly_equal(after, Vec<Rational>((Rational(1) - beta * kk) * e)));
  }
}
