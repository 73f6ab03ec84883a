// grad.chunk_equals_token — SPEC §8 (backward pass): the chunkwise backward (the algorithm the
// kernels use: one saved state per chunk, gradients flowing backward chunk by chunk through the
// chunk system, outputs and carried state of Propositions 3–4) equals the tokenwise backward
// exactly (==) in every gradient: dq, dk, dv, dη, dα, dS_0. Many chunks with a ragged last one,
// chunk length drawn per case (1, between, at least T), both coefficient modes, decay absent,
// scalar or per channel, zero rows in dO and a zero dS_T drawn on purpose.
#include <algorithm>

#include "generators.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("grad.chunk_equals_token", "SPEC 8, Propositions 3-4") {
  const Idx dk = dim(12), dv = dim(12);
  const Idx T = uniform(1, 16);
  const int kind = *rc::gen::element(2, 2, 2, 2, 0, 1);
  const Idx chunk = kind == 0   ? 1
                    : kind == 1 ? T + uniform(0, 2)
                                : uniform(2, std::max<Idx>(2, T - 1));
  const auto in = head_inputs(T, dk, dv, any_decay());
  const auto opt = options();
  const bool zero_state = *rc::gen::element(false, false, false, true);
  const Mat<Q> S0 = zero_state ? Mat<Q>() : Mat<Q>(*matrix(dk, dv));
  kla::ref::HeadOutputs<Q> up;
  up.o = *matrix(T, dv);
  for (Idx t = 0; t < T; ++t)
    if (*rc::gen::element(0, 1, 2, 3) == 0) up.o.row(t).setZero();
  if (*rc::gen::element(false, false, true)) up.state = *matrix(dk, dv);

  const auto tok = kla::ref::recurrent_backward<Q>(in, opt, S0, up);
  const auto chk = kla::ref::chunk_backward<Q>(in, opt, chunk, S0, up);
  require_equal(chk, tok, "chunked and tokenwise");
}
