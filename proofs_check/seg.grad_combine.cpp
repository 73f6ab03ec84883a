// seg.grad_combine — issue 27 (context parallelism's backward), the mirror image of seg.combine:
// a sequence cut into segments, each segment's backward from its incoming state with no gradient
// on its outgoing one (in parallel), the reverse fold G_{r−1} = M_rᵀ G_r + local_r from dS_T, and
// each segment's backward from its true incoming state with dO and G_r, gives exactly (==) the
// gradients of one tokenwise backward: dq, dk, dv, dη, dα and dS_0. Random cuts (empty segments,
// one segment, one token each), any decay, both coefficients and read-outs, with and without S_0
// and dS_T.
#include "generators.hpp"
#include "kla/ref/segment_backward.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("seg.grad_combine", "issue 27 (segment maps, backward; SPEC section 8)") {
  const Idx dk = dim(8), dv = dim(8);
  const Idx T = uniform(1, 12);
  const auto in = head_inputs(T, dk, dv, any_decay());
  const auto opt = options();
  const std::vector<Idx> lengths = segment_lengths(T);
  const Mat<Q> S0 = *rc::gen::element(false, false, false, true) ? Mat<Q>() : *matrix(dk, dv);
  kla::ref::HeadOutputs<Q> up;
  up.o = *matrix(T, dv);
  if (*rc::gen::element(true, true, false)) up.state = *matrix(dk, dv);

  const auto tok = kla::ref::recurrent_backward<Q>(in, opt, S0, up);
  const auto seg = kla::ref::segment_backward<Q>(in, opt, lengths, S0, up);
  require_equal(seg, tok, "segmented and tokenwise");
}
