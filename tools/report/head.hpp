// A report Problem as the reference's per-head inputs, in compute type T (exact: T holds the
// storage dtype the problem was rounded to). Shared by the backends and the ground truth.
#pragma once

#include "common.hpp"
#include "kla/ref/types.hpp"

namespace kla::report {

template <class T>
ref::HeadInputs<T> to_head(const Problem& p) {
  ref::HeadInputs<T> in;
  in.q.resize(p.T, p.dk);
  in.k.resize(p.T, p.dk);
  in.v.resize(p.T, p.dv);
  in.eta.resize(p.T);
  if (!p.alpha.empty()) in.alpha.resize(p.T, 1);
  for (int t = 0; t < p.T; ++t) {
    for (int i = 0; i < p.dk; ++i) {
      in.q(t, i) = ref::scalar_cast<T>(p.q[size_t(t) * p.dk + i]);
      in.k(t, i) = ref::scalar_cast<T>(p.k[size_t(t) * p.dk + i]);
    }
    for (int j = 0; j < p.dv; ++j) in.v(t, j) = ref::scalar_cast<T>(p.v[size_t(t) * p.dv + j]);
    in.eta(t) = ref::scalar_cast<T>(p.eta[t]);
    if (!p.alpha.empty()) in.alpha(t, 0) = ref::scalar_cast<T>(p.alpha[t]);
  }
  return in;
}

}  // namespace kla::report
