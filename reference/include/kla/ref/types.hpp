// Per-head problem description shared by every reference routine.
#pragma once

#include <stdexcept>
#include <string>

#include <Eigen/Core>

#include "kla/ref/scalar.hpp"

namespace kla::ref {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
template <class T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

/// How β_t is formed: Kaczmarz β = η/(‖k‖²+ε) (KLA, eq. kla) or given β = η (GDN).
enum class Coefficient { kaczmarz, given };
/// How o_t is read: o = Sᵀq·scale; o = Sᵀq/‖q‖ (the paper's l2-normalised query); or, as
/// flash-linear-attention's use_qk_l2norm_in_kernel, q and k both replaced by x/sqrt(‖x‖²+ε_n)
/// (ε_n = Options::l2norm_eps) before anything else, and o = Sᵀq̂·scale.
enum class Readout { scale, q_l2norm, qk_l2norm };

template <class T>
struct Options {
  T eps = T(0);
  Coefficient coefficient = Coefficient::kaczmarz;
  Readout readout = Readout::scale;
  T scale = T(1);
  T l2norm_eps = T(1) / T(1000000);  ///< ε_n of Readout::qk_l2norm (FLA's l2norm: 1e-6)
};

/// One head's inputs, rows are tokens: q,k [T,dk], v [T,dv], eta [T].
/// Decay factors α_t = exp(g_t) in (0,1]: `alpha` is [T,1] (scalar decay), [T,dk] (per-channel
/// diagonal decay, S̃ = diag(α_t) S) or empty (no decay, α = 1).
template <class T>
struct HeadInputs {
  Mat<T> q, k, v;
  Vec<T> eta;
  Mat<T> alpha;

  Eigen::Index length() const { return k.rows(); }
  Eigen::Index dk() const { return k.cols(); }
  Eigen::Index dv() const { return v.cols(); }

  /// Decay of token t as a per-channel vector (scalar and absent decay broadcast).
  Vec<T> decay(Eigen::Index t) const {
    if (alpha.size() == 0) return Vec<T>::Constant(dk(), T(1));
    if (alpha.cols() == 1) return Vec<T>::Constant(dk(), alpha(t, 0));
    return alpha.row(t).transpose();
  }

  void validate() const {
    const auto n = length();
    auto fail = [](const std::string& m) { throw std::invalid_argument("kla::ref: " + m); };
    if (q.rows() != n || q.cols() != dk()) fail("q must be [T, dk] like k");
    if (v.rows() != n) fail("v must have one row per token");
    if (eta.size() != n) fail("eta must have one entry per token");
    if (alpha.size() != 0 && (alpha.rows() != n || (alpha.cols() != 1 && alpha.cols() != dk())))
      fail("alpha must be empty, [T,1] or [T,dk]");
  }
};

/// Outputs of a whole-sequence routine: O [T,dv] and the final state S [dk,dv].
template <class T>
struct HeadOutputs {
  Mat<T> o;
  Mat<T> state;
};

}  // namespace kla::ref
