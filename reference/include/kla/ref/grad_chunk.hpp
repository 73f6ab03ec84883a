// Chunkwise backward pass (SPEC §8; issue 25): the algorithm the kernels use. The forward runs in
// chunks and keeps each chunk's incoming state S_0 (one [dk,dv] state per chunk, what the kernels
// save); the gradients then flow backward chunk by chunk through the chunk form of Propositions
// 3–4 (chunk.hpp), the last chunk ragged:
//   (I + L) U = R,  L_ij = β_i k_iᵀΓ(i,j)k_j (j < i),  R_i = β_i (v_i − S_0ᵀΓ(i,0)k_i)
//                                                                  eq. (chunk_system)
//   o_i   = s_i (S_0ᵀΓ(i,0)q_i + Σ_{j≤i} (q_iᵀΓ(i,j)k_j) u_j)     eq. (chunk_out)
//   S_out = Γ(C,0) S_0 + Σ_j Γ(C,j)k_j u_jᵀ                         eq. (chunk_state)
// with Γ(i,j) = diag(γ_i/γ_j) (per channel; scalar decay broadcast). The adjoint of the solve is
// one back substitution, dR = (I + L)⁻ᵀ dU and dL = −dR Uᵀ (strictly lower part). Every factor
// Γ(i,j) = exp(G_i − G_j), G the cumulative log-decay, sends dΓ∘Γ to dG_i and −dΓ∘Γ to dG_j;
// the log-decay gradient is the reverse cumulative sum dg_s = Σ_{i≥s} dG_i (what the kernels
// produce) and dα_s = dg_s / α_s.
//
// Numerical contract: over Rational equal (==) to recurrent_backward (proofs_check
// grad.chunk_equals_token). In floating point it inherits the chunk form's conditioning: the
// back substitution with (I + L)ᵀ amplifies errors exactly as the forward substitution does
// (SPEC §1: unbounded entries in the raw-key form, bounded by η in the normalised-key form), and
// dα = dg/α loses nothing beyond one division.
#pragma once

#include <algorithm>
#include <vector>

#include "kla/ref/chunk.hpp"
#include "kla/ref/grad.hpp"

namespace kla::ref {

/// Solves Mᵀ X = R for lower-triangular M by back substitution (the adjoint of
/// forward_substitution: dR = M⁻ᵀ dU). Divides by the diagonal, as forward_substitution does.
template <class T>
Mat<T> transposed_back_substitution(const Mat<T>& M, const Mat<T>& R) {
  Mat<T> X(R.rows(), R.cols());
  for (Eigen::Index i = M.rows() - 1; i >= 0; --i) {
    Eigen::Matrix<T, 1, Eigen::Dynamic> acc = R.row(i);
    for (Eigen::Index j = i + 1; j < M.rows(); ++j) acc -= M(j, i) * X.row(j);
    X.row(i) = acc / M(i, i);
  }
  return X;
}

/// One chunk backwards: tokens start..start+len-1 with incoming state S0 (saved by the forward)
/// and upstream dO (the whole [T,dv]). On entry dS = ∂ℓ/∂S_out, on exit ∂ℓ/∂S_0; the chunk's
/// rows of g are written (overwritten, not accumulated).
template <class T>
void chunk_backward_step(const HeadInputs<T>& in, const Options<T>& opt, Eigen::Index start,
                         Eigen::Index len, const Mat<T>& S0, const Mat<T>& dO, Mat<T>& dS,
                         HeadGradients<T>& g) {
  using Idx = Eigen::Index;
  const Idx dk = in.dk(), dv = in.dv();
  const DecayTable<T> gam(in, start, len);
  const ChunkSystem<T> sys = chunk_system(in, opt, S0, start, len, gam);
  const Mat<T> U = forward_substitution(sys.matrix, sys.rhs);
  auto key = [&](Idx i) { return Vec<T>(in.k.row(start + i - 1).transpose()); };
  auto query = [&](Idx i) { return Vec<T>(in.q.row(start + i - 1).transpose()); };
  auto u = [&](Idx j) { return Vec<T>(U.row(j - 1).transpose()); };

  // Local gradients, row i-1 for position i; dG[i] = ∂ℓ/∂G_i (per channel), i = 0..len.
  Mat<T> dQ = Mat<T>::Zero(len, dk), dK = Mat<T>::Zero(len, dk);
  Mat<T> dU = Mat<T>::Zero(len, dv), dV = Mat<T>::Zero(len, dv);
  Vec<T> dbeta = Vec<T>::Zero(len);
  std::vector<Vec<T>> dG(static_cast<size_t>(len + 1), Vec<T>::Zero(dk));
  auto through_gamma = [&](Idx i, Idx j, const Vec<T>& dgamma) {
    const Vec<T> x = dgamma.cwiseProduct(gam(i, j));
    dG[static_cast<size_t>(i)] += x;
    dG[static_cast<size_t>(j)] -= x;
  };
  Mat<T> dS0 = Mat<T>::Zero(dk, dv);

  // Outputs, eq. (chunk_out): y_i = S_0ᵀΓ(i,0)q_i + Σ_{j≤i} (q_iᵀΓ(i,j)k_j) u_j, o_i = s_i y_i.
  for (Idx i = 1; i <= len; ++i) {
    const Vec<T> qi = query(i);
    const Vec<T> dout = dO.row(start + i - 1).transpose();
    const T s = readout_scale(qi, opt);
    const Vec<T> dy = s * dout;
    const Vec<T> Sdy = S0 * dy;
    Vec<T> y = S0.transpose() * gam(i, 0).cwiseProduct(qi);
    dS0 += gam(i, 0).cwiseProduct(qi) * dy.transpose();
    Vec<T> dqi = gam(i, 0).cwiseProduct(Sdy);
    through_gamma(i, 0, qi.cwiseProduct(Sdy));
    for (Idx j = 1; j <= i; ++j) {
      const Vec<T> kj = key(j);
      const T w = weighted_dot<T>(qi, gam(i, j), kj);
      const T c = u(j).dot(dy);
      y += w * u(j);
      dU.row(j - 1) += (w * dy).transpose();
      dqi += c * gam(i, j).cwiseProduct(kj);
      dK.row(j - 1) += (c * gam(i, j).cwiseProduct(qi)).transpose();
      through_gamma(i, j, c * qi.cwiseProduct(kj));
    }
    dQ.row(i - 1) = (dqi + readout_scale_backward(qi, T(y.dot(dout)), opt)).transpose();
  }

  // Carried state, eq. (chunk_state): S_out = Γ(C,0) S_0 + Σ_j Γ(C,j)k_j u_jᵀ.
  through_gamma(len, 0, Vec<T>(dS.cwiseProduct(S0).rowwise().sum()));
  for (Idx j = 1; j <= len; ++j) {
    const Vec<T> kj = key(j);
    const Vec<T> Du = dS * u(j);
    dU.row(j - 1) += (dS.transpose() * gam(len, j).cwiseProduct(kj)).transpose();
    dK.row(j - 1) += gam(len, j).cwiseProduct(Du).transpose();
    through_gamma(len, j, kj.cwiseProduct(Du));
  }
  if (active_mutant() == Mutant::grad_chunk_carry_no_gamma)
    dS0 += dS;  // planted: γ_C left out of the carry
  else
    dS0 += gam(len, 0).asDiagonal() * dS;

  // The solve, eq. (chunk_system): dR = (I + L)⁻ᵀ dU; dL_ij = −dR_i·u_j for j < i.
  const Mat<T> dR = transposed_back_substitution(sys.matrix, dU);
  for (Idx i = 2; i <= len; ++i) {
    const Vec<T> ki = key(i);
    const T bi = sys.beta(i - 1);
    for (Idx j = 1; j < i; ++j) {
      const Vec<T> kj = key(j);
      const T dL = -dR.row(i - 1).dot(U.row(j - 1));
      dbeta(i - 1) += dL * weighted_dot<T>(ki, gam(i, j), kj);
      dK.row(i - 1) += (dL * bi * gam(i, j).cwiseProduct(kj)).transpose();
      if (active_mutant() != Mutant::grad_chunk_gram_term)  // planted: k_j's side of L_ij lost
        dK.row(j - 1) += (dL * bi * gam(i, j).cwiseProduct(ki)).transpose();
      through_gamma(i, j, dL * bi * ki.cwiseProduct(kj));
    }
  }
  // R_i = β_i (v_i − S_0ᵀΓ(i,0)k_i).
  for (Idx i = 1; i <= len; ++i) {
    const Vec<T> ki = key(i);
    const Vec<T> gk = gam(i, 0).cwiseProduct(ki);
    const Vec<T> residual = in.v.row(start + i - 1).transpose() - S0.transpose() * gk;
    dbeta(i - 1) += dR.row(i - 1).dot(residual);
    const Vec<T> bdR = sys.beta(i - 1) * dR.row(i - 1).transpose();
    dV.row(i - 1) = bdR.transpose();
    const Vec<T> SbdR = S0 * bdR;
    dS0 -= gk * bdR.transpose();
    dK.row(i - 1) -= gam(i, 0).cwiseProduct(SbdR).transpose();
    through_gamma(i, 0, Vec<T>(-ki.cwiseProduct(SbdR)));
  }

  // β_i → η_i, k_i (eq. kla); then write the chunk's rows.
  for (Idx i = 1; i <= len; ++i) {
    const Idx t = start + i - 1;
    Vec<T> dki = dK.row(i - 1).transpose();
    T deta = T(0);
    coefficient_backward(key(i), in.eta(t), dbeta(i - 1), opt, deta, dki);
    g.q.row(t) = dQ.row(i - 1);
    g.k.row(t) = dki.transpose();
    g.v.row(t) = dV.row(i - 1);
    g.eta(t) = deta;
  }
  // Decay: dg_s = Σ_{i≥s} dG_i (reverse cumulative sum), dα_s = dg_s / α_s.
  if (in.alpha.size() != 0) {
    Vec<T> dg = Vec<T>::Zero(dk);
    for (Idx s = len; s >= 1; --s) {
      dg += dG[static_cast<size_t>(s)];
      const Idx t = start + s - 1;
      g.alpha.row(t).setZero();
      detail::add_decay_gradient(in, t, Vec<T>(dg.cwiseQuotient(in.decay(t))), g);
    }
  }
  dS = std::move(dS0);
}

/// Gradients of the whole sequence in chunks of `chunk` tokens (the last one ragged): the forward
/// in chunks keeping each chunk's incoming state, then chunk_backward_step from the last chunk
/// to the first. Same arguments and result as recurrent_backward.
template <class T>
HeadGradients<T> chunk_backward(const HeadInputs<T>& in, const Options<T>& opt, Eigen::Index chunk,
                                const Mat<T>& S0, const HeadOutputs<T>& up) {
  if (opt.readout == Readout::qk_l2norm) {  // as recurrent_backward
    const auto [hat, hopt] = with_qk_l2norm(in, opt);
    HeadGradients<T> g = chunk_backward(hat, hopt, chunk, S0, up);
    detail::qk_l2norm_chain(in, hat, opt, g);
    return g;
  }
  in.validate();
  if (chunk < 1) throw std::invalid_argument("kla::ref: chunk length must be >= 1");
  const HeadOutputs<T> d = detail::upstream_or_zero(in, up);
  std::vector<Eigen::Index> starts;
  std::vector<Mat<T>> saved;  // the state entering each chunk
  Mat<T> state = detail::initial_state_or_zero(in, S0);
  Mat<T> o(in.length(), in.dv());
  for (Eigen::Index start = 0; start < in.length(); start += chunk) {
    starts.push_back(start);
    saved.push_back(state);
    chunk_step(in, opt, start, std::min(chunk, in.length() - start), state, o);
  }
  HeadGradients<T> g = zero_gradients(in);
  Mat<T> dS = d.state;
  for (size_t c = starts.size(); c-- > 0;)
    chunk_backward_step(in, opt, starts[c], std::min(chunk, in.length() - starts[c]), saved[c], d.o,
                        dS, g);
  g.state = std::move(dS);
  return g;
}

}  // namespace kla::ref
