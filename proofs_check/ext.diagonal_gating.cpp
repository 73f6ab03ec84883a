// ext.diagonal_gating — Appendix B, "Extension to diagonal gating" (GLA/KDA decay diag(α_t)):
// with per-channel decay the chunkwise form (outputs and carried state, many chunks) and the
// combined WY state of every position equal the tokenwise recurrence exactly.
#include <algorithm>

#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("ext.diagonal_gating", "App. B (diagonal gating)") {
  const Idx dk = dim(), dv = dim();
  const Idx T = uniform(1, 12);
  const int kind = *rc::gen::element(2, 2, 2, 0, 1);
  const Idx chunk = kind == 0 ? 1 : kind == 1 ? T : uniform(2, std::max<Idx>(2, T - 1));
  const auto in = head_inputs(T, dk, dv, DecayKind::diagonal);
  const auto opt = options();
  const Mat<Q> S0 = *matrix(dk, dv);

  const auto tok = kla::ref::recurrent_forward<Q>(in, opt, S0);
  const auto chk = kla::ref::chunk_forward<Q>(in, opt, chunk, S0);
  require_equal(chk.o, tok.o, "chunked O and tokenwise O");
  require_equal(chk.state, tok.state, "chunked S_out and tokenwise S_T");

  // WY over the whole sequence as one chunk, against the recurrence written out in the test.
  const auto S = oracle::states(in, opt, 0, T, S0);
  require_equal(tok.state, S.back(), "recurrent_forward state and the written-out recurrence");
  const kla::ref::DecayTable<Q> gam(in, 0, T);
  const auto f = kla::ref::wy_factors<Q>(in, opt, 0, T, gam);
  for (Idx i = 1; i <= T; ++i)
    require_equal(kla::ref::wy_state<Q>(in, 0, f, gam, i, S0), S[static_cast<size_t>(i)],
                  "WY state and tokenwise state");
}
