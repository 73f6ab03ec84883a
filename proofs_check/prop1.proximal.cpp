// prop1.proximal — Proposition 1 (exact proximal form), proof in Appendix A: for η ∈ (0,1],
// ε ≥ 0 with (1−η)‖k‖²+ε > 0 and μ = η/((1−η)‖k‖²+ε), the KLA step S_t has ∇J(S_t) = 0 for
// J(S) = ½‖S − S̃‖² + (μ/2)‖Sᵀk − v‖², and J(S_t + Δ) − J(S_t) = ½‖Δ‖² + (μ/2)‖Δᵀk‖² > 0, Δ ≠ 0.
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("prop1.proximal", "Proposition 1, App. A") {
  const TokenCase c = token_case(false);
  const Idx dk = c.dk, dv = c.dv;
  const Mat<Q>& S_prev = c.S_prev;
  const Vec<Q>&a = c.a, &k = c.k, &v = c.v;
  const Q kk = c.kk;
  const Q eta = *kla::proofs::eta();
  kla::ref::Options<Q> opt;
  opt.eps = *eps();
  // μ needs (1−η)‖k‖²+ε > 0: excluded are η = 1 with ε = 0, and k = 0 with ε = 0.
  if ((Q(1) - eta) * kk + opt.eps == Q(0)) opt.eps = *positive_eps();
  const Q mu = eta / ((Q(1) - eta) * kk + opt.eps);
  RC_ASSERT(kla::ref::proximal_weight<Q>(kk, eta, opt.eps) == mu);

  Mat<Q> S_t = S_prev;
  kla::ref::token_step<Q>(S_t, a, k, v, eta, opt);
  const Mat<Q> S_tilde = a.asDiagonal() * S_prev;

  const Mat<Q> grad = (S_t - S_tilde) + (mu * k) * (S_t.transpose() * k - v).transpose();
  require_equal(grad, Mat<Q>::Zero(dk, dv), "grad J(S_t) and 0");
  require_equal(kla::ref::proximal_gradient<Q>(S_t, S_tilde, k, v, mu), grad, "proximal_gradient");
  require_equal(kla::ref::proximal_minimizer<Q>(S_tilde, k, v, mu), S_t, "argmin J and S_t");

  auto J = [&](const Mat<Q>& S) {
    return Q((S - S_tilde).squaredNorm() / Q(2) +
             mu * (S.transpose() * k - v).squaredNorm() / Q(2));
  };
  const Mat<Q> delta =
      *rc::gen::suchThat(matrix(dk, dv), [](const Mat<Q>& m) { return m.squaredNorm() != Q(0); });
  const Q gap = J(S_t + delta) - J(S_t);
  RC_ASSERT(gap ==
            Q(delta.squaredNorm() / Q(2) + mu * (delta.transpose() * k).squaredNorm() / Q(2)));
  RC_ASSERT(gap > Q(0));
  RC_ASSERT(kla::ref::proximal_objective<Q>(S_t, S_tilde, k, v, mu) == J(S_t));
}
