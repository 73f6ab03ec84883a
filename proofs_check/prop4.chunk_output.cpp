// prop4.chunk_output — Proposition 4, eqs. (chunk_out) and (chunk_state), proof in Appendix B:
// the chunkwise outputs O and the state passed from chunk to chunk equal the tokenwise recurrence
// exactly, over many chunks with an initial state, a ragged last chunk, and chunk lengths 1 and
// >= T (scalar decay or none; per-channel decay is ext.diagonal_gating).
#include <algorithm>

#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("prop4.chunk_output", "Proposition 4, eq. chunk_out") {
  const Idx dk = dim(), dv = dim();
  const Idx T = uniform(1, 16);
  // Chunk length: 1, at least T (one chunk), or in between (several chunks, often ragged).
  const int kind = *rc::gen::element(2, 2, 2, 2, 0, 1);
  const Idx chunk = kind == 0   ? 1
                    : kind == 1 ? T + uniform(0, 2)
                                : uniform(2, std::max<Idx>(2, T - 1));
  const auto in = head_inputs(
      T, dk, dv, *rc::gen::element(DecayKind::scalar, DecayKind::scalar, DecayKind::none));
  const auto opt = options();
  const bool zero_state = *rc::gen::element(false, false, false, true);
  const Mat<Q> S0 = zero_state ? Mat<Q>() : Mat<Q>(*matrix(dk, dv));

  const auto tok = kla::ref::recurrent_forward<Q>(in, opt, S0);
  const auto chk = kla::ref::chunk_forward<Q>(in, opt, chunk, S0);
  require_equal(chk.o, tok.o, "chunked O and tokenwise O");
  require_equal(chk.state, tok.state, "chunked S_out and tokenwise S_T");

  // The tokenwise recurrence itself against the one written out in the test.
  const auto S = oracle::states(in, opt, 0, T, zero_state ? Mat<Q>(Mat<Q>::Zero(dk, dv)) : S0);
  require_equal(tok.state, S.back(), "recurrent_forward state and the written-out recurrence");
  for (Idx t = 0; t < T; ++t)
    require_equal(tok.o.row(t).transpose(),
                  S[static_cast<size_t>(t + 1)].transpose() * in.q.row(t).transpose() * opt.scale,
                  "o_t and S_t^T q_t scale");
}
