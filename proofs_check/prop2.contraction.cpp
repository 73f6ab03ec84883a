// prop2.contraction — Proposition 2, eq. (contraction), proof in Appendix A: the residual after
// the step is e⁺ = (1 − η‖k‖²/(‖k‖²+ε)) e, the factor lies in [0,1) for k ≠ 0 (1 for k = 0, ε = 0,
// where the token only decays the state), and L(S_t) = factor²·L(S̃) ≤ L(S̃).
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("prop2.contraction", "Proposition 2, eq. contraction") {
  const TokenCase c = token_case(false);
  const Idx dv = c.dv;
  const Mat<Q>& S_prev = c.S_prev;
  const Vec<Q>&a = c.a, &k = c.k, &v = c.v;
  const Q kk = c.kk;
  const Q eta = *kla::proofs::eta();
  kla::ref::Options<Q> opt;
  opt.eps = *eps();

  const Mat<Q> S_tilde = a.asDiagonal() * S_prev;
  const Vec<Q> e = v - S_tilde.transpose() * k;
  const Q factor = kk + opt.eps == Q(0) ? Q(1) : Q(Q(1) - eta * kk / (kk + opt.eps));
  RC_ASSERT(kla::ref::contraction_factor<Q>(kk, eta, opt.eps) == factor);

  Mat<Q> S_t = S_prev;
  kla::ref::token_step<Q>(S_t, a, k, v, eta, opt);
  const Vec<Q> e_plus = v - S_t.transpose() * k;
  require_equal(e_plus, factor * e, "e+ and factor * e");

  if (kk != Q(0)) {
    RC_ASSERT(factor >= Q(0));
    RC_ASSERT(factor < Q(1));
  } else {
    require_equal(S_t, S_tilde, "state after a zero key and the decayed state");
  }
  const Q before = kla::ref::token_loss<Q>(S_tilde, k, v),
          after = kla::ref::token_loss<Q>(S_t, k, v);
  RC_ASSERT(after == factor * factor * before);
  RC_ASSERT(after <= before);
  if (kk != Q(0) && e != Vec<Q>::Zero(dv)) RC_ASSERT(after < before);
}
