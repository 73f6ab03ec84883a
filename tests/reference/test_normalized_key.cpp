// normalized_key.hpp: KLA(q,k,v,η,α) == GDN(q, k/r, v/r, β=η, α) with r = sqrt(‖k‖²+ε) — exactly in
// rationals (ε and keys chosen so that every r is rational) and within a derived bound in double.
#include "test_support.hpp"

using namespace kla::test;
using kla::ref::chunk_forward;
using kla::ref::key_norms;
using kla::ref::normalize_keys;
using kla::ref::normalize_keys_with;
using kla::ref::recurrent_forward;

namespace {

Options<Rational> gdn() {
  Options<Rational> o;
  o.coefficient = Coefficient::given;
  return o;
}

/// A rational unit vector in R^d by inverse stereographic projection of a rational point m:
/// x = (2m_1, …, 2m_{d−1}, ‖m‖² − 1)/(‖m‖² + 1), ‖x‖ = 1 exactly.
Vec<Rational> rational_unit(std::mt19937_64& rng, Idx d) {
  Vec<Rational> m(d - 1);
  for (Idx i = 0; i + 1 < d; ++i) m(i) = random_rational(rng, -3, 3, 2);
  const Rational mm = m.squaredNorm();
  Vec<Rational> x(d);
  for (Idx i = 0; i + 1 < d; ++i) x(i) = Rational(2 * m(i) / (mm + 1));
  x(d - 1) = Rational((mm - 1) / (mm + 1));
  return x;
}

}  // namespace

TEST(NormalizedKeyHand, TwoTokens) {
  // ε = 4. t1: k = (1,2), ‖k‖² = 5, r = 3; v = 6, η = 1, α = 1, q = (1,1).
  //   KLA: β = 1/(5+4) = 1/9, S1 = (1/9)(1,2)·6 = (2/3, 4/3);              o1 = 2
  //   GDN: k̂ = (1/3,2/3), v̂ = 2, β = 1: S1 = (1/3,2/3)·2 = (2/3, 4/3)
  // t2: k = (2,1), r = 3; v = 0, η = 1/2, α = 1/2, q = (3,0).
  //   KLA: S̃ = (1/3,2/3), S̃ᵀk = 4/3, e = −4/3, β = (1/2)/9 = 1/18,
  //        S2 = (1/3,2/3) + (1/18)(2,1)(−4/3) = (1/3 − 4/27, 2/3 − 2/27) = (5/27, 16/27); o2 = 5/9
  //   GDN: k̂ = (2/3,1/3), v̂ = 0, ê = −(2/9 + 2/9) = −4/9, update (1/2)(2/3,1/3)(−4/9) — same.
  HeadInputs<Rational> in;
  in.k = RM(2, 2, {R(1), R(2), R(2), R(1)});
  in.v = RM(2, 1, {R(6), R(0)});
  in.q = RM(2, 2, {R(1), R(1), R(3), R(0)});
  in.eta = RV({R(1), R(1, 2)});
  in.alpha = RM(2, 1, {R(1), R(1, 2)});
  Options<Rational> kla;
  kla.eps = R(4);
  const auto nk = normalize_keys_with(in, RV({R(3), R(3)}));
  EXPECT_TRUE(exactly_equal(nk.k, RM(2, 2, {R(1, 3), R(2, 3), R(2, 3), R(1, 3)})));
  EXPECT_TRUE(exactly_equal(nk.v, RM(2, 1, {R(2), R(0)})));
  EXPECT_TRUE(exactly_equal(nk.eta, in.eta));
  const auto a = recurrent_forward(in, kla), b = recurrent_forward(nk, gdn());
  EXPECT_TRUE(exactly_equal(a.state, RM(2, 1, {R(5, 27), R(16, 27)})));
  EXPECT_TRUE(exactly_equal(a.o, RM(2, 1, {R(2), R(5, 9)})));
  EXPECT_TRUE(exactly_equal(b.state, a.state));
  EXPECT_TRUE(exactly_equal(b.o, a.o));
}

TEST(NormalizedKeyHand, DegenerateZeroNorm) {
  // k = 0, ε = 0: r = 0, the token keeps k = 0 and gets η = 0 (β = 0 convention).
  HeadInputs<Rational> in;
  in.k = RM(2, 2, {R(0), R(0), R(3), R(4)});
  in.v = RM(2, 1, {R(7), R(10)});
  in.q = RM(2, 2, {R(1), R(0), R(0), R(1)});
  in.eta = RV({R(1, 2), R(1, 2)});
  const auto nk = normalize_keys_with(in, RV({R(0), R(5)}));
  EXPECT_EQ(nk.eta(0), R(0));
  EXPECT_EQ(nk.eta(1), R(1, 2));
  EXPECT_TRUE(exactly_equal(nk.k, RM(2, 2, {R(0), R(0), R(3, 5), R(4, 5)})));
  EXPECT_TRUE(exactly_equal(nk.v, RM(2, 1, {R(7), R(2)})));
  // KLA, ε = 0, S0 = (1,1): t1 only decays (no decay here): S1 = (1,1); o1 = 1.
  // t2: e = 10 − 7 = 3, β = (1/2)/25 = 1/50, S2 = (1,1) + (3/50)(3,4) = (59/50, 62/50); o2 = 31/25
  const Mat<Rational> S0 = RM(2, 1, {R(1), R(1)});
  const auto a = recurrent_forward(in, Options<Rational>{}, S0);
  const auto b = recurrent_forward(nk, gdn(), S0);
  EXPECT_TRUE(exactly_equal(a.state, RM(2, 1, {R(59, 50), R(31, 25)})));
  EXPECT_TRUE(exactly_equal(a.o, RM(2, 1, {R(1), R(31, 25)})));
  EXPECT_TRUE(exactly_equal(b.state, a.state));
  EXPECT_TRUE(exactly_equal(b.o, a.o));
}

TEST(NormalizedKeyHand, BadNormsThrow) {
  HeadInputs<Rational> in;
  in.k = RM(1, 2, {R(3), R(4)});
  in.q = in.k;
  in.v = RM(1, 1, {R(1)});
  in.eta = RV({R(1)});
  EXPECT_THROW(normalize_keys_with(in, RV({R(-5)})), std::invalid_argument);
  EXPECT_THROW(normalize_keys_with(in, RV({R(5), R(5)})), std::invalid_argument);
}

TEST(NormalizedKeyExact, RandomRationalSquares) {
  // For a common ε ∈ {0, 1/4, 1, 9/4} and each token a rational p ∈ (0, √ε): with
  // s = (ε/p − p)/2 and r = (ε/p + p)/2 we get s² + ε = r², so k = s·x with x a rational unit
  // vector has r = sqrt(‖k‖²+ε) rational (ε = 0: k = s·x, r = s). Some tokens have k = 0 and
  // r = √ε (rational by the choice of ε).
  KLA_SEEDED_RNG(rng);
  std::uniform_int_distribution<int> pick(0, 2), len(1, 9), dim(2, 4), which(0, 3), num(1, 4);
  std::bernoulli_distribution zero_key(0.15);
  const Rational roots[] = {R(0), R(1, 2), R(1), R(3, 2)};
  for (int it = 0; it < 25; ++it) {
    RationalConfig c;
    c.T = len(rng);
    c.dk = dim(rng);
    c.dv = dim(rng) - 1;
    c.decay = static_cast<DecayKind>(pick(rng));
    auto in = random_rational_inputs(rng, c);
    const Rational root = roots[which(rng)];
    Options<Rational> opt;
    opt.eps = root * root;
    Vec<Rational> r(c.T);
    for (Idx t = 0; t < c.T; ++t) {
      if (zero_key(rng) && root != 0) {
        in.k.row(t).setZero();
        r(t) = root;
        continue;
      }
      Rational s, rt;
      if (root == 0) {
        s = random_rational(rng, 1, 3, 2);
        rt = s;
      } else {
        const Rational p = root * R(num(rng), 5);  // 0 < p < √ε
        s = Rational((opt.eps / p - p) / 2);
        rt = Rational((opt.eps / p + p) / 2);
      }
      const Vec<Rational> x = rational_unit(rng, c.dk);
      in.k.row(t) = (s * x).transpose();
      r(t) = rt;
      ASSERT_EQ(Rational(in.k.row(t).squaredNorm() + opt.eps), Rational(rt * rt));
    }
    const Mat<Rational> S0 = random_rational_matrix(rng, c.dk, c.dv);
    const auto nk = normalize_keys_with(in, r);
    const auto a = recurrent_forward(in, opt, S0);
    const auto b = recurrent_forward(nk, gdn(), S0);
    ASSERT_TRUE(exactly_equal(b.o, a.o)) << "iteration " << it;
    ASSERT_TRUE(exactly_equal(b.state, a.state)) << "iteration " << it;
    const auto bc = chunk_forward(nk, gdn(), 4, S0);  // GDN chunked, too
    ASSERT_TRUE(exactly_equal(bc.o, a.o)) << "iteration " << it;
    ASSERT_TRUE(exactly_equal(bc.state, a.state)) << "iteration " << it;
  }
}

namespace {

// Bound on ‖KLA − GDN(k̂, v̂)‖ for outputs (units Σ·s·‖q‖), both run in T on the same inputs.
// KLA: bounds::token_output. GDN: its own rounding (≤ the same c_tok, β is not even computed)
// plus the rounding of its inputs: r = sqrt(fl(‖k‖²+ε)) has relative error ((dk+1)/2 + 1)u and
// k/r, v/r one more u, so k̂, v̂ are perturbed entrywise by δ ≤ (dk/2 + 3)u. In the exact GDN
// step W = η k̂(v̂ − S̃ᵀk̂)ᵀ this changes W by ≤ η δ(‖k̂‖‖ê‖ + ‖k̂‖‖v̂‖ + ‖k̂‖²‖S̃‖) ≤ 4δΣ (‖k̂‖ ≤ 1,
// ‖ê‖ ≤ 2Σ, ‖v̂‖ ≤ Σ), i.e. 4(dk/2+3) = 2dk + 12 more units per token, propagated like any
// local error (contraction ≤ α_max). Factor 2 for higher-order terms as in test_support.hpp.
double kla_vs_gdn_bound(double dk, double n, double alpha_max, double u) {
  return 2 * bounds::token_output(dk, n, alpha_max, u) +
         2 * (2 * dk + 12) * bounds::memory(n, alpha_max) * u;
}

template <class T>
void kla_vs_gdn(std::mt19937_64& rng, const GenConfig& g, double eps) {
  SCOPED_TRACE(::testing::Message()
               << ScalarTraits<T>::name() << " T=" << g.T << " dk=" << g.dk << " eps=" << eps
               << " alpha in [" << g.alpha_lo << "," << g.alpha_hi << "]");
  const auto in_d = random_inputs(rng, g);
  Options<double> opt_d;
  opt_d.eps = eps;
  opt_d.scale = 0.5;
  const Mat<double> S0_d = random_matrix(rng, g.dk, g.dv, 0.5);
  const double sigma = oracle(in_d, opt_d, S0_d).sigma();
  const auto in = cast_inputs<T>(in_d);
  const auto opt = cast_options<T>(opt_d);
  const Mat<T> S0 = cast_mat<T>(S0_d);
  Options<T> given = opt;
  given.coefficient = Coefficient::given;
  const auto a = recurrent_forward(in, opt, S0);
  const auto b = recurrent_forward(normalize_keys(in, opt.eps), given, S0);
  const double u = ScalarTraits<T>::unit_roundoff();
  const double bound = kla_vs_gdn_bound(double(g.dk), double(g.T), max_alpha(in_d), u);
  const double err = max_row_error(a.o, b.o, in_d.q) / (opt_d.scale * sigma);
  EXPECT_LE(err, bound);
  EXPECT_LE(frob_error(a.state, b.state) / sigma, bound);
  EXPECT_GT(err, 0.0) << "the two forms round differently; identical results are suspicious";
}

}  // namespace

TEST(NormalizedKeyRounded, DoubleWithinDerivedBound) {
  KLA_SEEDED_RNG(rng);
  GenConfig g;
  g.T = 512;
  g.dk = 16;
  g.dv = 8;
  for (double eps : {0.0, 1e-3, 0.5}) {
    g.alpha_lo = g.alpha_hi = 1;  // no decay: errors accumulate over all T tokens
    kla_vs_gdn<double>(rng, g, eps);
    g.alpha_lo = 0.8;
    g.alpha_hi = 0.99;
    kla_vs_gdn<double>(rng, g, eps);
  }
  // Keys far from unit norm (the raw form's chunk entries scale like ‖k_j‖/‖k_i‖, SPEC §1).
  g.k_norm_lo = 0.05;
  g.k_norm_hi = 20;
  kla_vs_gdn<double>(rng, g, 1e-3);
}

TEST(NormalizedKeyRounded, MpfrWithinDerivedBound) {
  KLA_SEEDED_RNG(rng);
  GenConfig g;
  g.T = 256;
  g.dk = 6;
  g.dv = 4;
  g.alpha_lo = 0.9;
  g.alpha_hi = 1;
  kla_vs_gdn<Mpfr>(rng, g, 0.25);
}

TEST(NormalizedKeyRounded, KeyNormsMatchDefinition) {
  // r_t = sqrt(‖k_t‖² + ε): k = (3,4), ε = 0 -> 5; k = (1,2), ε = 4 -> 3; k = 0, ε = 0 -> 0.
  HeadInputs<double> in;
  in.k.resize(3, 2);
  in.k << 3, 4, 1, 2, 0, 0;
  in.q = in.k;
  in.v = Mat<double>::Ones(3, 1);
  in.eta = Vec<double>::Ones(3);
  const auto r0 = key_norms(in, 0.0);
  EXPECT_EQ(r0(0), 5.0);
  EXPECT_EQ(r0(2), 0.0);
  EXPECT_EQ(key_norms(in, 4.0)(1), 3.0);
  const auto nk = normalize_keys(in, 0.0);
  EXPECT_EQ(nk.k(0, 0), 0.6);  // 3/5 rounds once
  EXPECT_EQ(nk.v(0, 0), 0.2);
  EXPECT_EQ(nk.eta(2), 0.0);  // degenerate token
}
