// Test-side formulas, written out from SPEC §1 / the paper independently of kla::ref, so that a
// statement compares the reference with a second computation instead of with itself. Nothing
// here calls into the reference's coefficient, decay-table, WY or chunk code (so the planted
// mutants of kla/ref/mutants.hpp never reach these), only HeadInputs' accessors.
#pragma once

#include <vector>

#include "generators.hpp"

namespace kla::proofs::oracle {

/// β = η/(‖k‖²+ε) (Kaczmarz; 0 when ‖k‖²+ε = 0, SPEC §1 convention) or β = η (given).
inline Q beta(const Vec<Q>& k, const Q& eta, const Q& eps,
              ref::Coefficient c = ref::Coefficient::kaczmarz) {
  if (c == ref::Coefficient::given) return eta;
  const Q denom = Q(k.squaredNorm()) + eps;
  return denom == Q(0) ? Q(0) : Q(eta / denom);
}

inline Q beta(const ref::HeadInputs<Q>& in, Idx t, const ref::Options<Q>& opt) {
  return beta(in.k.row(t).transpose(), in.eta(t), opt.eps, opt.coefficient);
}

/// One token's state transition (I − β k kᵀ) diag(α), [dk, dk].
inline Mat<Q> transition(const Vec<Q>& a, const Vec<Q>& k, const Q& b) {
  const Idx n = k.size();
  return (Mat<Q>(Mat<Q>::Identity(n, n)) - (b * k) * k.transpose()) * a.asDiagonal();
}

/// Frobenius inner product ⟨A, B⟩_F.
inline Q frobenius(const Mat<Q>& a, const Mat<Q>& b) {
  return a.cwiseProduct(b).sum();
}

/// Per-channel decay from local position j to i of a chunk starting at `start` (positions are
/// 1-based, 0 = chunk start): α_{j+1}⋯α_i as a plain product over the tokens (1 when j = i).
inline Vec<Q> decay_between(const ref::HeadInputs<Q>& in, Idx start, Idx j, Idx i) {
  Vec<Q> g = Vec<Q>::Constant(in.dk(), Q(1));
  for (Idx s = j + 1; s <= i; ++s) g = g.cwiseProduct(in.decay(start + s - 1));
  return g;
}

/// The tokenwise recurrence written out: states S_0..S_len of the tokens start..start+len-1,
/// S_i = S̃ + β k (v − S̃ᵀk)ᵀ with S̃ = diag(α_i) S_{i−1}.
inline std::vector<Mat<Q>> states(const ref::HeadInputs<Q>& in, const ref::Options<Q>& opt,
                                  Idx start, Idx len, const Mat<Q>& S0) {
  std::vector<Mat<Q>> S{S0};
  for (Idx i = 1; i <= len; ++i) {
    const Idx t = start + i - 1;
    const Vec<Q> k = in.k.row(t).transpose(), v = in.v.row(t).transpose();
    const Mat<Q> decayed = in.decay(t).asDiagonal() * S.back();
    const Vec<Q> e = v - decayed.transpose() * k;
    S.push_back(decayed + (beta(in, t, opt) * k) * e.transpose());
  }
  return S;
}

}  // namespace kla::proofs::oracle
