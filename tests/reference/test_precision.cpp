// Agreement across scalar types. The same inputs — generated in double, then rounded to the type
// under test so that the type and the Mpfr ground truth see identical values — are run in Mpfr
// and in double, float, emulated bf16 and fp16. The error is bounded above by the bound derived
// from the type's unit roundoff in test_support.hpp and below by a small multiple of it, so a
// type that silently computes in another precision fails either way.
#include <cstdio>

#include "test_support.hpp"

using namespace kla::test;
using kla::ref::recurrent_forward;

namespace {

/// Configurations per type. Low precision gets small heads and decaying states so the derived
/// bound stays informative (c·u < 1): bf16 has u = 2^-8, so the bound for dk = 4 and memory
/// L = 1/(1 − α_max) = 2 is 2(26·2 + 5)u = 114u ≈ 0.45.
template <class T>
std::vector<GenConfig> configs() {
  std::vector<GenConfig> cs;
  GenConfig g;
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    g.T = 512;
    g.dk = 8;
    g.dv = 8;
    g.alpha_lo = g.alpha_hi = 1;  // no decay: the error may build up over all 512 tokens
    cs.push_back(g);
    g.alpha_lo = 0.8;
    g.alpha_hi = 0.95;
    cs.push_back(g);
    g.decay = DecayKind::diagonal;
    g.alpha_lo = 0.5;
    g.alpha_hi = 1.0;
    cs.push_back(g);
  } else {
    g.T = 128;
    g.dk = 4;
    g.dv = 4;
    g.alpha_lo = 0.25;
    g.alpha_hi = 0.5;
    cs.push_back(g);
    g.decay = DecayKind::diagonal;
    cs.push_back(g);
  }
  return cs;
}

struct Errors {
  double output = 0;  ///< max_t ‖ô_t − o_t‖ / (Σ s ‖q_t‖)
  double state = 0;   ///< ‖Ŝ − S‖_F / Σ
  double bound_output = 0, bound_state = 0;
};

/// One draw: inputs rounded to T, run in T and in Mpfr, errors normalised by Σ.
template <class T>
Errors one_draw(std::mt19937_64& rng, const GenConfig& g, const Options<double>& opt_d) {
  const auto in_d = round_inputs<T>(random_inputs(rng, g));
  const Mat<double> S0_d = round_mat<T>(random_matrix(rng, g.dk, g.dv, 0.5));
  const double sigma = oracle(in_d, opt_d, S0_d).sigma();

  const auto truth =
      recurrent_forward(cast_inputs<Mpfr>(in_d), cast_options<Mpfr>(opt_d), cast_mat<Mpfr>(S0_d));
  const auto got =
      recurrent_forward(cast_inputs<T>(in_d), cast_options<T>(opt_d), cast_mat<T>(S0_d));
  // The inputs really are identical: casting the T inputs to Mpfr reproduces the Mpfr inputs.
  EXPECT_TRUE(identical(cast_mat<Mpfr>(cast_inputs<T>(in_d).k), cast_mat<Mpfr>(in_d.k)));

  const double u = ScalarTraits<T>::unit_roundoff();
  Errors e;
  e.output = max_row_error(got.o, truth.o, in_d.q) / (to_double(opt_d.scale) * sigma);
  e.state = frob_error(got.state, truth.state) / sigma;
  e.bound_output = bounds::token_output(double(g.dk), double(g.T), max_alpha(in_d), u);
  e.bound_state = bounds::token_state(double(g.dk), double(g.T), max_alpha(in_d), u);
  return e;
}

template <class T>
class Precision : public ::testing::Test {};
using RoundedTypes = ::testing::Types<double, float, bf16, fp16>;
TYPED_TEST_SUITE(Precision, RoundedTypes);

}  // namespace

TYPED_TEST(Precision, AgreesWithMpfrWithinDerivedBound) {
  using T = TypeParam;
  KLA_SEEDED_RNG(rng);
  const double u = ScalarTraits<T>::unit_roundoff();
  for (const GenConfig& g : configs<T>()) {
    for (double eps : {0.0, 1.0 / 16}) {
      Options<double> opt;
      opt.eps = eps;  // 0 and 2^-4 are exact in every type
      opt.scale = 0.5;
      SCOPED_TRACE(::testing::Message() << ScalarTraits<T>::name() << " T=" << g.T << " dk=" << g.dk
                                        << " decay=" << int(g.decay) << " alpha=[" << g.alpha_lo
                                        << "," << g.alpha_hi << "] eps=" << eps);
      double worst = 0;
      for (int draw = 0; draw < 3; ++draw) {
        const Errors e = one_draw<T>(rng, g, opt);
        if (std::getenv("KLA_TEST_VERBOSE"))
          std::printf(
              "%-5s dk=%ld alpha=[%.2f,%.2f] eps=%.4f  out/u=%8.3g state/u=%8.3g  "
              "bound/u=%8.3g\n",
              ScalarTraits<T>::name().c_str(), long(g.dk), g.alpha_lo, g.alpha_hi, eps,
              e.output / u, e.state / u, e.bound_output / u);
        EXPECT_LE(e.output, e.bound_output);
        EXPECT_LE(e.state, e.bound_state);
        worst = std::max(worst, e.output);
      }
      // Lower bound: every output is rounded to T at least once (the read-out product), and the
      // state entries it is read from carry accumulated T-roundings, so among 3·T·dv outputs the
      // largest normalised error is not below u/16 unless the arithmetic is secretly wider.
      // (Observed values are ≈ u/2 … 3u; u/16 is 1/8 of a rounding of an output of size Σ·s‖q‖/2.)
      EXPECT_GT(worst, u / 16) << "errors far below u: is " << ScalarTraits<T>::name()
                               << " really computing in its own precision?";
    }
  }
}

TEST(PrecisionGroundTruth, MpfrAgreesWithRational) {
  // The ground truth itself: Mpfr against the exact rational run on the same (double) inputs,
  // within the bound derived for u = 2^-134, and not exact (1/(‖k‖²+ε) is not dyadic).
  KLA_SEEDED_RNG(rng);
  GenConfig g;
  g.T = 16;
  g.dk = 3;
  g.dv = 2;
  g.alpha_lo = 0.5;
  g.alpha_hi = 1;
  const auto in_d = random_inputs(rng, g);
  Options<double> opt_d;
  opt_d.eps = 0.1;  // not dyadic: becomes the double nearest 0.1, exact as a rational
  const Mat<double> S0_d = random_matrix(rng, g.dk, g.dv);
  const double sigma = oracle(in_d, opt_d, S0_d).sigma();
  const auto exact = recurrent_forward(cast_inputs<Rational>(in_d), cast_options<Rational>(opt_d),
                                       cast_mat<Rational>(S0_d));
  const auto mp =
      recurrent_forward(cast_inputs<Mpfr>(in_d), cast_options<Mpfr>(opt_d), cast_mat<Mpfr>(S0_d));
  const double u = ScalarTraits<Mpfr>::unit_roundoff();
  const double err = max_row_error(mp.o, exact.o, in_d.q) / sigma;
  EXPECT_LE(err, bounds::token_output(3, 16, 1, u));
  EXPECT_GT(err, u / 16);
  EXPECT_LE(frob_error(mp.state, exact.state) / sigma, bounds::token_state(3, 16, 1, u));
}

TEST(PrecisionGroundTruth, TypesAreOrdered) {
  // One fixed problem, all types: the errors must be ordered like the unit roundoffs
  // (fp64 < fp32 < fp16 < bf16), each well separated. Uses the bf16-representable inputs for all.
  KLA_SEEDED_RNG(rng);
  GenConfig g;
  g.T = 128;
  g.dk = 4;
  g.dv = 4;
  g.alpha_lo = 0.25;
  g.alpha_hi = 0.5;
  auto in_d = round_inputs<bf16>(random_inputs(rng, g));
  // bf16 values with |x| in fp16's normal range [2^-14, 65504] are fp16 values too; the rare
  // smaller entries are set to 0 so that every type sees exactly the same numbers.
  for (Mat<double>* m : {&in_d.q, &in_d.k, &in_d.v, &in_d.alpha})
    *m = m->unaryExpr([](double x) { return std::abs(x) < 0x1p-14 ? 0.0 : x; });
  EXPECT_TRUE(identical(round_inputs<fp16>(in_d).q, in_d.q));
  EXPECT_TRUE(identical(round_inputs<fp16>(in_d).k, in_d.k));
  EXPECT_TRUE(identical(round_inputs<fp16>(in_d).v, in_d.v));
  Options<double> opt_d;
  opt_d.scale = 0.5;
  opt_d.eps = 1.0 / 16;
  const auto truth = recurrent_forward(cast_inputs<Mpfr>(in_d), cast_options<Mpfr>(opt_d));
  auto err = [&](auto tag) {
    using T = decltype(tag);
    const auto r = recurrent_forward(cast_inputs<T>(in_d), cast_options<T>(opt_d));
    return max_row_error(r.o, truth.o, in_d.q);
  };
  const double e64 = err(double{}), e32 = err(float{}), e16 = err(fp16{}), eb = err(bf16{});
  EXPECT_LT(e64 * 1e6, e32);
  EXPECT_LT(e32 * 100, e16);
  EXPECT_LT(e16 * 2, eb);
}
