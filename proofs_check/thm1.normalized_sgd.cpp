// thm1.normalized_sgd — Theorem 1 (iii), Appendix A: ∇L(S̃) = −k eᵀ (checked against the exact
// second-order expansion of the quadratic L), and the η = 1, ε = 0 step is S̃ − ∇L(S̃)/‖k‖²; the
// relaxed step is the gradient step with rate η/(‖k‖²+ε).
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("thm1.normalized_sgd", "Theorem 1 (iii), App. A") {
  const TokenCase c = token_case(true);
  const Idx dk = c.dk, dv = c.dv;
  const Mat<Q>&S_prev = c.S_prev, &S_tilde = c.S_tilde;
  const Vec<Q>&a = c.a, &k = c.k, &v = c.v, &e = c.e;
  const Q kk = c.kk;

  const Mat<Q> G = kla::ref::token_loss_gradient<Q>(S_tilde, k, v);
  require_equal(G, -k * e.transpose(), "grad L(S~) and -k e^T");
  // L is quadratic, so L(S̃ + D) = L(S̃) + ⟨∇L, D⟩ + ½‖Dᵀk‖² holds exactly for every D.
  auto loss = [&](const Mat<Q>& S) { return Q((S.transpose() * k - v).squaredNorm() / Q(2)); };
  const Mat<Q> D = *matrix(dk, dv);
  RC_ASSERT(loss(S_tilde + D) ==
            loss(S_tilde) + oracle::frobenius(G, D) + Q((D.transpose() * k).squaredNorm() / Q(2)));

  Mat<Q> S_t = S_prev;
  kla::ref::token_step<Q>(S_t, a, k, v, Q(1), kla::ref::Options<Q>{});
  require_equal(S_t, S_tilde - G / kk, "Kaczmarz step and S~ - grad/|k|^2");

  kla::ref::Options<Q> opt;
  opt.eps = *eps();
  const Q eta = *kla::proofs::eta();
  Mat<Q> S_r = S_prev;
  kla::ref::token_step<Q>(S_r, a, k, v, eta, opt);
  require_equal(S_r, S_tilde - (eta / (kk + opt.eps)) * G, "relaxed step and S~ - beta grad");
}
