// Segments of a sequence as affine maps of the state (issue 26: sequence-parallel scans; issue
// 27: context parallelism). Every token is affine in the state it reads:
//   S_t = A_t S_{t−1} + B_t,   A_t = (I − β_t k_t k_tᵀ) diag(α_t)  [dk,dk],   B_t = β_t k_t v_tᵀ,
// (eq. kla: S̃ = diag(α) S, S = S̃ + β k (v − S̃ᵀk)ᵀ), so a segment of tokens is one affine map
// S_out = M S_in + L with M the product of its A_t (latest on the left) and L its output from a
// zero state. Segments can run in parallel from zero states; composing the maps in order gives
// every segment its true incoming state, and a segment's outputs are those from the zero state
// plus the read-out of the carried-in part: o_t = o_t⁰ + s(q_t) (P_t S_in)ᵀ q_t with P_t the
// product of the segment's A's up to t.
//
// Numerical contract: over Rational equal (==) to recurrent_forward (proofs_check seg.combine);
// in floating point each A_t product rounds, and M is a product of up to len contractions
// (‖A_t‖₂ ≤ 1 for η ≤ 1, α ≤ 1) with the errors of a length-len chain.
#pragma once

#include <vector>

#include "kla/ref/mutants.hpp"
#include "kla/ref/recurrence.hpp"

namespace kla::ref {

/// S_out = M S_in + L for one segment: M [dk,dk], L [dk,dv].
template <class T>
struct SegmentMap {
  Mat<T> M, L;
};

/// The identity map (an empty segment) for dk × dv states.
template <class T>
SegmentMap<T> identity_map(Eigen::Index dk, Eigen::Index dv) {
  return {Mat<T>::Identity(dk, dk), Mat<T>::Zero(dk, dv)};
}

/// A_t of token t (see the top of this file).
template <class T>
Mat<T> token_transition(const HeadInputs<T>& in, const Options<T>& opt, Eigen::Index t) {
  const Vec<T> k = in.k.row(t).transpose();
  const T beta = coefficient(T(k.squaredNorm()), in.eta(t), opt);
  const Mat<T> I = Mat<T>::Identity(in.dk(), in.dk());
  return (I - beta * k * k.transpose()) * in.decay(t).asDiagonal();
}

/// The map of tokens [start, start + len) of `in`.
template <class T>
SegmentMap<T> segment_map(const HeadInputs<T>& in, const Options<T>& opt, Eigen::Index start,
                          Eigen::Index len) {
  SegmentMap<T> m = identity_map<T>(in.dk(), in.dv());
  for (Eigen::Index t = start; t < start + len; ++t) {
    const Vec<T> k = in.k.row(t).transpose();
    const T beta = coefficient(T(k.squaredNorm()), in.eta(t), opt);
    const Mat<T> A = token_transition(in, opt, t);
    m.M = A * m.M;
    m.L = A * m.L + beta * k * in.v.row(t);
  }
  return m;
}

/// `first` then `second`: S ↦ M₂ (M₁ S + L₁) + L₂ = (M₂ M₁) S + (M₂ L₁ + L₂). Exact over Rational.
template <class T>
SegmentMap<T> combine(const SegmentMap<T>& first, const SegmentMap<T>& second) {
  if (active_mutant() == Mutant::segment_combine_order)  // planted: M₁ M₂
    return {first.M * second.M, second.M * first.L + second.L};
  return {second.M * first.M, second.M * first.L + second.L};
}

/// Every segment's map and the state entering it, for a cut of `in` into segments of the given
/// lengths (summing to T; zeros allowed), from initial state S0 (zero if empty): the maps are
/// independent of each other (what runs in parallel), the incoming states compose them in order
/// (the combine). `final` is the state after the last segment.
template <class T>
struct SegmentStates {
  std::vector<SegmentMap<T>> maps;
  std::vector<Mat<T>> incoming;
  Mat<T> final;
};

template <class T>
SegmentStates<T> segment_states(const HeadInputs<T>& in, const Options<T>& opt,
                                const std::vector<Eigen::Index>& lengths, const Mat<T>& S0) {
  in.validate();
  Eigen::Index total = 0;
  for (const Eigen::Index n : lengths) {
    if (n < 0) throw std::invalid_argument("kla::ref: a segment length is negative");
    total += n;
  }
  if (total != in.length())
    throw std::invalid_argument("kla::ref: the segment lengths must sum to T");
  const Mat<T> S_in0 = S0.size() ? S0 : Mat<T>::Zero(in.dk(), in.dv());
  SegmentStates<T> st;
  Eigen::Index start = 0;
  for (const Eigen::Index n : lengths) {
    st.maps.push_back(segment_map(in, opt, start, n));
    start += n;
  }
  SegmentMap<T> prefix = identity_map<T>(in.dk(), in.dv());
  for (const auto& m : st.maps) {
    st.incoming.push_back(prefix.M * S_in0 + prefix.L);
    prefix = combine(prefix, m);
  }
  st.final = prefix.M * S_in0 + prefix.L;
  return st;
}

/// The forward pass in segments of the given lengths (summing to T; zeros allowed): the maps and
/// incoming states of segment_states, then each segment's outputs from its carried-in state.
/// Same result as recurrent_forward(in, opt, S0).
template <class T>
HeadOutputs<T> segment_forward(const HeadInputs<T>& in, const Options<T>& opt,
                               const std::vector<Eigen::Index>& lengths,
                               const Mat<T>& S0 = Mat<T>()) {
  const SegmentStates<T> st = segment_states(in, opt, lengths, S0);
  const std::vector<Mat<T>>& incoming = st.incoming;
  HeadOutputs<T> out;
  out.o = Mat<T>::Zero(in.length(), in.dv());
  out.state = st.final;
  // Outputs (parallel over segments) = zero-state outputs + the carried-in read-out.
  Eigen::Index start = 0;
  for (size_t j = 0; j < lengths.size(); ++j) {
    SegmentMap<T> upto = identity_map<T>(in.dk(), in.dv());
    for (Eigen::Index t = start; t < start + lengths[j]; ++t) {
      upto = combine(upto, segment_map(in, opt, t, 1));
      const Vec<T> q = in.q.row(t).transpose();
      const Mat<T> S_t = upto.M * incoming[j] + upto.L;  // = zero-state part + carried part
      out.o.row(t) = (readout_scale(q, opt) * (S_t.transpose() * q)).transpose();
    }
    start += lengths[j];
  }
  return out;
}

}  // namespace kla::ref
