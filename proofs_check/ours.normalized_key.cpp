// ours.normalized_key — SPEC §1 (our result): with r_t = sqrt(‖k_t‖²+ε), KLA(q, k, v, η, α) equals
// GDN(q, k/r, v/r, β = η, α) exactly (recurrent and chunked), and the normalised within-chunk
// entries η_i k̂_iᵀk̂_j are bounded by η_i in magnitude.
//
// Exact construction (one ε for all tokens, every r_t rational): keys_with_rational_norms in
// generators.hpp (rational unit directions scaled so that r_t² − ‖k_t‖² = ε; zero keys included).
#include "generators.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("ours.normalized_key", "SPEC 1 (normalised-key form)") {
  const Idx dk = dim(), dv = dim();
  const Idx T = uniform(1, 12);
  auto in = head_inputs(T, dk, dv, any_decay());
  auto opt = options(false);
  const Vec<Q> r = keys_with_rational_norms(in, opt.eps);
  for (Idx t = 0; t < T; ++t) RC_ASSERT(Q(in.k.row(t).squaredNorm()) + opt.eps == r(t) * r(t));

  const auto hat = kla::ref::normalize_keys_with<Q>(in, r);
  auto gdn = opt;
  gdn.coefficient = kla::ref::Coefficient::given;
  const auto kla_out = kla::ref::recurrent_forward<Q>(in, opt);
  const auto gdn_out = kla::ref::recurrent_forward<Q>(hat, gdn);
  require_equal(gdn_out.o, kla_out.o, "GDN(k^, v^) and KLA outputs");
  require_equal(gdn_out.state, kla_out.state, "GDN(k^, v^) and KLA states");
  const Idx chunk = uniform(1, T);
  const auto gdn_chunk = kla::ref::chunk_forward<Q>(hat, gdn, chunk);
  require_equal(gdn_chunk.o, kla_out.o, "chunked GDN(k^, v^) and KLA outputs");
  require_equal(gdn_chunk.state, kla_out.state, "chunked GDN(k^, v^) and KLA states");

  // Bounded chunk entries: (η_i k̂_iᵀk̂_j)² ≤ η_i² since ‖k̂‖² = ρ²/(ρ²+ε) ≤ 1.
  for (Idx i = 0; i < T; ++i) {
    RC_ASSERT(Q(hat.k.row(i).squaredNorm()) <= Q(1));
    for (Idx j = 0; j < i; ++j) {
      const Q entry = hat.eta(i) * hat.k.row(i).dot(hat.k.row(j));
      RC_ASSERT(entry * entry <= hat.eta(i) * hat.eta(i));
    }
  }
}
