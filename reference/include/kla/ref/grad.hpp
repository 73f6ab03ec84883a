// Backward pass of the tokenwise KLA recurrence (SPEC §8; issue 25): the gradients of a scalar
// loss ℓ with respect to every input of one head — q, k, v, η, the decay α and the initial state
// S_0 — given the upstream gradients dO = ∂ℓ/∂O and dS_T = ∂ℓ/∂S_T.
//
// The forward token (eq. kla; SPEC §1) and the adjoint of each line, with G = ∂ℓ/∂S_t:
//   S̃ = diag(α) S_{t−1}        ∂ℓ/∂S_{t−1} = diag(α) ∂ℓ/∂S̃,   dα = rowsum(∂ℓ/∂S̃ ∘ S_{t−1})
//   e  = v − S̃ᵀk               dv = de,   ∂ℓ/∂S̃ = G − k deᵀ,   dk −= S̃ de
//   β  = η/(‖k‖²+ε) or η       dη = dβ/(‖k‖²+ε), dk −= 2β dβ k/(‖k‖²+ε)   (given: dη = dβ)
//   S_t = S̃ + β k eᵀ           dβ = kᵀ G e,   dk += β G e,   de = β Gᵀk
//   o  = s(q) S_tᵀ q           G += s q doᵀ,  dq = s S_t do + (S_tᵀq · do) ∂s/∂q
// with s = scale (a constant) or 1/‖q‖ (∂s/∂q = −q/‖q‖³). Branches follow the forward: where
// ‖k‖²+ε = 0 the coefficient is the constant β = 0 and no gradient flows through it; q = 0 reads
// out s = 0. The decay gradient is dα (the reference's input); the log-decay g = ln α of the
// kernels gets dg = α ∘ dα (log_decay_gradient).
//
// Numerical contract: over Rational every gradient is exact (proofs_check grad.adjoint checks
// ⟨dO, J·δ⟩ + ⟨dS_T, J_S·δ⟩ = ⟨∇, δ⟩ with dual numbers, no tolerance). In floating point the
// backward repeats the forward's operations on the stored states, so its error is a few units of
// roundoff per token times the conditioning of the recurrence, as for the forward. The states
// S_0..S_T are kept: O(T·dk·dv) memory, which a reference may spend (the chunkwise backward of
// grad_chunk.hpp keeps one state per chunk, as the kernels do).
#pragma once

#include <vector>

#include "kla/ref/mutants.hpp"
#include "kla/ref/recurrence.hpp"

namespace kla::ref {

/// ∂ℓ/∂(every input of one head): q, k [T,dk]; v [T,dv]; eta [T]; alpha shaped like the input's
/// alpha ([T,1] scalar decay, [T,dk] per channel, empty when there is no decay) holding dα, not
/// dg; state = ∂ℓ/∂S_0 [dk,dv] (also when the forward started from the implicit zero state).
template <class T>
struct HeadGradients {
  Mat<T> q, k, v;
  Vec<T> eta;
  Mat<T> alpha;
  Mat<T> state;
};

/// Zero gradients shaped like `in`.
template <class T>
HeadGradients<T> zero_gradients(const HeadInputs<T>& in) {
  HeadGradients<T> g;
  g.q = Mat<T>::Zero(in.length(), in.dk());
  g.k = Mat<T>::Zero(in.length(), in.dk());
  g.v = Mat<T>::Zero(in.length(), in.dv());
  g.eta = Vec<T>::Zero(in.length());
  g.alpha = Mat<T>::Zero(in.alpha.rows(), in.alpha.cols());
  g.state = Mat<T>::Zero(in.dk(), in.dv());
  return g;
}

/// dg = α ∘ dα: the gradient for the decay given as g = ln α (SPEC §8), shaped like in.alpha.
/// Exact over Rational (no exp or log is taken).
template <class T>
Mat<T> log_decay_gradient(const HeadInputs<T>& in, const HeadGradients<T>& g) {
  return in.alpha.cwiseProduct(g.alpha);
}

namespace detail {

/// The upstream gradients checked against the shapes of `in` (empty = zero).
template <class T>
HeadOutputs<T> upstream_or_zero(const HeadInputs<T>& in, const HeadOutputs<T>& up) {
  HeadOutputs<T> d;
  d.o = up.o.size() ? up.o : Mat<T>::Zero(in.length(), in.dv());
  d.state = up.state.size() ? up.state : Mat<T>::Zero(in.dk(), in.dv());
  if (d.o.rows() != in.length() || d.o.cols() != in.dv())
    throw std::invalid_argument("kla::ref: dO must be [T, dv]");
  if (d.state.rows() != in.dk() || d.state.cols() != in.dv())
    throw std::invalid_argument("kla::ref: dS_T must be [dk, dv]");
  return d;
}

template <class T>
Mat<T> initial_state_or_zero(const HeadInputs<T>& in, const Mat<T>& S0) {
  Mat<T> S = S0.size() ? S0 : Mat<T>::Zero(in.dk(), in.dv());
  if (S.rows() != in.dk() || S.cols() != in.dv())
    throw std::invalid_argument("kla::ref: initial state must be [dk, dv]");
  return S;
}

/// Adds the per-channel decay gradient `da` [dk] of token t into g.alpha (summed over the
/// channels for scalar decay; nothing when the input has no decay).
template <class T>
void add_decay_gradient(const HeadInputs<T>& in, Eigen::Index t, const Vec<T>& da,
                        HeadGradients<T>& g) {
  if (in.alpha.size() == 0) return;
  if (in.alpha.cols() == 1)  // the scalar α_t multiplies every channel: the sum over channels
    g.alpha(t, 0) += active_mutant() == Mutant::grad_decay_one_channel ? da(0) : T(da.sum());
  else
    g.alpha.row(t) += da.transpose();
}

}  // namespace detail

/// Pushes dβ back through β of eq. (kla) into dη and dk. Kaczmarz, n = ‖k‖²+ε > 0:
/// dη += dβ/n, dk −= (2β dβ/n) k; n = 0: β = 0 is a constant, nothing flows. Given: dη += dβ.
/// Exact over Rational; one division by n otherwise.
template <class T>
void coefficient_backward(const Vec<T>& k, const T& eta, const T& dbeta, const Options<T>& opt,
                          T& deta, Vec<T>& dk) {
  if (opt.coefficient == Coefficient::given) {
    deta += dbeta;
    return;
  }
  const T n = T(k.squaredNorm() + opt.eps);
  if (n == T(0)) return;
  deta += dbeta / n;
  if (active_mutant() == Mutant::grad_kaczmarz_norm_term) return;  // planted: ‖k‖² held fixed
  dk -= (T(2) * (eta / n) * dbeta / n) * k;
}

/// ∂s/∂q · c for the read-out scale s(q) of readout_scale: 0 for a constant scale; for
/// s = 1/‖q‖, −c s³ q (0 at q = 0, where s = 0 is the convention). Needs sqrt for q_l2norm.
template <class T>
Vec<T> readout_scale_backward(const Vec<T>& q, const T& c, const Options<T>& opt) {
  if (opt.readout == Readout::qk_l2norm)  // a change of inputs: recurrent_backward chains it
    throw std::invalid_argument(
        "kla::ref: readout_scale_backward takes the normalised inputs of the qk l2-norm read-out "
        "(with_qk_l2norm), whose read-out is by the scale");
  if (opt.readout == Readout::scale || active_mutant() == Mutant::readout_scale_ignored)
    return Vec<T>::Zero(q.size());
  const T s = readout_scale(q, opt);
  return (-(c * s * s * s)) * q;
}

namespace detail {

/// The chain rule of Readout::qk_l2norm's change of inputs (with_qk_l2norm): `g` holds the
/// gradients of the normalised inputs `hat`; on return those of `in`, with
/// dx = (dx̂ − x̂ (x̂·dx̂)) / r, r = sqrt(‖x‖² + ε_n), for q and k of every token (0 where r = 0).
/// Rounded types only (sqrt); one rounding per operation.
template <class T>
void qk_l2norm_chain(const HeadInputs<T>& in, const HeadInputs<T>& hat, const Options<T>& opt,
                     HeadGradients<T>& g) {
  if constexpr (ScalarTraits<T>::has_transcendentals) {
    auto chain = [&](const Mat<T>& x, const Mat<T>& xh, Mat<T>& dx) {
      for (Eigen::Index t = 0; t < x.rows(); ++t) {
        const T r = sqrt_of(T(x.row(t).squaredNorm() + opt.l2norm_eps));
        const Vec<T> h = xh.row(t).transpose(), d = dx.row(t).transpose();
        if (r == T(0))
          dx.row(t).setZero();
        else
          dx.row(t) = ((d - h * T(h.dot(d))) / r).transpose();
      }
    };
    chain(in.q, hat.q, g.q);
    chain(in.k, hat.k, g.k);
  } else {
    throw std::invalid_argument("kla::ref: the qk l2-norm read-out needs a scalar type with sqrt");
  }
}

}  // namespace detail

/// Gradients of the whole sequence, token by token backwards (eqs. above), from initial state
/// S0 [dk,dv] (zero if empty) and upstream gradients up.o = dO [T,dv], up.state = dS_T [dk,dv]
/// (either empty = zero). The forward is rerun first to keep S_0..S_T. Readout::qk_l2norm: the
/// gradients of the normalised inputs (with_qk_l2norm), then detail::qk_l2norm_chain.
template <class T>
HeadGradients<T> recurrent_backward(const HeadInputs<T>& in, const Options<T>& opt,
                                    const Mat<T>& S0, const HeadOutputs<T>& up) {
  if (opt.readout == Readout::qk_l2norm) {
    const auto [hat, hopt] = with_qk_l2norm(in, opt);
    HeadGradients<T> g = recurrent_backward(hat, hopt, S0, up);
    detail::qk_l2norm_chain(in, hat, opt, g);
    return g;
  }
  in.validate();
  const HeadOutputs<T> d = detail::upstream_or_zero(in, up);
  std::vector<Mat<T>> S{detail::initial_state_or_zero(in, S0)};
  for (Eigen::Index t = 0; t < in.length(); ++t) {
    Mat<T> next = S.back();
    token_step<T>(next, in.decay(t), in.k.row(t).transpose(), in.v.row(t).transpose(), in.eta(t),
                  opt);
    S.push_back(std::move(next));
  }

  HeadGradients<T> g = zero_gradients(in);
  Mat<T> dS = d.state;  // ∂ℓ/∂S_t, t = T first
  for (Eigen::Index t = in.length() - 1; t >= 0; --t) {
    const Mat<T>& St = S[static_cast<size_t>(t + 1)];
    const Mat<T>& prev = S[static_cast<size_t>(t)];
    const Vec<T> q = in.q.row(t).transpose(), k = in.k.row(t).transpose();
    const Vec<T> v = in.v.row(t).transpose(), a = in.decay(t);
    const Vec<T> dout = d.o.row(t).transpose();

    // o = s(q) S_tᵀ q
    const T s = readout_scale(q, opt);
    dS += (s * q) * dout.transpose();
    const Vec<T> Sdo = St * dout;
    g.q.row(t) = (s * Sdo + readout_scale_backward(q, T(q.dot(Sdo)), opt)).transpose();

    // S_t = S̃ + β k eᵀ, e = v − S̃ᵀk, β from eq. (kla)
    const Mat<T> decayed = a.asDiagonal() * prev;
    const Vec<T> e = v - decayed.transpose() * k;
    const T beta = coefficient(T(k.squaredNorm()), in.eta(t), opt);
    const Vec<T> Ge = dS * e;
    const Vec<T> de = beta * (dS.transpose() * k);
    Vec<T> dk = beta * Ge - decayed * de;
    coefficient_backward(k, in.eta(t), T(k.dot(Ge)), opt, g.eta(t), dk);
    g.k.row(t) = dk.transpose();
    g.v.row(t) = de.transpose();
    const Mat<T> d_decayed = dS - k * de.transpose();

    // S̃ = diag(α) S_{t−1}
    detail::add_decay_gradient(in, t, Vec<T>(d_decayed.cwiseProduct(prev).rowwise().sum()), g);
    if (active_mutant() == Mutant::grad_carry_undecayed)
      dS = d_decayed;  // planted: the carry forgets the decay
    else
      dS = a.asDiagonal() * d_decayed;
  }
  g.state = std::move(dS);
  return g;
}

/// Normalised-key chain (SPEC §8). One key head with per-token norms r = sqrt(‖k‖²+ε) and
/// k̂ = k/r [T,dk], shared by G value heads with v̂_h = v_h/r [T,dv]. Given the gradients dk̂_h and
/// dv̂_h of each value head (GDN's backward on (k̂, v̂_h, β = η)), returns
///   dk = (Σ_h dk̂_h − k̂ (k̂·Σ_h dk̂_h + Σ_h v̂_h·dv̂_h)) / r,   dv_h = dv̂_h / r.
/// Tokens with r = 0 (k = 0, ε = 0, the β = 0 convention) get dk = 0 and dv_h = 0: such a token
/// reads and writes nothing. Exact over Rational.
template <class T>
struct KeyNormChain {
  Mat<T> dk;               ///< [T,dk]
  std::vector<Mat<T>> dv;  ///< one [T,dv] per value head
};

template <class T>
KeyNormChain<T> key_l2norm_chain(const Mat<T>& k_hat, const Vec<T>& r,
                                 const std::vector<Mat<T>>& dk_hat,
                                 const std::vector<Mat<T>>& v_hat,
                                 const std::vector<Mat<T>>& dv_hat) {
  const Eigen::Index n = k_hat.rows();
  if (r.size() != n || dk_hat.empty() || v_hat.size() != dk_hat.size() ||
      dv_hat.size() != dk_hat.size())
    throw std::invalid_argument(
        "kla::ref: key_l2norm_chain needs one norm per token and, per "
        "value head, dk^, v^ and dv^");
  KeyNormChain<T> out;
  out.dk = Mat<T>::Zero(n, k_hat.cols());
  for (const auto& dv : dv_hat) out.dv.push_back(Mat<T>::Zero(dv.rows(), dv.cols()));
  for (Eigen::Index t = 0; t < n; ++t) {
    if (r(t) == T(0)) continue;
    Vec<T> dkh = Vec<T>::Zero(k_hat.cols());
    T radial = T(0);  // k̂·Σ dk̂_h + Σ v̂_h·dv̂_h: the gradient with respect to r, times −r
    for (size_t h = 0; h < dk_hat.size(); ++h) {
      dkh += dk_hat[h].row(t).transpose();
      if (active_mutant() != Mutant::grad_chain_value_term)  // planted: v̂'s dependence on r lost
        radial += v_hat[h].row(t).dot(dv_hat[h].row(t));
      out.dv[h].row(t) = dv_hat[h].row(t) / r(t);
    }
    const Vec<T> kh = k_hat.row(t).transpose();
    radial += kh.dot(dkh);
    out.dk.row(t) = ((dkh - radial * kh) / r(t)).transpose();
  }
  return out;
}

/// One head (G = 1): KLA's gradients from GDN's gradients `gdn` on the normalised inputs `hat` =
/// normalize_keys_with(in, r), run with β = η. dk, dv through key_l2norm_chain; dq, dη (= dβ of
/// GDN), dα and dS_0 are GDN's unchanged.
template <class T>
HeadGradients<T> kla_gradients_from_normalized(const HeadInputs<T>& hat, const Vec<T>& r,
                                               const HeadGradients<T>& gdn) {
  HeadGradients<T> g = gdn;
  const KeyNormChain<T> c = key_l2norm_chain<T>(hat.k, r, {gdn.k}, {hat.v}, {gdn.v});
  g.k = c.dk;
  g.v = c.dv.front();
  return g;
}

}  // namespace kla::ref
