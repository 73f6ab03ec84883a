// Tokenwise KLA recurrence (paper eq. (kla), Algorithm 1 left; SPEC §1).
//
// Numerical contract: over Rational every result is exact. Over a rounded type each token costs
// O(dk·dv) operations with a relative error of a few units of roundoff per token in S; no
// cancellation guard beyond the degenerate-denominator convention is applied.
#pragma once

#include <utility>

#include "kla/ref/mutants.hpp"
#include "kla/ref/types.hpp"

namespace kla::ref {

/// β_t (eq. kla). Kaczmarz: η/(‖k‖²+ε); given: η. Convention for ‖k‖²+ε = 0 (k = 0, ε = 0):
/// β = 0, so the token only decays the state.
template <class T>
T coefficient(const T& k_sqnorm, const T& eta, const Options<T>& opt) {
  if (opt.coefficient == Coefficient::given) return eta;
  if (active_mutant() == Mutant::gdn_coefficient) return eta;
  const T denom = active_mutant() == Mutant::eps_dropped ? k_sqnorm : T(k_sqnorm + opt.eps);
  if (denom == T(0)) return T(0);
  return T(eta / denom);
}

/// Read-out scale of a query: opt.scale, or 1/‖q‖ (0 for q = 0) in q_l2norm mode. (qk_l2norm
/// inputs are normalised first, with_qk_l2norm: their read-out is by opt.scale.)
template <class T>
T readout_scale(const Vec<T>& q, const Options<T>& opt) {
  if (active_mutant() == Mutant::readout_scale_ignored) return T(1);
  if (opt.readout == Readout::scale || opt.readout == Readout::qk_l2norm) return opt.scale;
  if constexpr (ScalarTraits<T>::has_transcendentals) {
    const T n = sqrt_of(T(q.squaredNorm()));
    return n == T(0) ? T(0) : T(T(1) / n);
  } else {
    throw std::invalid_argument("kla::ref: q l2-norm read-out needs a scalar type with sqrt");
  }
}

/// What one token did: the decayed state S̃, the residual e = v − S̃ᵀk and β.
template <class T>
struct StepTrace {
  Mat<T> decayed;
  Vec<T> residual;
  T beta;
};

/// One token: S ← S̃ + β k eᵀ with S̃ = diag(α) S (scalar decay: all α equal).
template <class T>
StepTrace<T> token_step(Mat<T>& S, const Vec<T>& alpha, const Vec<T>& k, const Vec<T>& v,
                        const T& eta, const Options<T>& opt) {
  StepTrace<T> tr;
  tr.decayed = alpha.asDiagonal() * S;
  tr.residual = v - tr.decayed.transpose() * k;
  tr.beta = coefficient(T(k.squaredNorm()), eta, opt);
  if (active_mutant() != Mutant::none) {  // planted faults (mutants.hpp), S not yet overwritten
    const Vec<T> e_undecayed = v - S.transpose() * k;
    if (active_mutant() == Mutant::residual_undecayed) tr.residual = e_undecayed;
    if (active_mutant() == Mutant::multiplier_sign) {
      S = tr.decayed - (tr.beta * k) * tr.residual.transpose();
      return tr;
    }
    if (active_mutant() == Mutant::project_undecayed ||
        active_mutant() == Mutant::decay_after_update) {
      S += (tr.beta * k) * e_undecayed.transpose();
      if (active_mutant() == Mutant::decay_after_update) S = alpha.asDiagonal() * S;
      return tr;
    }
  }
  S = tr.decayed + (tr.beta * k) * tr.residual.transpose();
  if (active_mutant() == Mutant::trace_residual_sign) tr.residual = -tr.residual;
  return tr;
}

/// Readout::qk_l2norm as a change of inputs: every q_t and k_t divided by sqrt(‖x‖² + ε_n) in
/// T (one rounding each over a rounded type; exact never, it needs sqrt; a zero vector at ε_n = 0
/// stays zero), and the options with the scale read-out that then applies. Other read-outs: `in`
/// and `opt` unchanged.
template <class T>
std::pair<HeadInputs<T>, Options<T>> with_qk_l2norm(const HeadInputs<T>& in, Options<T> opt) {
  HeadInputs<T> out = in;
  if (opt.readout != Readout::qk_l2norm) return {std::move(out), opt};
  if constexpr (ScalarTraits<T>::has_transcendentals) {
    auto normalise = [&](Mat<T>& x) {  // x = 0 at ε_n = 0 stays 0
      for (Eigen::Index t = 0; t < x.rows(); ++t) {
        const T r = sqrt_of(T(x.row(t).squaredNorm() + opt.l2norm_eps));
        if (r != T(0)) x.row(t) /= r;
      }
    };
    normalise(out.q);
    normalise(out.k);
  } else {
    throw std::invalid_argument("kla::ref: qk l2-norm read-out needs a scalar type with sqrt");
  }
  opt.readout = Readout::scale;
  return {std::move(out), opt};
}

/// Whole sequence, token by token, from initial state S0 [dk,dv] (zero if empty).
/// o_t = S_tᵀ q_t · scale(q_t).
template <class T>
HeadOutputs<T> recurrent_forward(const HeadInputs<T>& in, const Options<T>& opt,
                                 const Mat<T>& S0 = Mat<T>()) {
  if (opt.readout == Readout::qk_l2norm) {
    const auto [nin, nopt] = with_qk_l2norm(in, opt);
    return recurrent_forward(nin, nopt, S0);
  }
  in.validate();
  HeadOutputs<T> out;
  out.state = S0.size() ? S0 : Mat<T>::Zero(in.dk(), in.dv());
  if (out.state.rows() != in.dk() || out.state.cols() != in.dv())
    throw std::invalid_argument("kla::ref: initial state must be [dk, dv]");
  out.o.resize(in.length(), in.dv());
  for (Eigen::Index t = 0; t < in.length(); ++t) {
    const Vec<T> q = in.q.row(t).transpose();
    token_step<T>(out.state, in.decay(t), in.k.row(t).transpose(), in.v.row(t).transpose(),
                  in.eta(t), opt);
    out.o.row(t) = (out.state.transpose() * q * readout_scale(q, opt)).transpose();
  }
  return out;
}

}  // namespace kla::ref
