// prop3.chunk_system — Proposition 3, eq. (chunk_system), proof in Appendix B: the chunk matrix
// I + B(A⁻∘KKᵀ) is unit lower-triangular and equals the one written out here (per-channel decay
// included), and the forward-substituted U solves the system and equals ū_r = u_r − S_0ᵀ w_r
// from the w/u recurrences (eqs. w_recursion, u_recursion, combined_wy) computed in this test.
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("prop3.chunk_system", "Proposition 3, eq. chunk_system") {
  const Idx dk = dim(), dv = dim();
  const Idx prefix = uniform(0, 2), C = uniform(1, 12);
  const auto in =
      head_inputs(prefix + C, dk, dv,
                  *rc::gen::element(DecayKind::scalar, DecayKind::diagonal, DecayKind::none));
  const auto opt = options();
  const Mat<Q> S0 = *matrix(dk, dv);
  const kla::ref::DecayTable<Q> gam(in, prefix, C);
  const auto sys = kla::ref::chunk_system<Q>(in, opt, S0, prefix, C, gam);

  // Unit lower-triangular.
  for (Idx i = 0; i < C; ++i) {
    RC_ASSERT(sys.matrix(i, i) == Q(1));
    for (Idx j = i + 1; j < C; ++j) RC_ASSERT(sys.matrix(i, j) == Q(0));
  }

  // The system written out: L_ij = β_i k_iᵀ diag(γ_i/γ_j) k_j (j < i), rhs_i = β_i(v_i − S_0ᵀγ_i
  // k_i).
  Mat<Q> M = Mat<Q>::Identity(C, C), R(C, dv);
  Vec<Q> beta(C);
  for (Idx i = 1; i <= C; ++i) {
    const Idx t = prefix + i - 1;
    const Vec<Q> ki = in.k.row(t).transpose();
    beta(i - 1) = oracle::beta(in, t, opt);
    for (Idx j = 1; j < i; ++j)
      M(i - 1, j - 1) += beta(i - 1) * ki.cwiseProduct(oracle::decay_between(in, prefix, j, i))
                                           .dot(in.k.row(prefix + j - 1).transpose());
    const Vec<Q> pred = S0.transpose() * oracle::decay_between(in, prefix, 0, i).cwiseProduct(ki);
    R.row(i - 1) = (beta(i - 1) * (in.v.row(t).transpose() - pred)).transpose();
  }
  require_equal(sys.beta, beta, "beta");
  require_equal(sys.matrix, M, "chunk matrix and I + B(A- o KK^T)");
  require_equal(sys.rhs, R, "chunk rhs and B(V - D_gamma K S0)");

  const Mat<Q> U = kla::ref::forward_substitution<Q>(sys.matrix, sys.rhs);
  require_equal(sys.matrix * U, sys.rhs, "M U and rhs");

  // w/u recurrences of Propositions wy_P / wy_H, then ū = u − S_0ᵀ w.
  Mat<Q> w(C, dk), u(C, dv);
  for (Idx i = 1; i <= C; ++i) {
    const Vec<Q> ki = in.k.row(prefix + i - 1).transpose();
    Vec<Q> wi = oracle::decay_between(in, prefix, 0, i).cwiseProduct(ki);
    Vec<Q> ui = in.v.row(prefix + i - 1).transpose();
    for (Idx r = 1; r < i; ++r) {
      const Q c = in.k.row(prefix + r - 1)
                      .transpose()
                      .cwiseProduct(oracle::decay_between(in, prefix, r, i))
                      .dot(ki);
      wi -= c * w.row(r - 1).transpose();
      ui -= c * u.row(r - 1).transpose();
    }
    w.row(i - 1) = (beta(i - 1) * wi).transpose();
    u.row(i - 1) = (beta(i - 1) * ui).transpose();
  }
  const Mat<Q> ubar = u - w * S0;
  require_equal(U, ubar, "U and u - S0^T w");
  const auto f = kla::ref::wy_factors<Q>(in, opt, prefix, C, gam);
  require_equal(f.u - f.w * S0, ubar, "reference WY u-bar and u - S0^T w");
}
