// wy.H — Proposition wy_H (Appendix B, eqs. H_wy, u_recursion) and eq. (combined_wy), state form:
// H_i = Σ_{r≤i} Γ(i,r) k_r u_rᵀ equals the explicit sum Σ_{j≤i} [Π_{j<s≤i} (I − β_s k_s k_sᵀ) D_s]
// β_j k_j v_jᵀ, and S_i = Γ(i,0) S_0 + Σ Γ(i,r) k_r ū_rᵀ equals the tokenwise state, every i.
#include <vector>

#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("wy.H", "Proposition wy_H, eq. H_wy") {
  const Idx dk = dim(), dv = dim();
  const Idx prefix = uniform(0, 2), C = uniform(1, 10);
  const auto in =
      head_inputs(prefix + C, dk, dv,
                  *rc::gen::element(DecayKind::scalar, DecayKind::diagonal, DecayKind::none));
  const auto opt = options();
  const Mat<Q> S0 = *matrix(dk, dv);
  const kla::ref::DecayTable<Q> gam(in, prefix, C);
  const auto f = kla::ref::wy_factors<Q>(in, opt, prefix, C, gam);
  const auto S = oracle::states(in, opt, prefix, C, S0);

  std::vector<Mat<Q>> trans;  // trans[s-1] = (I − β_s k_s k_sᵀ) D_s
  for (Idx s = 1; s <= C; ++s) {
    const Idx t = prefix + s - 1;
    trans.push_back(
        oracle::transition(in.decay(t), in.k.row(t).transpose(), oracle::beta(in, t, opt)));
  }
  for (Idx i = 0; i <= C; ++i) {
    Mat<Q> H = Mat<Q>::Zero(dk, dv);
    for (Idx j = 1; j <= i; ++j) {
      const Idx t = prefix + j - 1;
      Vec<Q> x = oracle::beta(in, t, opt) * in.k.row(t).transpose();
      for (Idx s = j + 1; s <= i; ++s) x = trans[static_cast<size_t>(s - 1)] * x;
      H += x * in.v.row(t);
    }
    require_equal(kla::ref::wy_H<Q>(in, prefix, f, gam, i), H, "WY H_i and the explicit sum");
    require_equal(kla::ref::wy_state<Q>(in, prefix, f, gam, i, S0), S[static_cast<size_t>(i)],
                  "combined WY S_i and the tokenwise state");
  }
}
