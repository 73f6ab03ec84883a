// thm1.line_search — Theorem 1 (ii), eq. (line_search_loss): along S(τ) = S̃ + τ k eᵀ the loss is
// L(S(τ)) = ½(1 − τ‖k‖²)²‖e‖² for every τ, minimised at τ* = 1/‖k‖², and the Kaczmarz step with
// η = 1, ε = 0 is S(τ*).
#include <vector>

#include "generators.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("thm1.line_search", "Theorem 1 (ii), eq. line_search") {
  const TokenCase c = token_case(true);
  const Mat<Q>&S_prev = c.S_prev, &S_tilde = c.S_tilde;
  const Vec<Q>&a = c.a, &k = c.k, &v = c.v, &e = c.e;
  const Q kk = c.kk;
  const Q ee = e.squaredNorm();
  const Q tau_star = Q(1) / kk;

  auto path = [&](const Q& tau) { return Mat<Q>(S_tilde + (tau * k) * e.transpose()); };
  std::vector<Q> taus = {Q(0), tau_star, Q(1), tau_star + *rational() / Q(16)};
  for (int n = 0; n < 4; ++n) taus.push_back(*rational());
  for (const Q& tau : taus) {
    const Mat<Q> S = path(tau);
    const Q closed = (Q(1) - tau * kk) * (Q(1) - tau * kk) * ee / Q(2);
    const Q inline_loss = (S.transpose() * k - v).squaredNorm() / Q(2);
    RC_ASSERT(inline_loss == closed);
    RC_ASSERT(kla::ref::token_loss<Q>(S, k, v) == closed);
    if (tau != tau_star && ee != Q(0)) RC_ASSERT(closed > Q(0));
  }
  RC_ASSERT(kla::ref::token_loss<Q>(path(tau_star), k, v) == Q(0));

  Mat<Q> S_t = S_prev;
  const auto tr = kla::ref::token_step<Q>(S_t, a, k, v, Q(1), kla::ref::Options<Q>{});
  RC_ASSERT(tr.beta == tau_star);
  require_equal(tr.residual, e, "residual and e");
  require_equal(S_t, path(tau_star), "Kaczmarz step and S(tau*)");
}
