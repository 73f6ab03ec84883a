// seg.grad_bound — issue 25 (the segmented state-gradient chain's windows,
// cuda/src/bwd/bwd_state_grad_segments.cuh): the state gradient entering each chunk of C tokens
// is bounded by state_gradient_bounds (segment_backward.hpp), B_c = L_c + γ_c B_{c+1}, B_n =
// ‖dS_T‖_F, wherever every token from the chunk on has β‖k‖² ∈ [0, 2]: ‖dS_c‖_F² ≤ B_c² for random
// dO, dS_T, chunk sizes and decays, dS_c from recurrent_backward over tokens cC .. T−1. The bound
// exists under Kaczmarz (η ≤ 1) for every chunk. Exact over rationals but for the square roots of
// the norms (‖s q_t‖ ‖do_t‖ and ‖dS_T‖_F), each replaced by a rational at or above it (checked by
// squaring), so the bound compared is at or above the one the routine states, by a relative 2^-40
// at most. Read-out by scale (no sqrt in the recurrence).
#include <cmath>

#include "generators.hpp"
#include "kla/ref/segment_backward.hpp"
#include "statement.hpp"

using namespace kla::proofs;

namespace {

/// A rational r ≥ sqrt(x) (x ≥ 0 rational) within a relative 2^-40 of it: the double square root
/// nudged up until r² ≥ x holds exactly.
Q sqrt_above(const Q& x) {
  if (x == Q(0)) return Q(0);
  double d = std::sqrt(static_cast<double>(x)) * (1.0 + 0x1p-44);
  Q r(d);
  while (r * r < x) r = Q(r * Q(1 + 0x1p-44));
  return r;
}

}  // namespace

KLA_STATEMENT("seg.grad_bound", "issue 25 (the segmented state-gradient chain's bound)") {
  const Idx dk = dim(8), dv = dim(8);
  const Idx T = uniform(1, 12), C = uniform(1, 4);
  const auto in = head_inputs(T, dk, dv, any_decay());
  const auto opt = options();
  kla::ref::HeadOutputs<Q> up;
  up.o = *matrix(T, dv);
  up.state = *rc::gen::element(false, true) ? *matrix(dk, dv) : Mat<Q>::Zero(dk, dv);
  std::vector<Q> out(static_cast<size_t>(T));
  for (Idx t = 0; t < T; ++t) {
    const Q s = opt.scale;  // Readout::scale
    out[size_t(t)] = sqrt_above(Q(s * s * in.q.row(t).squaredNorm() * up.o.row(t).squaredNorm()));
  }
  const auto B =
      kla::ref::state_gradient_bounds<Q>(in, opt, out, sqrt_above(Q(up.state.squaredNorm())), C);
  const Idx n = (T + C - 1) / C;
  RC_ASSERT(Idx(B.size()) == n + 1);
  for (Idx c = 0; c < n; ++c) {
    if (opt.coefficient == kla::ref::Coefficient::kaczmarz) RC_ASSERT(B[size_t(c)].has_value());
    if (!B[size_t(c)]) continue;
    kla::ref::HeadOutputs<Q> tail;
    tail.o = up.o.middleRows(c * C, T - c * C);
    tail.state = up.state;
    const Mat<Q> S0 = *matrix(dk, dv);  // the state gradient does not depend on the states
    const Mat<Q> dS =
        kla::ref::recurrent_backward<Q>(kla::ref::slice_tokens(in, c * C, T - c * C), opt, S0, tail)
            .state;
    RC_ASSERT(dS.squaredNorm() <= *B[size_t(c)] * *B[size_t(c)]);
  }
}
