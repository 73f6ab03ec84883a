// Normalised-key form (SPEC §1): with r_t = sqrt(‖k_t‖²+ε) > 0, k̂ = k/r, v̂ = v/r,
// KLA(q, k, v, η, α) = GDN(q, k̂, v̂, β = η, α) exactly. Exact over Rational when the caller
// supplies r (pick r rational and set ε = r² − ‖k‖²); otherwise r is computed with sqrt_of.
#pragma once

#include "kla/ref/mutants.hpp"
#include "kla/ref/types.hpp"

namespace kla::ref {

/// Transforms `in` with the given per-token norms r (all > 0). The result is run with
/// Coefficient::given; tokens with r = 0 (k = 0, ε = 0) keep k = 0 and get η = 0, matching the
/// degenerate convention β = 0.
template <class T>
HeadInputs<T> normalize_keys_with(const HeadInputs<T>& in, const Vec<T>& r) {
  in.validate();
  if (r.size() != in.length()) throw std::invalid_argument("kla::ref: one norm per token");
  HeadInputs<T> out = in;
  for (Eigen::Index t = 0; t < in.length(); ++t) {
    if (r(t) == T(0)) {
      out.eta(t) = T(0);
      continue;
    }
    if (!(r(t) > T(0))) throw std::invalid_argument("kla::ref: key norms must be >= 0");
    out.k.row(t) /= r(t);
    if (active_mutant() == Mutant::value_unnormalized) continue;  // planted fault: v̂ = v
    out.v.row(t) /= r(t);
  }
  return out;
}

/// r_t = sqrt(‖k_t‖² + ε), rounded in T.
template <class T>
Vec<T> key_norms(const HeadInputs<T>& in, const T& eps) {
  Vec<T> r(in.length());
  for (Eigen::Index t = 0; t < in.length(); ++t) r(t) = sqrt_of(T(in.k.row(t).squaredNorm() + eps));
  return r;
}

template <class T>
HeadInputs<T> normalize_keys(const HeadInputs<T>& in, const T& eps) {
  return normalize_keys_with(in, key_norms(in, eps));
}

}  // namespace kla::ref
