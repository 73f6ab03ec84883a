// chunk.hpp: the chunk system worked by hand, exact chunkwise == tokenwise in rationals (scalar,
// diagonal and absent decay; scalar decay written as diagonal), and long sequences (T up to
// 4093, chunk 64, ragged last chunk, initial state) in Mpfr and double against derived bounds.
#include <chrono>

#include "test_support.hpp"

using namespace kla::test;
using kla::ref::chunk_forward;
using kla::ref::chunk_system;
using kla::ref::DecayTable;
using kla::ref::forward_substitution;
using kla::ref::recurrent_forward;
using kla::ref::token_step;

// case_a(), case_b() and eps_one() are the hand-worked cases of test_support.hpp.

TEST(ChunkHand, SystemCaseAFromZero) {
  // Matrix I + B(A⁻∘KKᵀ), entries (i,j), j < i: β_i Γ(i,j) k_iᵀk_j
  //   (2,1): (1/3)(1/2)(1) = 1/6;  (3,1): (3/20)(1/2)(0) = 0;  (3,2): (3/20)(1)(2) = 3/10
  // rhs = B V (S0 = 0) = (1/4·2, 1/3·1, 3/20·(−1)) = (1/2, 1/3, −3/20)
  // U: U1 = 1/2, U2 = 1/3 − (1/6)(1/2) = 1/4, U3 = −3/20 − (3/10)(1/4) = −9/40
  const auto in = case_a();
  const DecayTable<Rational> g(in, 0, 3);
  const auto sys = chunk_system(in, eps_one(), Mat<Rational>(Mat<Rational>::Zero(2, 1)), 0, 3, g);
  EXPECT_TRUE(exactly_equal(
      sys.matrix, RM(3, 3, {R(1), R(0), R(0), R(1, 6), R(1), R(0), R(0), R(3, 10), R(1)})));
  EXPECT_TRUE(exactly_equal(sys.rhs, RM(3, 1, {R(1, 2), R(1, 3), R(-3, 20)})));
  EXPECT_TRUE(exactly_equal(sys.beta, RV({R(1, 4), R(1, 3), R(3, 20)})));
  EXPECT_TRUE(exactly_equal(forward_substitution(sys.matrix, sys.rhs),
                            RM(3, 1, {R(1, 2), R(1, 4), R(-9, 40)})));
}

TEST(ChunkHand, SystemCaseAWithInitialState) {
  // S0 = (1,−1): pred_i = S0ᵀ(γ_i k_i) = (1/2)(1), (1/4)(0), (1/4)(−2) = 1/2, 0, −1/2
  // rhs = (1/4)(2 − 1/2), (1/3)(1 − 0), (3/20)(−1 + 1/2) = 3/8, 1/3, −3/40
  // U1 = 3/8, U2 = 1/3 − (1/6)(3/8) = 13/48, U3 = −3/40 − (3/10)(13/48) = −5/32
  // (= β_t e_t of the tokenwise run: (1/4)(3/2), (1/3)(13/16), (3/20)(−25/24)).
  const auto in = case_a();
  const DecayTable<Rational> g(in, 0, 3);
  const auto sys = chunk_system(in, eps_one(), RM(2, 1, {R(1), R(-1)}), 0, 3, g);
  EXPECT_TRUE(exactly_equal(sys.rhs, RM(3, 1, {R(3, 8), R(1, 3), R(-3, 40)})));
  EXPECT_TRUE(exactly_equal(forward_substitution(sys.matrix, sys.rhs),
                            RM(3, 1, {R(3, 8), R(13, 48), R(-5, 32)})));
}

TEST(ChunkHand, ForwardSubstitutionGeneral) {
  // [[2,0],[1,4]] x = [[2,4],[9,1]]: x1 = (1, 2), x2 = ((9−1)/4, (1−2)/4) = (2, −1/4)
  EXPECT_TRUE(exactly_equal(
      forward_substitution(RM(2, 2, {R(2), R(0), R(1), R(4)}), RM(2, 2, {R(2), R(4), R(9), R(1)})),
      RM(2, 2, {R(1), R(2), R(2), R(-1, 4)})));
}

TEST(ChunkHand, ForwardCaseAAllChunkSizes) {
  // The hand results of test_recurrence.cpp (CaseAWithInitialState): S3 = (17/24, −7/24),
  // o = (3/8, 67/48, −1/6), for every chunk length (1, 2 = ragged, 3, 5 > T).
  for (Idx C : {1, 2, 3, 5}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << C);
    const auto out = chunk_forward(case_a(), eps_one(), C, RM(2, 1, {R(1), R(-1)}));
    EXPECT_TRUE(exactly_equal(out.state, RM(2, 1, {R(17, 24), R(-7, 24)})));
    EXPECT_TRUE(exactly_equal(out.o, RM(3, 1, {R(3, 8), R(67, 48), R(-1, 6)})));
  }
}

TEST(ChunkHand, ForwardCaseBDiagonal) {
  // Hand results of CaseBDiagonalDecayInitialState: S2 = [[3/8,0],[1/12,1/6]],
  // o = [[3/4,−1/2],[1/2,1]].
  for (Idx C : {1, 2}) {
    const auto out = chunk_forward(case_b(), Options<Rational>{}, C,
                                   Mat<Rational>(Mat<Rational>::Identity(2, 2)));
    EXPECT_TRUE(exactly_equal(out.state, RM(2, 2, {R(3, 8), R(0), R(1, 12), R(1, 6)})));
    EXPECT_TRUE(exactly_equal(out.o, RM(2, 2, {R(3, 4), R(-1, 2), R(1, 2), R(1)})));
  }
}

TEST(ChunkHand, DegenerateZeroKeyInsideChunk) {
  // k = 0, ε = 0 inside a chunk: β = 0, row of zeros in B, the token only decays.
  // S0 = (1,2), α = 1/3 then 1/2 -> S = (1/6, 1/3); q2 = (6,0): o2 = 1, q1 = (3,3): o1 = 3.
  HeadInputs<Rational> in;
  in.k = Mat<Rational>::Zero(2, 2);
  in.v = RM(2, 1, {R(5), R(-7)});
  in.q = RM(2, 2, {R(3), R(3), R(6), R(0)});
  in.eta = RV({R(1), R(1, 2)});
  in.alpha = RM(2, 1, {R(1, 3), R(1, 2)});
  const auto out = chunk_forward(in, Options<Rational>{}, 2, RM(2, 1, {R(1), R(2)}));
  EXPECT_TRUE(exactly_equal(out.state, RM(2, 1, {R(1, 6), R(1, 3)})));
  EXPECT_TRUE(exactly_equal(out.o, RM(2, 1, {R(3), R(1)})));
}

TEST(ChunkValidation, BadArgumentsThrow) {
  EXPECT_THROW(chunk_forward(case_a(), eps_one(), 0), std::invalid_argument);
  EXPECT_THROW(chunk_forward(case_a(), eps_one(), 2, Mat<Rational>(Mat<Rational>::Zero(2, 2))),
               std::invalid_argument);
  auto bad = case_a();
  bad.eta = RV({R(1)});
  EXPECT_THROW(chunk_forward(bad, eps_one(), 2), std::invalid_argument);
}

TEST(ChunkExact, RandomEqualsTokenwise) {
  KLA_SEEDED_RNG(rng);
  std::uniform_int_distribution<int> pick(0, 2), len(1, 11), dim(1, 3);
  for (int it = 0; it < 30; ++it) {
    RationalConfig c;
    c.T = len(rng);
    c.dk = dim(rng);
    c.dv = dim(rng);
    c.decay = static_cast<DecayKind>(pick(rng));
    c.zero_key_prob = 0.15;
    const auto in = random_rational_inputs(rng, c);
    Options<Rational> opt;
    opt.eps = pick(rng) == 0 ? R(0) : random_alpha(rng);
    opt.coefficient = pick(rng) == 0 ? Coefficient::given : Coefficient::kaczmarz;
    opt.scale = random_alpha(rng);
    const Mat<Rational> S0 =
        pick(rng) == 0 ? Mat<Rational>() : random_rational_matrix(rng, c.dk, c.dv);
    const auto tok = recurrent_forward(in, opt, S0);
    for (Idx C : {Idx(1), Idx(2), Idx(3), Idx(4), c.T, c.T + 2}) {
      SCOPED_TRACE(::testing::Message() << "iteration " << it << " T " << c.T << " chunk " << C
                                        << " decay " << int(c.decay));
      const auto chk = chunk_forward(in, opt, C, S0);
      ASSERT_TRUE(exactly_equal(chk.o, tok.o));
      ASSERT_TRUE(exactly_equal(chk.state, tok.state));
    }
  }
}

TEST(ChunkExact, DiagonalDecayEqualsTokenwise) {
  // Per-channel decay, several chunks with a ragged last one, against the independent oracle.
  KLA_SEEDED_RNG(rng);
  for (int it = 0; it < 10; ++it) {
    RationalConfig c;
    c.T = 13;
    c.dk = 3;
    c.dv = 2;
    c.decay = DecayKind::diagonal;
    const auto in = random_rational_inputs(rng, c);
    Options<Rational> opt;
    opt.eps = random_alpha(rng);
    const Mat<Rational> S0 = random_rational_matrix(rng, c.dk, c.dv);
    const auto orc = oracle(in, opt, S0);
    for (Idx C : {4, 5}) {  // 13 = 3·4 + 1 = 2·5 + 3
      const auto chk = chunk_forward(in, opt, C, S0);
      ASSERT_TRUE(exactly_equal(chk.o, orc.o)) << "iteration " << it << " chunk " << C;
      ASSERT_TRUE(exactly_equal(chk.state, orc.state)) << "iteration " << it << " chunk " << C;
    }
  }
}

TEST(ChunkExact, ScalarDecayAsDiagonalIsIdentical) {
  // α [T,1] and the same α broadcast to [T,dk] must give identical results, both forms.
  KLA_SEEDED_RNG(rng);
  for (int it = 0; it < 10; ++it) {
    RationalConfig c;
    c.T = 9;
    c.dk = 3;
    c.dv = 2;
    const auto in = random_rational_inputs(rng, c);
    auto diag = in;
    diag.alpha = in.alpha.replicate(1, c.dk);
    Options<Rational> opt;
    opt.eps = random_alpha(rng);
    const Mat<Rational> S0 = random_rational_matrix(rng, c.dk, c.dv);
    const auto a = recurrent_forward(in, opt, S0), b = recurrent_forward(diag, opt, S0);
    ASSERT_TRUE(exactly_equal(a.o, b.o));
    ASSERT_TRUE(exactly_equal(a.state, b.state));
    const auto ca = chunk_forward(in, opt, 4, S0), cb = chunk_forward(diag, opt, 4, S0);
    ASSERT_TRUE(exactly_equal(ca.o, cb.o));
    ASSERT_TRUE(exactly_equal(ca.state, cb.state));
    ASSERT_TRUE(exactly_equal(ca.o, a.o));
  }
  // In double the two spellings run the same arithmetic: bitwise identical.
  GenConfig g;
  g.T = 150;
  g.dk = 5;
  g.dv = 3;
  g.alpha_lo = 0.7;
  g.alpha_hi = 1.0;
  const auto in = random_inputs(rng, g);
  auto diag = in;
  diag.alpha = in.alpha.replicate(1, g.dk);
  Options<double> opt;
  opt.eps = 0.01;
  const Mat<double> S0 = random_matrix(rng, g.dk, g.dv);
  EXPECT_TRUE(identical(chunk_forward(in, opt, 64, S0).o, chunk_forward(diag, opt, 64, S0).o));
  EXPECT_TRUE(identical(recurrent_forward(in, opt, S0).o, recurrent_forward(diag, opt, S0).o));
}

TEST(ChunkExact, SolvedUEqualsBetaTimesResidual) {
  // Proposition 3: the chunk matrix is unit lower-triangular and its solution is U_i = β_i e_i,
  // with e_i the residual of the tokenwise step (taken from token_step's trace, whose numbers
  // are verified by hand in test_recurrence.cpp).
  KLA_SEEDED_RNG(rng);
  std::uniform_int_distribution<int> pick(0, 2);
  for (int it = 0; it < 15; ++it) {
    RationalConfig c;
    c.T = 7;
    c.decay = static_cast<DecayKind>(pick(rng));
    c.zero_key_prob = 0.15;
    const auto in = random_rational_inputs(rng, c);
    Options<Rational> opt;
    opt.eps = random_alpha(rng);
    const Mat<Rational> S0 = random_rational_matrix(rng, c.dk, c.dv);
    const DecayTable<Rational> g(in, 0, c.T);
    const auto sys = chunk_system(in, opt, S0, 0, c.T, g);
    for (Idx i = 0; i < c.T; ++i) {
      EXPECT_EQ(sys.matrix(i, i), Rational(1));
      for (Idx j = i + 1; j < c.T; ++j) EXPECT_EQ(sys.matrix(i, j), Rational(0));
    }
    const Mat<Rational> U = forward_substitution(sys.matrix, sys.rhs);
    Mat<Rational> S = S0;
    for (Idx t = 0; t < c.T; ++t) {
      const auto tr = token_step<Rational>(S, in.decay(t), in.k.row(t).transpose(),
                                           in.v.row(t).transpose(), in.eta(t), opt);
      ASSERT_TRUE(exactly_equal(U.row(t).transpose(), Vec<Rational>(tr.beta * tr.residual)))
          << "iteration " << it << " token " << t;
    }
  }
}

// ---- long sequences: Mpfr and double against the derived bounds (test_support.hpp) -------------

namespace {

struct LongCase {
  const char* name;
  DecayKind decay;
  double alpha_lo, alpha_hi;
};
// Scalar decay from none (α = 1) to strong, and per-channel decay.
const LongCase kLongCases[] = {{"no_decay", DecayKind::none, 1, 1},
                               {"alpha_one", DecayKind::scalar, 1, 1},
                               {"mild", DecayKind::scalar, 0.99, 1.0},
                               {"moderate", DecayKind::scalar, 0.8, 0.95},
                               {"strong", DecayKind::scalar, 0.05, 0.2},
                               {"diagonal", DecayKind::diagonal, 0.5, 1.0},
                               {"diagonal_strong", DecayKind::diagonal, 0.02, 0.9}};

/// Runs tokenwise and chunkwise (C = 64) in T on the same inputs and checks the outputs and
/// final states against token bound + chunk bound (both relative to the exact run; the inputs
/// are doubles, representable exactly in T). Returns the normalised output error.
template <class T>
double long_check(std::mt19937_64& rng, const LongCase& lc, Idx n, Idx dk, Idx dv, double eta_hi) {
  SCOPED_TRACE(::testing::Message() << ScalarTraits<T>::name() << " " << lc.name << " T=" << n
                                    << " dk=" << dk << " dv=" << dv);
  GenConfig g;
  g.T = n;
  g.dk = dk;
  g.dv = dv;
  g.decay = lc.decay;
  g.alpha_lo = lc.alpha_lo;
  g.alpha_hi = lc.alpha_hi;
  g.eta_hi = eta_hi;
  const auto in_d = random_inputs(rng, g);
  const Mat<double> S0_d = random_matrix(rng, dk, dv, 0.5);
  Options<double> opt_d;
  opt_d.eps = 1.0 / 16;
  opt_d.scale = 1.0 / std::sqrt(double(dk));
  const double sigma = oracle(in_d, opt_d, S0_d).sigma();  // Σ of test_support.hpp

  const auto in = cast_inputs<T>(in_d);
  const auto opt = cast_options<T>(opt_d);
  const Mat<T> S0 = cast_mat<T>(S0_d);
  const auto tok = recurrent_forward(in, opt, S0);
  const Idx C = 64;
  const auto chk = chunk_forward(in, opt, C, S0);

  const double u = ScalarTraits<T>::unit_roundoff();
  const double a_max = max_alpha(in_d), e_max = max_eta(in_d);
  const double bound = bounds::token_output(double(dk), double(n), a_max, u) +
                       bounds::chunk_total(double(dk), double(C), e_max, double(n), a_max, u);
  const double err_o = max_row_error(chk.o, tok.o, in_d.q) / (opt_d.scale * sigma);
  const double err_s = frob_error(chk.state, tok.state) / sigma;
  if (std::getenv("KLA_TEST_VERBOSE"))
    std::printf("%-6s %-16s T=%5ld  err_o/u=%10.3g  err_s/u=%10.3g  bound/u=%10.3g\n",
                ScalarTraits<T>::name().c_str(), lc.name, long(n), err_o / u, err_s / u, bound / u);
  EXPECT_LE(err_o, bound) << "Σ = " << sigma;
  EXPECT_LE(err_s, bound) << "Σ = " << sigma;
  // Not vacuous: the two forms round differently, so some difference must be visible (exact
  // agreement over thousands of rounded outputs would mean they are the same computation).
  if (n >= C) {
    EXPECT_GT(err_o, 0.0);
  }
  // Sanity of the scale: the outputs are not all tiny relative to Σ.
  EXPECT_GT(frob_error(tok.o, Mat<T>(Mat<T>::Zero(n, dv))), 1e-3 * sigma);
  return err_o;
}

}  // namespace

TEST(ChunkLong, MpfrMatchesTokenwise) {
  // Small heads (dk = dv = 4) keep the 133-bit runs cheap; T = 4093 = 63·64 + 61 (ragged).
  KLA_SEEDED_RNG(rng);
  for (const auto& lc : kLongCases) long_check<Mpfr>(rng, lc, 4093, 4, 4, 0.9);
  // Short and boundary lengths: one partial chunk, exactly one chunk, one token past it.
  for (Idx n : {1, 63, 64, 65, 129}) long_check<Mpfr>(rng, kLongCases[4], n, 5, 3, 0.9);
}

TEST(ChunkLong, DoubleMatchesTokenwise) {
  KLA_SEEDED_RNG(rng);
  for (const auto& lc : kLongCases) long_check<double>(rng, lc, 4093, 16, 16, 0.5);
  for (Idx n : {1, 63, 64, 65, 200}) long_check<double>(rng, kLongCases[3], n, 16, 16, 0.5);
}
