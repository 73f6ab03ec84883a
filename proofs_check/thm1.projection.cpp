// thm1.projection — Theorem 1 (i), proof in Appendix A: with η = 1, ε = 0 the step S_t is the
// orthogonal projection of S̃ onto A = {S : Sᵀk = v}: S_t − S̃ ⟂ {H : Hᵀk = 0} in Frobenius, and
// ‖S − S̃‖² = ‖S − S_t‖² + ‖S_t − S̃‖² (so S_t is the unique closest point) for every S ∈ A.
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("thm1.projection", "Theorem 1 (i), App. A") {
  const Idx dk = dim(), dv = dim();
  const Mat<Q> S_prev = *matrix(dk, dv);
  const Vec<Q> a = decay_vector(dk, any_decay() == DecayKind::diagonal);
  const Vec<Q> k = *nonzero_vector(dk), v = *vector(dv);
  const Q kk = k.squaredNorm();

  Mat<Q> S_t = S_prev;
  kla::ref::token_step<Q>(S_t, a, k, v, Q(1), kla::ref::Options<Q>{});
  const Mat<Q> S_tilde = a.asDiagonal() * S_prev;
  const Mat<Q> step = S_t - S_tilde;

  // A tangent direction of A: a random matrix with its k-component removed.
  const Mat<Q> M = *matrix(dk, dv);
  const Mat<Q> H = M - k * (M.transpose() * k).transpose() / kk;
  require_equal(H.transpose() * k, Vec<Q>::Zero(dv), "H^T k and 0");
  RC_ASSERT(oracle::frobenius(step, H) == Q(0));

  // A random point of A (a random matrix moved along k onto the constraint).
  const Mat<Q> N = *matrix(dk, dv);
  const Mat<Q> S = N + k * (v - N.transpose() * k).transpose() / kk;
  require_equal(S.transpose() * k, v, "S^T k and v");
  require_equal(S_t.transpose() * k, v, "S_t^T k and v");
  const Q far = (S - S_tilde).squaredNorm(), near = step.squaredNorm();
  RC_ASSERT(far == Q((S - S_t).squaredNorm()) + near);
  if (S != S_t) RC_ASSERT(far > near);
}
