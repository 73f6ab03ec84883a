// grad.hpp / grad_chunk.hpp / dual.hpp in rounded arithmetic, where the exact proofs
// (proofs_check grad.*) cannot go: the q l2-norm read-out needs sqrt. The adjoint identity
//   ⟨dO, J_O·δ⟩ + ⟨dS_T, J_S·δ⟩ = ⟨∇, δ⟩
// is checked over Mpfr, with J·δ from recurrent_forward over Dual<Mpfr> (forward mode: no finite
// difference, so no truncation error, only rounding), and the chunkwise backward against the
// tokenwise one, each within a derived bound. The tests are shown able to fail: planted faults
// (kla/ref/mutants.hpp; this executable is built with KLA_REF_MUTANTS) move the identity by many
// orders of magnitude more than the bound.
//
// Bound (first-order model of test_support.hpp, normwise). Data are contractive (random_inputs:
// η < 1, 0 < α ≤ 1), so the forward maps M_t = (I − β_t k_t k_tᵀ) diag(α_t), their tangents'
// linear part (the same M_t) and the backward's M_tᵀ all have spectral norm ≤ 1. Per token each
// family (state, tangent, state gradient) takes at most n_tok = 3(dk+dv) + 14 roundings in a
// chain (the forward's 3dk + 14 of test_support.hpp, plus the dv-long products the adjoint adds);
// propagated through T contractive steps the computed family b̂ has ‖b̂ − b‖_F ≤ ρ‖b‖_F with
// ρ = 2·n_tok·T·u (the 2 covers the dropped higher-order terms). Each side of the identity is a
// sum of inner products ⟨a, b⟩ with a exact (dO, dS_T, δ) and b computed, so
//   |lhs − rhs| ≤ ρ · M,   M = Σ_families ‖a‖_F ‖b̂‖_F   (Cauchy–Schwarz, ‖b‖ ≈ ‖b̂‖).
// The chunkwise backward adds the chunk system's amplification λ = 1 + η(C−1) twice (forward
// and back substitution) and C-long products: ρ_chunk = 2·(n_tok·T + 2λ²C·(2dk + 2C + 4))·u,
// relative to the Frobenius norm of each gradient (test_support.hpp's chunk bound, same model).
#include "kla/ref/dual.hpp"
#include "kla/ref/grad_chunk.hpp"
#include "test_support.hpp"

using namespace kla::test;
using kla::ref::Dual;
using kla::ref::HeadGradients;
using kla::ref::Mutant;

namespace {

using D = Dual<Mpfr>;
const double u = ScalarTraits<Mpfr>::unit_roundoff();

Mpfr frob(const Mat<Mpfr>& a, const Mat<Mpfr>& b) {
  return a.cwiseProduct(b).sum();
}
double norm(const Mat<Mpfr>& a) {
  return std::sqrt(to_double(Mpfr(a.squaredNorm())));
}

struct Problem {
  HeadInputs<Mpfr> in, dir;
  Options<Mpfr> opt;
  Mat<Mpfr> S0, dS0;
  HeadOutputs<Mpfr> up;
};

Problem draw(std::mt19937_64& rng, Idx T, Idx dk, Idx dv, DecayKind decay, Coefficient c,
             Readout r) {
  GenConfig g;
  g.T = T;
  g.dk = dk;
  g.dv = dv;
  g.decay = decay;
  g.alpha_lo = 0.5;
  Problem p;
  p.in = cast_inputs<Mpfr>(random_inputs(rng, g));
  p.dir.q = cast_mat<Mpfr>(random_matrix(rng, T, dk));
  p.dir.k = cast_mat<Mpfr>(random_matrix(rng, T, dk));
  p.dir.v = cast_mat<Mpfr>(random_matrix(rng, T, dv));
  p.dir.eta = cast_mat<Mpfr>(random_matrix(rng, T, 1));
  p.dir.alpha = cast_mat<Mpfr>(random_matrix(rng, p.in.alpha.rows(), p.in.alpha.cols()));
  p.opt.eps = Mpfr(1) / 64;
  p.opt.coefficient = c;
  p.opt.readout = r;
  p.opt.scale = Mpfr(1) / 2;
  p.S0 = cast_mat<Mpfr>(random_matrix(rng, dk, dv));
  p.dS0 = cast_mat<Mpfr>(random_matrix(rng, dk, dv));
  p.up.o = cast_mat<Mpfr>(random_matrix(rng, T, dv));
  p.up.state = cast_mat<Mpfr>(random_matrix(rng, dk, dv));
  return p;
}

/// |lhs − rhs| / (ρ·M): the adjoint identity's discrepancy in units of its bound (≤ 1 passes),
/// for recurrent_backward's gradients or, when given, `other`'s.
double adjoint_ratio(const Problem& p, const HeadGradients<Mpfr>* other = nullptr) {
  HeadInputs<D> in;
  in.q = kla::ref::make_dual<Mpfr>(p.in.q, p.dir.q);
  in.k = kla::ref::make_dual<Mpfr>(p.in.k, p.dir.k);
  in.v = kla::ref::make_dual<Mpfr>(p.in.v, p.dir.v);
  in.eta = kla::ref::make_dual<Mpfr>(p.in.eta, p.dir.eta);
  in.alpha = kla::ref::make_dual<Mpfr>(p.in.alpha, p.dir.alpha);
  Options<D> opt;
  opt.eps = p.opt.eps;
  opt.coefficient = p.opt.coefficient;
  opt.readout = p.opt.readout;
  opt.scale = p.opt.scale;
  opt.l2norm_eps = p.opt.l2norm_eps;
  const auto fwd = kla::ref::recurrent_forward<D>(in, opt, kla::ref::make_dual<Mpfr>(p.S0, p.dS0));
  const Mat<Mpfr> tO = kla::ref::tangent_part<Mpfr>(fwd.o),
                  tS = kla::ref::tangent_part<Mpfr>(fwd.state);
  const HeadGradients<Mpfr> g =
      other ? *other : kla::ref::recurrent_backward<Mpfr>(p.in, p.opt, p.S0, p.up);
  const Mpfr lhs = frob(p.up.o, tO) + frob(p.up.state, tS);
  const Mpfr rhs = frob(g.q, p.dir.q) + frob(g.k, p.dir.k) + frob(g.v, p.dir.v) +
                   frob(g.eta, p.dir.eta) + frob(g.alpha, p.dir.alpha) + frob(g.state, p.dS0);
  const double M = norm(p.up.o) * norm(tO) + norm(p.up.state) * norm(tS) +
                   norm(g.q) * norm(p.dir.q) + norm(g.k) * norm(p.dir.k) +
                   norm(g.v) * norm(p.dir.v) + norm(g.eta) * norm(p.dir.eta) +
                   norm(g.alpha) * norm(p.dir.alpha) + norm(g.state) * norm(p.dS0);
  const double T = double(p.in.length()), n_tok = 3.0 * double(p.in.dk() + p.in.dv()) + 14;
  const double rho = 2 * n_tok * T * u;
  return std::abs(to_double(Mpfr(lhs - rhs))) / (rho * M);
}

/// max over the gradients of ‖chunked − tokenwise‖_F / (ρ_chunk ‖tokenwise‖_F).
double chunk_ratio(const Problem& p, Idx C) {
  const auto tok = kla::ref::recurrent_backward<Mpfr>(p.in, p.opt, p.S0, p.up);
  const auto chk = kla::ref::chunk_backward<Mpfr>(p.in, p.opt, C, p.S0, p.up);
  const double T = double(p.in.length()), dk = double(p.in.dk());
  const double n_tok = 3.0 * double(p.in.dk() + p.in.dv()) + 14;
  const double eta = to_double(Mpfr(p.in.eta.maxCoeff())), lam = 1 + eta * double(C - 1);
  const double rho = 2 * (n_tok * T + 2 * lam * lam * double(C) * (2 * dk + 2 * double(C) + 4)) * u;
  double worst = 0;
  auto cmp = [&](const Mat<Mpfr>& a, const Mat<Mpfr>& b) {
    const double n = norm(b);
    if (n > 0) worst = std::max(worst, frob_error(a, b) / (rho * n));
  };
  cmp(chk.q, tok.q);
  cmp(chk.k, tok.k);
  cmp(chk.v, tok.v);
  cmp(chk.eta, tok.eta);
  cmp(chk.alpha, tok.alpha);
  cmp(chk.state, tok.state);
  return worst;
}

struct Setting {
  DecayKind decay;
  Coefficient c;
  Readout r;
};
const Setting settings[] = {
    {DecayKind::scalar, Coefficient::kaczmarz, Readout::q_l2norm},
    {DecayKind::diagonal, Coefficient::kaczmarz, Readout::q_l2norm},
    {DecayKind::none, Coefficient::given, Readout::q_l2norm},
    {DecayKind::scalar, Coefficient::given, Readout::scale},
    {DecayKind::diagonal, Coefficient::kaczmarz, Readout::scale},
    {DecayKind::scalar, Coefficient::kaczmarz, Readout::qk_l2norm},
    {DecayKind::none, Coefficient::given, Readout::qk_l2norm},
};

}  // namespace

TEST(GradMpfr, AdjointIdentityWithinBound) {
  KLA_SEEDED_RNG(rng);
  double worst = 0;
  for (const auto& s : settings)
    for (int rep = 0; rep < 4; ++rep) {
      const double r = adjoint_ratio(draw(rng, 16, 4, 3, s.decay, s.c, s.r));
      EXPECT_LE(r, 1.0) << "decay " << int(s.decay) << " coefficient " << int(s.c) << " readout "
                        << int(s.r);
      worst = std::max(worst, r);
    }
  std::cout << "worst |lhs - rhs| / bound: " << worst << "\n";
}

TEST(GradMpfr, ChunkEqualsTokenWithinBound) {
  KLA_SEEDED_RNG(rng);
  double worst = 0;
  for (const auto& s : settings)
    for (const Idx C : {Idx(1), Idx(5), Idx(16), Idx(20)}) {
      const double r = chunk_ratio(draw(rng, 16, 4, 3, s.decay, s.c, s.r), C);
      EXPECT_LE(r, 1.0) << "chunk " << C << " decay " << int(s.decay) << " readout " << int(s.r);
      worst = std::max(worst, r);
    }
  std::cout << "worst difference / bound: " << worst << "\n";
}

// The checks above can fail: planted faults in the backward move them far past the bound.
TEST(GradMpfr, PlantedFaultsBreakTheBound) {
  KLA_SEEDED_RNG(rng);
  const Problem p =
      draw(rng, 16, 4, 3, DecayKind::scalar, Coefficient::kaczmarz, Readout::q_l2norm);
  for (const Mutant m : {Mutant::grad_carry_undecayed, Mutant::grad_kaczmarz_norm_term,
                         Mutant::grad_decay_one_channel}) {
    kla::ref::active_mutant() = m;
    const double r = adjoint_ratio(p);
    kla::ref::active_mutant() = Mutant::none;
    EXPECT_GT(r, 1e6) << kla::ref::mutant_name(m);
  }
  for (const Mutant m : {Mutant::grad_chunk_gram_term, Mutant::grad_chunk_carry_no_gamma}) {
    kla::ref::active_mutant() = m;
    const double r = chunk_ratio(p, 5);
    kla::ref::active_mutant() = Mutant::none;
    EXPECT_GT(r, 1e6) << kla::ref::mutant_name(m);
  }
}

// The q l2-norm term of dq (∂s/∂q = −q/‖q‖³) is visible to the adjoint check: leaving it out
// (computing dq as if s were a constant) moves ⟨∇q, δq⟩ by far more than the bound.
TEST(GradMpfr, QNormTermIsVisible) {
  KLA_SEEDED_RNG(rng);
  const Problem p =
      draw(rng, 16, 4, 3, DecayKind::scalar, Coefficient::kaczmarz, Readout::q_l2norm);
  const auto fwd = kla::ref::recurrent_forward<Mpfr>(p.in, p.opt, p.S0);
  Mpfr term = 0;
  for (Idx t = 0; t < p.in.length(); ++t) {
    const Vec<Mpfr> q = p.in.q.row(t).transpose();
    const Mpfr s = kla::ref::readout_scale(q, p.opt);
    const Mpfr y_do = fwd.o.row(t).dot(p.up.o.row(t)) / s;  // (S_tᵀq)·do
    term += p.dir.q.row(t).dot(kla::ref::readout_scale_backward(q, y_do, p.opt));
  }
  const double T = 16, n_tok = 3.0 * (4 + 3) + 14;
  const double bound = 2 * n_tok * T * u * norm(p.dir.q) *
                       norm(kla::ref::recurrent_backward<Mpfr>(p.in, p.opt, p.S0, p.up).q);
  EXPECT_GT(std::abs(to_double(term)), 1e6 * bound);
}

// The qk l2-norm read-out's chain (detail::qk_l2norm_chain): dropping its radial term (taking
// dq = dq̂ / r, dk = dk̂ / r, as if the norms were constants) moves the adjoint identity far past
// the bound, so the settings above check that term; ε_n = 1/64 keeps r away from ‖x‖.
TEST(GradMpfr, QkNormChainIsVisible) {
  KLA_SEEDED_RNG(rng);
  Problem p = draw(rng, 16, 4, 3, DecayKind::scalar, Coefficient::kaczmarz, Readout::qk_l2norm);
  p.opt.l2norm_eps = Mpfr(1) / 64;
  EXPECT_LE(adjoint_ratio(p), 1.0);
  const auto [hat, hopt] = kla::ref::with_qk_l2norm(p.in, p.opt);
  HeadGradients<Mpfr> g = kla::ref::recurrent_backward<Mpfr>(hat, hopt, p.S0, p.up);
  for (Idx t = 0; t < p.in.length(); ++t) {
    g.q.row(t) /= sqrt(Mpfr(p.in.q.row(t).squaredNorm() + p.opt.l2norm_eps));
    g.k.row(t) /= sqrt(Mpfr(p.in.k.row(t).squaredNorm() + p.opt.l2norm_eps));
  }
  EXPECT_GT(adjoint_ratio(p, &g), 1e6);
}
