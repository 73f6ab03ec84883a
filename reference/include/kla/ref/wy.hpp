// WY representation of a chunk's transition (paper App. B, Propositions wy_P and wy_H).
//
// In state form (S is [dk,dv]) the recurrence is S_i = (I − β_i k_i k_iᵀ) D_i S_{i−1} + β_i k_i
// v_iᵀ, so S_i = P_i S_0 + H_i with
//   P_i = Γ(i,0) − Σ_{r≤i} Γ(i,r) k_r w_rᵀ,   w_i = β_i (Γ(i,0) k_i − Σ_{r<i} (k_rᵀ Γ(i,r) k_i)
//   w_r) H_i = Σ_{r≤i} Γ(i,r) k_r u_rᵀ,            u_i = β_i (v_i − Σ_{r<i} (k_rᵀ Γ(i,r) k_i) u_r)
// where Γ(i,r) = diag(γ_i/γ_r) (the paper's γ_{r→i}; the paper writes the transposed state
// R = Sᵀ). Combined (eq. combined_wy): S_i = Γ(i,0) S_0 + Σ_{r≤i} Γ(i,r) k_r ū_rᵀ, ū = u − S_0ᵀ w.
// Exact over Rational; O(C²(dk+dv)) per chunk.
#pragma once

#include "kla/ref/decay.hpp"
#include "kla/ref/recurrence.hpp"

namespace kla::ref {

template <class T>
struct WyFactors {
  Mat<T> w;     ///< [C, dk], row r-1 holds w_r
  Mat<T> u;     ///< [C, dv], row r-1 holds u_r
  Vec<T> beta;  ///< [C]
};

/// w and u recurrences for tokens start..start+len-1 of `in`.
template <class T>
WyFactors<T> wy_factors(const HeadInputs<T>& in, const Options<T>& opt, Eigen::Index start,
                        Eigen::Index len, const DecayTable<T>& gam) {
  WyFactors<T> f;
  f.w = Mat<T>::Zero(len, in.dk());
  f.u = Mat<T>::Zero(len, in.dv());
  f.beta.resize(len);
  for (Eigen::Index i = 1; i <= len; ++i) {
    const Vec<T> ki = in.k.row(start + i - 1).transpose();
    f.beta(i - 1) = coefficient(T(ki.squaredNorm()), in.eta(start + i - 1), opt);
    Vec<T> w = gam(i, 0).cwiseProduct(ki);
    Vec<T> u = in.v.row(start + i - 1).transpose();
    for (Eigen::Index r = 1; r < i; ++r) {
      const T c = weighted_dot<T>(in.k.row(start + r - 1).transpose(), gam(i, r), ki);
      w -= c * f.w.row(r - 1).transpose();
      u -= c * f.u.row(r - 1).transpose();
    }
    f.w.row(i - 1) = (f.beta(i - 1) * w).transpose();
    f.u.row(i - 1) = (f.beta(i - 1) * u).transpose();
  }
  return f;
}

/// P_i of eq. (P_wy), [dk, dk].
template <class T>
Mat<T> wy_P(const HeadInputs<T>& in, Eigen::Index start, const WyFactors<T>& f,
            const DecayTable<T>& gam, Eigen::Index i) {
  Mat<T> P = gam(i, 0).asDiagonal();
  // The planted sum-range fault stops one term short (r < i).
  const Eigen::Index last = active_mutant() == Mutant::wy_P_sum_range ? i - 1 : i;
  for (Eigen::Index r = 1; r <= last; ++r)
    P -= gam(i, r).cwiseProduct(in.k.row(start + r - 1).transpose()) * f.w.row(r - 1);
  return P;
}

/// H_i of eq. (H_wy), [dk, dv].
template <class T>
Mat<T> wy_H(const HeadInputs<T>& in, Eigen::Index start, const WyFactors<T>& f,
            const DecayTable<T>& gam, Eigen::Index i) {
  Mat<T> H = Mat<T>::Zero(in.dk(), in.dv());
  if (active_mutant() == Mutant::wy_H_undecayed) {  // planted fault: Γ(i,r) left out
    for (Eigen::Index r = 1; r <= i; ++r) H += in.k.row(start + r - 1).transpose() * f.u.row(r - 1);
    return H;
  }
  for (Eigen::Index r = 1; r <= i; ++r)
    H += gam(i, r).cwiseProduct(in.k.row(start + r - 1).transpose()) * f.u.row(r - 1);
  return H;
}

/// S_i from the combined form of eq. (combined_wy), with ū_r = u_r − S_0ᵀ w_r.
template <class T>
Mat<T> wy_state(const HeadInputs<T>& in, Eigen::Index start, const WyFactors<T>& f,
                const DecayTable<T>& gam, Eigen::Index i, const Mat<T>& S0) {
  Mat<T> S = gam(i, 0).asDiagonal() * S0;
  for (Eigen::Index r = 1; r <= i; ++r) {
    const Vec<T> ubar = f.u.row(r - 1).transpose() - S0.transpose() * f.w.row(r - 1).transpose();
    S += gam(i, r).cwiseProduct(in.k.row(start + r - 1).transpose()) * ubar.transpose();
  }
  return S;
}

}  // namespace kla::ref
