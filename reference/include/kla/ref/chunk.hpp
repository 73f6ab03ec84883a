// Chunkwise KLA (paper Section 4, Propositions 3–4, Algorithm 1 right; SPEC §1).
//
// Per chunk of C tokens with incoming state S_0:
//   (I + B(A⁻∘KKᵀ)) U = B(V − D_γ K S_0)        eq. (chunk_system), forward substitution
//   O     = D_γ Q S_0 + (A∘QKᵀ) U                eq. (chunk_out), each row times its read-out scale
//   S_out = γ_C S_0 + Kᵀ diag(γ_C/γ_1..γ_C/γ_C) U eq. (chunk_state)
// with per-channel decay the Hadamard products become decay-weighted inner products
// k_iᵀ diag(γ_i/γ_j) k_j (paper App. B.6). Exact over Rational; in floating point the error is
// that of the forward substitution, which is not bounded by the unit roundoff alone when β‖k‖
// varies strongly inside a chunk (SPEC §1, normalised-key form).
#pragma once

#include <algorithm>

#include "kla/ref/decay.hpp"
#include "kla/ref/recurrence.hpp"

namespace kla::ref {

/// The chunk system of Proposition 3 for tokens start..start+len-1: matrix = I + B(A⁻∘KKᵀ)
/// [C,C], rhs = B(V − D_γ K S_0) [C,dv].
template <class T>
struct ChunkSystem {
  Mat<T> matrix;
  Mat<T> rhs;
  Vec<T> beta;
};

template <class T>
ChunkSystem<T> chunk_system(const HeadInputs<T>& in, const Options<T>& opt, const Mat<T>& S0,
                            Eigen::Index start, Eigen::Index len, const DecayTable<T>& gam) {
  ChunkSystem<T> sys;
  sys.matrix = Mat<T>::Identity(len, len);
  sys.rhs.resize(len, in.dv());
  sys.beta.resize(len);
  // The planted mask fault lets the diagonal (j = i) into A⁻.
  const Eigen::Index diag = active_mutant() == Mutant::nonstrict_mask ? 1 : 0;
  for (Eigen::Index i = 1; i <= len; ++i) {
    const Vec<T> ki = in.k.row(start + i - 1).transpose();
    const T beta = coefficient(T(ki.squaredNorm()), in.eta(start + i - 1), opt);
    sys.beta(i - 1) = beta;
    for (Eigen::Index j = 1; j < i + diag; ++j)
      sys.matrix(i - 1, j - 1) +=
          beta * weighted_dot<T>(ki, gam(i, j), in.k.row(start + j - 1).transpose());
    const Vec<T> pred = S0.transpose() * gam(i, 0).cwiseProduct(ki);
    sys.rhs.row(i - 1) = (beta * (in.v.row(start + i - 1).transpose() - pred)).transpose();
  }
  if (active_mutant() == Mutant::chunk_mask_upper || active_mutant() == Mutant::chunk_beta_right)
    for (Eigen::Index i = 1; i <= len; ++i)
      for (Eigen::Index j = 1; j <= len; ++j) {
        const Vec<T> ki = in.k.row(start + i - 1).transpose();
        const Vec<T> kj = in.k.row(start + j - 1).transpose();
        // Planted faults: no causal mask above the diagonal (β_i k_iᵀk_j there; forward
        // substitution never reads it), or B multiplied on the right (β_j below the diagonal).
        if (active_mutant() == Mutant::chunk_mask_upper && j > i)
          sys.matrix(i - 1, j - 1) = sys.beta(i - 1) * ki.dot(kj);
        if (active_mutant() == Mutant::chunk_beta_right && j < i)
          sys.matrix(i - 1, j - 1) = sys.beta(j - 1) * weighted_dot<T>(ki, gam(i, j), kj);
      }
  return sys;
}

/// Solves M X = R for lower-triangular M by forward substitution (divides by the diagonal, so a
/// matrix that is not unit-triangular is solved as what it is, not silently as I + strict part).
template <class T>
Mat<T> forward_substitution(const Mat<T>& M, const Mat<T>& R) {
  Mat<T> X(R.rows(), R.cols());
  for (Eigen::Index i = 0; i < M.rows(); ++i) {
    Eigen::Matrix<T, 1, Eigen::Dynamic> acc = R.row(i);
    for (Eigen::Index j = 0; j < i; ++j) acc -= M(i, j) * X.row(j);
    X.row(i) = acc / M(i, i);
  }
  return X;
}

/// One chunk: writes the outputs of its tokens into out.o and replaces `state` by S_out.
template <class T>
void chunk_step(const HeadInputs<T>& in, const Options<T>& opt, Eigen::Index start,
                Eigen::Index len, Mat<T>& state, Mat<T>& o) {
  const DecayTable<T> gam(in, start, len);
  const ChunkSystem<T> sys = chunk_system(in, opt, state, start, len, gam);
  const Mat<T> U = forward_substitution(sys.matrix, sys.rhs);
  // The planted output-mask fault leaves the diagonal (j = i) out of A.
  const Eigen::Index diag = active_mutant() == Mutant::chunk_out_strict_mask ? 0 : 1;
  for (Eigen::Index i = 1; i <= len; ++i) {
    const Vec<T> qi = in.q.row(start + i - 1).transpose();
    Vec<T> oi = state.transpose() * gam(i, 0).cwiseProduct(qi);
    for (Eigen::Index j = 1; j < i + diag; ++j)
      oi += weighted_dot<T>(qi, gam(i, j), in.k.row(start + j - 1).transpose()) *
            U.row(j - 1).transpose();
    o.row(start + i - 1) = (oi * readout_scale(qi, opt)).transpose();
  }
  Mat<T> next = gam(len, 0).asDiagonal() * state;
  for (Eigen::Index j = 1; j <= len; ++j)
    next += gam(len, j).cwiseProduct(in.k.row(start + j - 1).transpose()) * U.row(j - 1);
  if (active_mutant() == Mutant::gate_channel_reversed) {
    // Planted fault: the carried state reads the per-channel decay in reverse channel order.
    next = Vec<T>(gam(len, 0).reverse()).asDiagonal() * state;
    for (Eigen::Index j = 1; j <= len; ++j)
      next += Vec<T>(gam(len, j).reverse()).cwiseProduct(in.k.row(start + j - 1).transpose()) *
              U.row(j - 1);
  }
  state = std::move(next);
}

/// Whole sequence in chunks of `chunk` tokens (the last one ragged), state passed across.
template <class T>
HeadOutputs<T> chunk_forward(const HeadInputs<T>& in, const Options<T>& opt, Eigen::Index chunk,
                             const Mat<T>& S0 = Mat<T>()) {
  if (opt.readout == Readout::qk_l2norm) {
    const auto [nin, nopt] = with_qk_l2norm(in, opt);
    return chunk_forward(nin, nopt, chunk, S0);
  }
  in.validate();
  if (chunk < 1) throw std::invalid_argument("kla::ref: chunk length must be >= 1");
  HeadOutputs<T> out;
  out.state = S0.size() ? S0 : Mat<T>::Zero(in.dk(), in.dv());
  if (out.state.rows() != in.dk() || out.state.cols() != in.dv())
    throw std::invalid_argument("kla::ref: initial state must be [dk, dv]");
  out.o.resize(in.length(), in.dv());
  for (Eigen::Index start = 0; start < in.length(); start += chunk)
    chunk_step(in, opt, start, std::min(chunk, in.length() - start), out.state, out.o);
  return out;
}

}  // namespace kla::ref
