// remark.decay_agnostic — Appendix A, "Decay-agnostic remark" (and Section 3.2): for any linear
// decay D (scalar α I, diagonal, or a full dk x dk matrix) the η = 1, ε = 0 Kaczmarz step from
// S̃ = D S_{t-1} is exact_projection(S̃) (feasible, step ⟂ {H : Hᵀk = 0}); relaxed (η, ε), it moves
// the fraction η‖k‖²/(‖k‖²+ε) of the way from S̃ to that projection.
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("remark.decay_agnostic", "Remark (decay-agnostic), App. A") {
  const Idx dk = dim(), dv = dim();
  const Mat<Q> S_prev = *matrix(dk, dv);
  const Vec<Q> k = *nonzero_vector(dk), v = *vector(dv);
  const Q kk = k.squaredNorm();
  const int kind = *rc::gen::element(0, 1, 2);  // scalar, diagonal, full
  // For scalar and diagonal D the step applies D itself; a full D is applied first and the step
  // runs with α = 1. Either way only S̃ reaches the coefficient.
  Vec<Q> a = Vec<Q>::Constant(dk, Q(1));
  Mat<Q> D;
  if (kind == 2) {
    D = *matrix(dk, dk);
  } else {
    a = decay_vector(dk, kind == 1);
    D = a.asDiagonal();
  }
  const Mat<Q> S_tilde = D * S_prev;
  const Mat<Q> S_in = kind == 2 ? S_tilde : S_prev;

  Mat<Q> S_t = S_in;
  const auto tr = kla::ref::token_step<Q>(S_t, a, k, v, Q(1), kla::ref::Options<Q>{});
  require_equal(tr.decayed, S_tilde, "decayed state and D S");
  const Mat<Q> proj = kla::ref::exact_projection<Q>(S_tilde, k, v);
  require_equal(S_t, proj, "Kaczmarz step and the projection of D S");
  // The projection, checked from its definition.
  require_equal(proj.transpose() * k, v, "projection^T k and v");
  const Mat<Q> M = *matrix(dk, dv);
  const Mat<Q> H = M - k * (M.transpose() * k).transpose() / kk;
  RC_ASSERT(oracle::frobenius(proj - S_tilde, H) == Q(0));

  // Relaxed step: S̃ + (η‖k‖²/(‖k‖²+ε)) (proj − S̃), whatever D was.
  const Q eta = *kla::proofs::eta();
  kla::ref::Options<Q> opt;
  opt.eps = *eps();
  Mat<Q> S_r = S_in;
  kla::ref::token_step<Q>(S_r, a, k, v, eta, opt);
  require_equal(S_r, S_tilde + (eta * kk / (kk + opt.eps)) * (proj - S_tilde),
                "relaxed step and the relaxed projection");
}
