// segment.hpp in rounded arithmetic (proofs_check seg.combine has the exact identity): the
// segmented forward in double against the Mpfr tokenwise run on the same inputs, within a bound
// derived like test_support.hpp's tokenwise one; bad segment lists refused; the planted
// composition-order fault breaks the bound by orders of magnitude.
//
// Bound. The segmented path applies each token as the product A_t·X with the dk × dk transition
// A_t = (I − β k kᵀ) diag(α) instead of the rank-one update: A_t's entries carry β's (dk+2)u plus
// 3u (k kᵀ, the difference, the decay), the product dk·u more, so per token the same
// c_tok = 3dk + 14 units of uΣ as the tokenwise update; it runs three such chains (the segment
// maps from zero, their composition, the prefix maps of the outputs), each contracting like the
// tokenwise one (‖A_t‖₂ ≤ 1): three times bounds::token_state / token_output.
#include "kla/ref/segment.hpp"
#include "kla/ref/segment_backward.hpp"
#include "test_support.hpp"

using namespace kla::test;
using kla::ref::Mutant;

namespace {

struct SegmentRun {
  double o, state, bound_o, bound_state;
};

SegmentRun segmented_error(std::mt19937_64& rng, const std::vector<Idx>& lengths, Idx T) {
  GenConfig g;
  g.T = T;
  g.dk = 6;
  g.dv = 4;
  g.alpha_lo = 0.6;
  const auto in = random_inputs(rng, g);
  Options<double> opt;
  opt.eps = 1.0 / 16;
  const Mat<double> S0 = random_matrix(rng, g.dk, g.dv);
  const double sigma = oracle(in, opt, S0).sigma();
  const auto truth = kla::ref::recurrent_forward(cast_inputs<Mpfr>(in), cast_options<Mpfr>(opt),
                                                 cast_mat<Mpfr>(S0));
  const auto seg = kla::ref::segment_forward(in, opt, lengths, S0);
  const double u = ScalarTraits<double>::unit_roundoff(), a = max_alpha(in);
  return {max_row_error(seg.o, truth.o, in.q) / sigma, frob_error(seg.state, truth.state) / sigma,
          3 * bounds::token_output(double(g.dk), double(T), a, u),
          3 * bounds::token_state(double(g.dk), double(T), a, u)};
}

}  // namespace

TEST(SegmentDouble, EqualsTheMpfrRunWithinTheBound) {
  KLA_SEEDED_RNG(rng);
  const std::vector<std::vector<Idx>> cuts = {
      {40}, {10, 30}, {0, 13, 0, 27}, {1, 1, 38}, {20, 20, 0}};
  double worst = 0;
  for (const auto& cut : cuts) {
    const SegmentRun r = segmented_error(rng, cut, 40);
    EXPECT_LE(r.o, r.bound_o);
    EXPECT_LE(r.state, r.bound_state);
    worst = std::max({worst, r.o / r.bound_o, r.state / r.bound_state});
  }
  std::cout << "worst error / bound: " << worst << "\n";
}

TEST(SegmentDouble, BadSegmentListsAreRefused) {
  KLA_SEEDED_RNG(rng);
  GenConfig g;
  g.T = 5;
  const auto in = random_inputs(rng, g);
  const Options<double> opt;
  EXPECT_THROW(kla::ref::segment_forward(in, opt, {2, 2}), std::invalid_argument);  // sums to 4
  EXPECT_THROW(kla::ref::segment_forward(in, opt, {6, -1}), std::invalid_argument);
  EXPECT_NO_THROW(kla::ref::segment_forward(in, opt, {0, 5, 0}));
}

#ifdef KLA_REF_MUTANTS
TEST(SegmentDouble, PlantedCompositionOrderBreaksTheBound) {
  KLA_SEEDED_RNG(rng);
  kla::ref::active_mutant() = Mutant::segment_combine_order;
  const SegmentRun r = segmented_error(rng, {10, 15, 15}, 40);
  kla::ref::active_mutant() = Mutant::none;
  // Composing the maps in the wrong order errs by far more than the derived bound, but how far
  // varies: the smallest of 1500 seeds was 1.9e5 times, and 2 of 200 seeds fell below the 1e6
  // this test used to ask (a CI run failed on one). The low tail is segments whose maps nearly
  // commute. 1e4 times the bound is still far outside anything rounding explains.
  EXPECT_GT(r.state, 1e4 * r.bound_state) << "ratio " << r.state / r.bound_state;
}
#endif

// segment_backward.hpp: proofs_check seg.grad_combine has its exact identity; here its contracts
// in double. An empty segment is the identity map: inserting one anywhere changes no bit of any
// gradient (1·x and x + 0 are exact); bad segment lists are refused before anything is computed.
TEST(SegmentBackwardDouble, EmptySegmentsChangeNoBitAndBadListsAreRefused) {
  KLA_SEEDED_RNG(rng);
  GenConfig g;
  g.T = 30;
  g.dk = 5;
  g.dv = 3;
  g.alpha_lo = 0.6;
  const auto in = random_inputs(rng, g);
  Options<double> opt;
  opt.eps = 1.0 / 16;
  const Mat<double> S0 = random_matrix(rng, g.dk, g.dv);
  kla::ref::HeadOutputs<double> up;
  up.o = random_matrix(rng, g.T, g.dv);
  up.state = random_matrix(rng, g.dk, g.dv);
  const auto a = kla::ref::segment_backward(in, opt, {12, 18}, S0, up);
  const auto b = kla::ref::segment_backward(in, opt, {0, 12, 0, 0, 18, 0}, S0, up);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
  EXPECT_EQ(a.eta, b.eta);
  EXPECT_EQ(a.alpha, b.alpha);
  EXPECT_EQ(a.state, b.state);
  EXPECT_THROW(kla::ref::segment_backward(in, opt, {10, 10}, S0, up), std::invalid_argument);
  EXPECT_THROW(kla::ref::segment_backward(in, opt, {31, -1}, S0, up), std::invalid_argument);
}
