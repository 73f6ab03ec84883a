// thm1.lagrange — Appendix A, "Alternative derivation via Lagrange multipliers": with
// λ = −e/‖k‖², the Kaczmarz step S_t = S̃ − kλᵀ satisfies the KKT system (∂J/∂S = 0, Sᵀk = v) of
// J(S, λ) = ½‖S − S̃‖² + λᵀ(Sᵀk − v), and minimises J(·, λ): J(S, λ) = J(S_t, λ) + ½‖S − S_t‖².
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("thm1.lagrange", "Theorem 1, App. A (Lagrange)") {
  const TokenCase c = token_case(true);
  const Idx dk = c.dk, dv = c.dv;
  const Mat<Q>&S_prev = c.S_prev, &S_tilde = c.S_tilde;
  const Vec<Q>&a = c.a, &k = c.k, &v = c.v, &e = c.e;
  const Q kk = c.kk;
  const Vec<Q> lambda = -e / kk;

  Mat<Q> S_t = S_prev;
  kla::ref::token_step<Q>(S_t, a, k, v, Q(1), kla::ref::Options<Q>{});
  require_equal(S_t, S_tilde - k * lambda.transpose(), "Kaczmarz step and S~ - k lambda^T");
  // KKT: stationarity in S and primal feasibility.
  require_equal(S_t - S_tilde + k * lambda.transpose(), Mat<Q>::Zero(dk, dv), "dJ/dS at S_t");
  require_equal(S_t.transpose() * k, v, "S_t^T k and v");
  // The multiplier is the one stationarity forces: λ = −(S_t − S̃)ᵀk/‖k‖².
  require_equal(-(S_t - S_tilde).transpose() * k / kk, lambda, "multiplier from S_t and lambda");

  auto J = [&](const Mat<Q>& S) {
    return Q((S - S_tilde).squaredNorm() / Q(2) + lambda.dot(S.transpose() * k - v));
  };
  const Mat<Q> S = *matrix(dk, dv);
  RC_ASSERT(J(S) == J(S_t) + Q((S - S_t).squaredNorm() / Q(2)));
}
