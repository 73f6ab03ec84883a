// ours.normalized_key — SPEC §1 (our result): with r_t = sqrt(‖k_t‖²+ε), KLA(q, k, v, η, α) equals
// GDN(q, k/r, v/r, β = η, α) exactly (recurrent and chunked), and the normalised within-chunk
// entries η_i k̂_iᵀk̂_j are bounded by η_i in magnitude.
//
// Exact construction (one ε for all tokens, every r_t rational): draw ε and, per token, a
// rational unit direction u (inverse stereographic projection: y ∈ Q^{dk-1}, s = ‖y‖²,
// u = ((1−s), 2y)/(1+s), cyclically shifted, random sign), then k = ρu with ‖k‖² = ρ². For ε > 0
// draw a > 0 and set ρ = (ε/a − a)/2, r = (ε/a + a)/2, so r² − ρ² = ε (ρ = 0 when a² = ε gives a
// zero key); for ε = 0 draw ρ ≠ 0 and set r = |ρ|. One token in eight has k = 0 when ε is a
// rational square (r = sqrt(ε), or r = 0 for ε = 0, the degenerate β = 0 token).
#include <boost/multiprecision/gmp.hpp>

#include "generators.hpp"
#include "statement.hpp"

using namespace kla::proofs;

namespace {

/// sqrt(x) when x ≥ 0 is the square of a rational, else -1.
Q rational_sqrt(const Q& x) {
  using boost::multiprecision::mpz_int;
  const mpz_int n = boost::multiprecision::numerator(x), d = boost::multiprecision::denominator(x);
  if (n < 0) return Q(-1);
  const mpz_int sn = boost::multiprecision::sqrt(n), sd = boost::multiprecision::sqrt(d);
  if (sn * sn != n || sd * sd != d) return Q(-1);
  return Q(sn) / Q(sd);
}

/// A rational vector of norm 1.
Vec<Q> unit_direction(Idx dk) {
  Vec<Q> u(dk);
  if (dk == 1) {
    u(0) = Q(1);
  } else {
    const Vec<Q> y = *vector(dk - 1);
    const Q s = y.squaredNorm();
    Vec<Q> w(dk);
    w(0) = Q(1) - s;
    w.tail(dk - 1) = Q(2) * y;
    const Idx shift = uniform(0, dk - 1);
    for (Idx c = 0; c < dk; ++c) u((c + shift) % dk) = w(c) / (Q(1) + s);
  }
  return *rc::gen::element(false, true) ? Vec<Q>(-u) : u;
}

}  // namespace

KLA_STATEMENT("ours.normalized_key", "SPEC 1 (normalised-key form)") {
  const Idx dk = dim(), dv = dim();
  const Idx T = uniform(1, 12);
  auto in = head_inputs(T, dk, dv, any_decay());
  auto opt = options(false);
  const Q root_eps = rational_sqrt(opt.eps);
  Vec<Q> r(T);
  for (Idx t = 0; t < T; ++t) {
    if (root_eps >= Q(0) && *rc::gen::element(0, 1, 2, 3, 4, 5, 6, 7) == 0) {
      in.k.row(t).setZero();
      r(t) = root_eps;
      continue;
    }
    Q rho;
    if (opt.eps > Q(0)) {
      const Q a = *positive_rational();
      rho = (opt.eps / a - a) / Q(2);
      r(t) = (opt.eps / a + a) / Q(2);
    } else {
      rho = *rc::gen::suchThat(rational(), [](const Q& x) { return x != Q(0); });
      r(t) = rho > Q(0) ? rho : Q(-rho);
    }
    in.k.row(t) = (rho * unit_direction(dk)).transpose();
  }
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
