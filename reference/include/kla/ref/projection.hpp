// The tokenwise theory of the paper (Theorem 1, Propositions 1–2, Appendix A): the per-token
// loss, the exact Kaczmarz projection, the proximal objective and its closed-form minimiser,
// and the residual contraction factor. All routines are exact over Rational.
#pragma once

#include "kla/ref/mutants.hpp"
#include "kla/ref/recurrence.hpp"

namespace kla::ref {

/// L(S) = ½‖Sᵀk − v‖² (Section 2).
template <class T>
T token_loss(const Mat<T>& S, const Vec<T>& k, const Vec<T>& v) {
  if (active_mutant() == Mutant::loss_half_dropped) return T((S.transpose() * k - v).squaredNorm());
  return T((S.transpose() * k - v).squaredNorm() / T(2));
}

/// ∇L(S) = k (Sᵀk − v)ᵀ (Appendix A, part iii).
template <class T>
Mat<T> token_loss_gradient(const Mat<T>& S, const Vec<T>& k, const Vec<T>& v) {
  if (active_mutant() == Mutant::gradient_sign) return k * (v - S.transpose() * k).transpose();
  return k * (S.transpose() * k - v).transpose();
}

/// Exact projection of S̃ onto {S : Sᵀk = v} (eq. kaczmarz_exact); requires k ≠ 0.
template <class T>
Mat<T> exact_projection(const Mat<T>& decayed, const Vec<T>& k, const Vec<T>& v) {
  const T kk = k.squaredNorm();
  if (kk == T(0)) throw std::invalid_argument("kla::ref: projection onto Sᵀ0 = v is undefined");
  const Vec<T> e = v - decayed.transpose() * k;
  if (active_mutant() == Mutant::projection_residual_sign)
    return decayed - (k / kk) * e.transpose();
  return decayed + (k / kk) * e.transpose();
}

/// μ = η/((1−η)‖k‖²+ε) of Proposition 1; defined when the denominator is positive, i.e. not
/// (η = 1 and ε = 0) and not (k = 0 and ε = 0).
template <class T>
T proximal_weight(const T& k_sqnorm, const T& eta, const T& eps) {
  const T denom = (T(1) - eta) * k_sqnorm + eps;
  if (!(denom > T(0)))
    throw std::invalid_argument("kla::ref: proximal weight needs (1-η)‖k‖²+ε > 0");
  if (active_mutant() == Mutant::proximal_mu) return T(eta / (k_sqnorm + eps));
  return T(eta / denom);
}

/// J(S) = ½‖S − S̃‖²_F + (μ/2)‖Sᵀk − v‖² (Proposition 1).
template <class T>
T proximal_objective(const Mat<T>& S, const Mat<T>& decayed, const Vec<T>& k, const Vec<T>& v,
                     const T& mu) {
  return T((S - decayed).squaredNorm() / T(2) + mu * token_loss(S, k, v));
}

/// ∇J(S) = (S − S̃) + μ k (Sᵀk − v)ᵀ.
template <class T>
Mat<T> proximal_gradient(const Mat<T>& S, const Mat<T>& decayed, const Vec<T>& k, const Vec<T>& v,
                         const T& mu) {
  return (S - decayed) + mu * token_loss_gradient(S, k, v);
}

/// argmin J = S̃ + μ/(1+μ‖k‖²) k eᵀ (Appendix A, proof of Prop. 1), written from μ alone so it
/// can be compared with the Kaczmarz step rather than being it.
template <class T>
Mat<T> proximal_minimizer(const Mat<T>& decayed, const Vec<T>& k, const Vec<T>& v, const T& mu) {
  const Vec<T> e = v - decayed.transpose() * k;
  const T tau = mu / (T(1) + mu * T(k.squaredNorm()));
  return decayed + (tau * k) * e.transpose();
}

/// Residual contraction factor 1 − η‖k‖²/(‖k‖²+ε) of Proposition 2 (1 when ‖k‖²+ε = 0).
template <class T>
T contraction_factor(const T& k_sqnorm, const T& eta, const T& eps) {
  const T denom = k_sqnorm + eps;
  if (denom == T(0)) return T(1);
  if (active_mutant() == Mutant::contraction_eps_dropped) return T(T(1) - eta);
  return T(T(1) - eta * k_sqnorm / denom);
}

}  // namespace kla::ref
