// wy.P — Proposition wy_P (Appendix B, eqs. P_wy, w_recursion), in state form with the decay
// ratio Γ(i,r) = γ_i/γ_r: P_i = Γ(i,0) − Σ_{r≤i} Γ(i,r) k_r w_rᵀ equals the explicit product
// (I − β_i k_i k_iᵀ) D_i ⋯ (I − β_1 k_1 k_1ᵀ) D_1 for every i of a chunk (scalar, diagonal, no
// decay).
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("wy.P", "Proposition wy_P, eq. P_wy") {
  const Idx dk = dim(), dv = dim(4);
  const Idx prefix = uniform(0, 2), C = uniform(1, 10);
  const auto in =
      head_inputs(prefix + C, dk, dv,
                  *rc::gen::element(DecayKind::scalar, DecayKind::diagonal, DecayKind::none));
  const auto opt = options();
  const kla::ref::DecayTable<Q> gam(in, prefix, C);
  const auto f = kla::ref::wy_factors<Q>(in, opt, prefix, C, gam);

  Mat<Q> P = Mat<Q>::Identity(dk, dk);
  require_equal(kla::ref::wy_P<Q>(in, prefix, f, gam, 0), P, "P_0 and I");
  for (Idx i = 1; i <= C; ++i) {
    const Idx t = prefix + i - 1;
    RC_ASSERT(f.beta(i - 1) == oracle::beta(in, t, opt));
    P = oracle::transition(in.decay(t), in.k.row(t).transpose(), oracle::beta(in, t, opt)) * P;
    require_equal(kla::ref::wy_P<Q>(in, prefix, f, gam, i), P, "WY P_i and the explicit product");
  }
}
