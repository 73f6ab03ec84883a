// Cumulative decay inside a chunk (SPEC §1: γ_i = α_1⋯α_i, Γ_ij = γ_i/γ_j).
//
// Each ratio γ_i/γ_j is formed as the direct product α_{j+1}⋯α_i, never as a quotient of two
// cumulative products: exact over Rational, no underflow of γ_i itself, and a relative error of
// at most (i−j) roundoffs in floating point. Decay is per channel ([dk] vectors); scalar decay
// is the broadcast special case, so one implementation serves both (paper App. B.6).
#pragma once

#include <vector>

#include "kla/ref/mutants.hpp"
#include "kla/ref/types.hpp"

namespace kla::ref {

template <class T>
class DecayTable {
 public:
  /// Tokens start..start+len-1 of `in`, indexed 1..len locally as in the paper; 0 = chunk start.
  DecayTable(const HeadInputs<T>& in, Eigen::Index start, Eigen::Index len)
      : len_(len), ratios_(static_cast<size_t>((len + 1) * (len + 1))) {
    for (Eigen::Index i = 0; i <= len; ++i) {
      Vec<T> acc = Vec<T>::Constant(in.dk(), T(1));
      at(i, i) = acc;
      for (Eigen::Index j = i - 1; j >= 0; --j) {
        acc = acc.cwiseProduct(in.decay(start + j));  // now α_{j+1}⋯α_i (token j+1 is row j)
        at(i, j) = acc;
      }
    }
    if (active_mutant() == Mutant::gamma_off_by_one) {
      // Planted fault: γ_i/γ_j over tokens j..i, i.e. one decay too many for j ≥ 1.
      for (Eigen::Index i = 1; i <= len; ++i)
        for (Eigen::Index j = 1; j <= i; ++j)
          at(i, j) = at(i, j).cwiseProduct(in.decay(start + j - 1));
    }
  }

  /// Γ(i, j) = γ_i/γ_j as a per-channel vector, 0 ≤ j ≤ i ≤ len; Γ(i, 0) = γ_i.
  const Vec<T>& operator()(Eigen::Index i, Eigen::Index j) const {
    return ratios_[static_cast<size_t>(i * (len_ + 1) + j)];
  }
  Eigen::Index length() const { return len_; }

 private:
  Vec<T>& at(Eigen::Index i, Eigen::Index j) {
    return ratios_[static_cast<size_t>(i * (len_ + 1) + j)];
  }
  Eigen::Index len_;
  std::vector<Vec<T>> ratios_;
};

/// Decay-weighted inner product aᵀ diag(γ) b (for scalar decay: γ·aᵀb).
template <class T>
T weighted_dot(const Vec<T>& a, const Vec<T>& gamma, const Vec<T>& b) {
  return a.cwiseProduct(gamma).dot(b);
}

}  // namespace kla::ref
