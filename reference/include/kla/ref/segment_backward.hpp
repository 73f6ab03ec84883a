// The backward pass in segments (issue 27: context parallelism's backward, the mirror image of
// segment.hpp's forward). A segment maps its incoming state S_in to S_out = M S_in + L, so the
// gradient of the loss with respect to S_in is the part its own outputs give (its backward from
// S_in with no gradient on S_out: `local`) plus Mᵀ times the gradient of S_out. Segments run that
// local backward in parallel; the reverse fold
//   G_last = dS_T,   G_{r−1} = M_rᵀ G_r + local_r,   dS_0 = M_0ᵀ G_0 + local_0
// gives every segment the gradient G_r of its outgoing state; each then runs its backward from
// its true incoming state with dO and G_r, which yields its inputs' gradients (those of the whole
// sequence restricted to its tokens: the loss depends on them only through its outputs and S_out).
//
// Numerical contract: over Rational equal (==) to recurrent_backward (proofs_check
// seg.grad_combine); in floating point the fold adds one product with Mᵀ and one sum per segment.
#pragma once

#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kla/ref/grad.hpp"
#include "kla/ref/segment.hpp"

namespace kla::ref {

/// Tokens [start, start + len) of `in` as their own inputs.
template <class T>
HeadInputs<T> slice_tokens(const HeadInputs<T>& in, Eigen::Index start, Eigen::Index len) {
  HeadInputs<T> s;
  s.q = in.q.middleRows(start, len);
  s.k = in.k.middleRows(start, len);
  s.v = in.v.middleRows(start, len);
  s.eta = in.eta.segment(start, len);
  if (in.alpha.size() != 0) s.alpha = in.alpha.middleRows(start, len);
  return s;
}

/// A certificate for truncating the reverse fold (issue 25's fused backward: a segment's boundary
/// gradient from a few chunks of the next segment run from zero instead of the whole fold): c with
/// ‖Φ_{t0}ᵀ ⋯ Φ_{t1−1}ᵀ G‖_F ≤ c ‖G‖_F for every G, the state gradient that tokens [t0, t1) pass
/// back (with dO = 0; Φ_t(S) = (I − β_t k_t k_tᵀ) diag(α_t) S, so Φ_tᵀ(G) = diag(α_t)(I − β_t k_t
/// k_tᵀ) G), where c = Π_t max_i α_{t,i}. Valid when every token has 0 ≤ β_t ‖k_t‖² ≤ 2, where
/// ‖I − β k kᵀ‖₂ ≤ 1 (its eigenvalues are 1 and 1 − β‖k‖²): always under the Kaczmarz
/// coefficient with η ∈ [0, 1] (β‖k‖² = η ‖k‖²/(‖k‖²+ε) ≤ η), for the given one where its keys
/// allow; otherwise std::nullopt (no certificate: the fold must be exact). Under
/// Readout::qk_l2norm the keys are the normalised ones, ‖k̂‖² = ‖k‖²/(‖k‖²+ε_n). So dropping the
/// share of a gradient G that passes through [t0, t1) errs by at most c ‖G‖_F: below the working
/// precision's rounding of G when c is.
/// Numerical contract: exact over Rational (products and one division a token, no sqrt;
/// proofs_check seg.grad_truncation compares squared norms).
template <class T>
std::optional<T> state_gradient_contraction(const HeadInputs<T>& in, const Options<T>& opt,
                                            Eigen::Index t0, Eigen::Index t1) {
  if (t0 < 0 || t1 < t0 || t1 > in.length())
    throw std::invalid_argument("state_gradient_contraction: tokens outside the head's");
  T c(1);
  for (Eigen::Index t = t0; t < t1; ++t) {
    T kk = in.k.row(t).squaredNorm();
    if (opt.readout == Readout::qk_l2norm) kk = T(kk / T(kk + opt.l2norm_eps));
    const T bk = T(coefficient(kk, in.eta(t), opt) * kk);
    if (bk < T(0) || bk > T(2)) return std::nullopt;
    const Vec<T> a = in.decay(t);
    c = T(c * (active_mutant() == Mutant::truncation_certificate_min_decay ? a.minCoeff()
                                                                           : a.maxCoeff()));
  }
  return c;
}

/// Bounds on the state gradient entering each chunk of C tokens, the segmented chain's windows
/// (cuda/src/bwd/bwd_state_grad_segments.cuh): with dS_c the gradient of the state before chunk c's
/// first token (the backward of tokens cC .. T−1 from dO and dS_T),
///   ‖dS_c‖_F ≤ B_c = L_c + γ_c B_{c+1},   B_n = ‖dS_T‖_F (n chunks, the last one ragged),
/// γ_c = Π over the chunk's tokens of max_i α_{t,i}, L_c = Σ over its tokens of out_t, where out_t
/// ≥ ‖s(q_t) q_t‖ ‖do_t‖ is the caller's (sqrt: a rational upper bound, or the rounded product):
/// each output's rank-one gradient s q doᵀ reaches the chunk's start through token maps Φ_tᵀ that
/// are contractions (state_gradient_contraction), and what enters at the chunk's end is carried by
/// γ_c. Valid from chunk c down only where every token from cC on has β‖k‖² ∈ [0, 2]; std::nullopt
/// for the chunks below the last token that has not. `dst_norm` ≥ ‖dS_T‖_F likewise the caller's.
/// Numerical contract: exact over Rational given its inputs (sums and products).
template <class T>
std::vector<std::optional<T>> state_gradient_bounds(const HeadInputs<T>& in, const Options<T>& opt,
                                                    const std::vector<T>& out, const T& dst_norm,
                                                    Eigen::Index C) {
  const Eigen::Index n_tok = in.length();
  if (C < 1 || Eigen::Index(out.size()) != n_tok)
    throw std::invalid_argument("state_gradient_bounds: C >= 1 and one out_t a token");
  const Eigen::Index n = (n_tok + C - 1) / C;
  std::vector<std::optional<T>> B(size_t(n + 1));
  B[size_t(n)] = dst_norm;
  for (Eigen::Index c = n - 1; c >= 0; --c) {
    if (!B[size_t(c + 1)]) break;
    const Eigen::Index t0 = c * C, t1 = std::min(n_tok, t0 + C);
    const std::optional<T> gamma = state_gradient_contraction(in, opt, t0, t1);
    if (!gamma) break;
    T L(0);
    for (Eigen::Index t = t0; t < t1; ++t) L = T(L + out[size_t(t)]);
    B[size_t(c)] = active_mutant() == Mutant::gradient_bound_decays_own_outputs
                       ? T(*gamma * (L + *B[size_t(c + 1)]))  // planted: γ on the chunk's own too
                       : T(L + *gamma * *B[size_t(c + 1)]);
  }
  return B;
}

/// The reverse fold (see above): from every segment's map, the gradient `local` of its incoming
/// state from its own outputs, and dS_T (zero if empty), the gradient of every segment's outgoing
/// state and of the initial state: (G_0 .. G_last, dS_0).
template <class T>
std::pair<std::vector<Mat<T>>, Mat<T>> fold_gradients(const std::vector<SegmentMap<T>>& maps,
                                                      const std::vector<Mat<T>>& local,
                                                      const Mat<T>& dST, Eigen::Index dk,
                                                      Eigen::Index dv) {
  std::vector<Mat<T>> G(maps.size());
  Mat<T> g = dST.size() ? dST : Mat<T>::Zero(dk, dv);
  for (size_t r = maps.size(); r-- > 0;) {
    G[r] = g;
    const Mat<T> back = active_mutant() == Mutant::segment_grad_fold_untransposed
                            ? Mat<T>(maps[r].M * g)  // planted: M where Mᵀ belongs
                            : Mat<T>(maps[r].M.transpose() * g);
    g = back + local[r];
  }
  return {std::move(G), std::move(g)};
}

/// Gradients of the whole sequence from a cut into segments of the given lengths (summing to T;
/// zeros allowed), from initial state S0 (zero if empty) and upstream gradients up (as
/// recurrent_backward). Same result as recurrent_backward(in, opt, S0, up).
template <class T>
HeadGradients<T> segment_backward(const HeadInputs<T>& in, const Options<T>& opt,
                                  const std::vector<Eigen::Index>& lengths, const Mat<T>& S0,
                                  const HeadOutputs<T>& up) {
  const SegmentStates<T> st = segment_states(in, opt, lengths, S0);
  const auto upstream = [&](Eigen::Index start, Eigen::Index len, const Mat<T>& dS) {
    HeadOutputs<T> u;
    u.o = up.o.size() ? Mat<T>(up.o.middleRows(start, len)) : Mat<T>::Zero(len, in.dv());
    u.state = dS;
    return u;
  };
  // Each segment's local backward (parallel): the gradient of its incoming state from its
  // outputs alone.
  std::vector<Mat<T>> local;
  Eigen::Index start = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    const HeadInputs<T> seg = slice_tokens(in, start, lengths[r]);
    local.push_back(
        recurrent_backward(seg, opt, st.incoming[r], upstream(start, lengths[r], Mat<T>())).state);
    start += lengths[r];
  }
  const auto [G, dS0] = fold_gradients(st.maps, local, up.state, in.dk(), in.dv());
  // Each segment's backward (parallel) from its true incoming state with dO and G_r.
  HeadGradients<T> g = zero_gradients(in);
  start = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    const Eigen::Index n = lengths[r];
    const HeadGradients<T> gr = recurrent_backward(slice_tokens(in, start, n), opt, st.incoming[r],
                                                   upstream(start, n, G[r]));
    g.q.middleRows(start, n) = gr.q;
    g.k.middleRows(start, n) = gr.k;
    g.v.middleRows(start, n) = gr.v;
    g.eta.segment(start, n) = gr.eta;
    if (in.alpha.size() != 0) g.alpha.middleRows(start, n) = gr.alpha;
    start += n;
  }
  g.state = dS0;
  return g;
}

}  // namespace kla::ref
