// seg.grad_truncation — issue 25 (a fused backward's segment fold; docs/prefill_notes.md, round 2
// session 43): the state gradient that a window of tokens passes back with no output gradient,
// dS_0 of the window's backward from dS_T = G (Φ_{t0}ᵀ ⋯ Φ_{t1−1}ᵀ G), is bounded by the
// certificate of state_gradient_contraction (segment_backward.hpp): ‖dS_0‖_F² ≤ c² ‖G‖_F² for
// random G. The certificate exists under the Kaczmarz coefficient (η ≤ 1), is missing under the
// given one only where a token of the window has β‖k‖² > 2, and is attained where the window's
// keys are zero and one channel decays least at every token (Φ = diag(α), G on that channel).
// Exact over rationals: squared norms, no sqrt. Any decay, both coefficients, read-out by scale.
#include "generators.hpp"
#include "kla/ref/segment_backward.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("seg.grad_truncation", "issue 25 (certified truncation of the segment fold)") {
  const Idx dk = dim(8), dv = dim(8);
  const Idx T = uniform(1, 10);
  const DecayKind decay = any_decay();
  auto in = head_inputs(T, dk, dv, decay);
  const auto opt = options();
  const bool zero_keys = *rc::gen::element(false, false, true);
  if (zero_keys) in.k.setZero();
  const Idx t0 = uniform(0, T - 1), t1 = uniform(t0, T);
  const auto c = kla::ref::state_gradient_contraction<Q>(in, opt, t0, t1);

  if (opt.coefficient == kla::ref::Coefficient::kaczmarz) RC_ASSERT(c.has_value());
  if (!c) {  // the given coefficient, and some token's β‖k‖² = η‖k‖² above 2
    bool above = false;
    for (Idx t = t0; t < t1; ++t) above = above || in.eta(t) * in.k.row(t).squaredNorm() > Q(2);
    RC_ASSERT(above);
    return;
  }
  const Mat<Q> G = *matrix(dk, dv);
  if (t1 == t0) {  // no token: nothing passes back but G itself
    RC_ASSERT(*c == Q(1));
    return;
  }
  const auto back = [&](const Mat<Q>& dST) {
    kla::ref::HeadOutputs<Q> up;
    up.o = Mat<Q>::Zero(t1 - t0, dv);
    up.state = dST;
    const Mat<Q> S0 = *matrix(dk, dv);  // the map is linear in dS_T, whatever S_0
    return Mat<Q>(
        kla::ref::recurrent_backward<Q>(kla::ref::slice_tokens(in, t0, t1 - t0), opt, S0, up)
            .state);
  };
  RC_ASSERT(back(G).squaredNorm() <= (*c) * (*c) * G.squaredNorm());

  // Tight: zero keys and one channel that decays least at every token (always so for scalar or
  // no decay, or one token): G on that channel alone passes back exactly c G.
  if (!zero_keys) return;
  Idx best = 0;
  Vec<Q> a0 = in.decay(t0);
  a0.maxCoeff(&best);
  for (Idx t = t0; t < t1; ++t)
    if (in.decay(t)(best) != in.decay(t).maxCoeff()) return;
  Mat<Q> Gc = Mat<Q>::Zero(dk, dv);
  Gc.row(best) = G.row(best);
  RC_ASSERT(back(Gc).squaredNorm() == (*c) * (*c) * Gc.squaredNorm());
}
