// thm1.constraint — Theorem 1: with η = 1 and ε = 0 the new state reads back the value just
// written, S_tᵀ k_t = v_t, for any incoming state and decay (k ≠ 0).
#include "generators.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("thm1.constraint", "Theorem 1 (S^T k = v)") {
  const Idx dk = dim(), dv = dim();
  Mat<Q> S = *matrix(dk, dv);
  const Vec<Q> k = *nonzero_vector(dk), v = *vector(dv);
  const Vec<Q> a =
      any_decay() == DecayKind::diagonal ? Vec<Q>(*vector(dk)) : Vec<Q>::Constant(dk, *alpha());
  kla::ref::Options<Q> opt;  // Kaczmarz, ε = 0
  kla::ref::token_step<Q>(S, a, k, v, Q(1), opt);
  require_equal(S.transpose() * k, v, "S_t^T k and v");
}
