// grad.adjoint — SPEC §8 (backward pass): the gradients of recurrent_backward are the adjoint of
// the forward's derivative. For upstream gradients dO, dS_T and any direction δ over every input
// (q, k, v, α, η, S_0),
//   ⟨dO, J_O·δ⟩ + ⟨dS_T, J_S·δ⟩ = ⟨∇q, δq⟩ + ⟨∇k, δk⟩ + ⟨∇v, δv⟩ + ⟨∇α, δα⟩ + ⟨∇η, δη⟩ + ⟨∇S_0,
//   δS_0⟩
// exactly. J·δ is the tangent of recurrent_forward run over dual numbers (kla/ref/dual.hpp), so
// no finite difference and no tolerance enters. Both coefficient modes, the scale read-out (the
// q l2-norm needs sqrt), decay absent, scalar or per channel, keys with the k = 0 corner (where
// the forward's β = 0 branch is differentiated as the constant it is).
#include "generators.hpp"
#include "oracle.hpp"
#include "statement.hpp"

using namespace kla::proofs;

namespace {

using D = kla::ref::Dual<Q>;

Mat<D> dual(const Mat<Q>& value, const Mat<Q>& tangent) {
  return kla::ref::make_dual<Q>(value, tangent);
}

}  // namespace

KLA_STATEMENT("grad.adjoint", "SPEC 8 (backward pass)") {
  const Idx dk = dim(8), dv = dim(8);
  const Idx T = uniform(1, 12);
  const auto in = head_inputs(T, dk, dv, any_decay());
  const auto opt = options();
  const bool zero_state = *rc::gen::element(false, false, false, true);
  const Mat<Q> S0 = zero_state ? Mat<Q>(Mat<Q>::Zero(dk, dv)) : Mat<Q>(*matrix(dk, dv));
  kla::ref::HeadOutputs<Q> up;
  up.o = *matrix(T, dv);
  up.state = *rc::gen::element(false, false, true) ? Mat<Q>(Mat<Q>::Zero(dk, dv))
                                                   : Mat<Q>(*matrix(dk, dv));

  // The direction δ, over every input.
  kla::ref::HeadInputs<Q> dir;
  dir.q = *matrix(T, dk);
  dir.k = *matrix(T, dk);
  dir.v = *matrix(T, dv);
  dir.eta = *vector(T);
  dir.alpha = *matrix(in.alpha.rows(), in.alpha.cols());
  const Mat<Q> dS0 = *matrix(dk, dv);

  // J·δ by forward mode over Dual<Q>.
  kla::ref::HeadInputs<D> ind;
  ind.q = dual(in.q, dir.q);
  ind.k = dual(in.k, dir.k);
  ind.v = dual(in.v, dir.v);
  ind.eta = dual(in.eta, dir.eta);
  ind.alpha = dual(in.alpha, dir.alpha);
  kla::ref::Options<D> optd;
  optd.eps = opt.eps;
  optd.coefficient = opt.coefficient;
  optd.readout = opt.readout;
  optd.scale = opt.scale;
  const auto fwd = kla::ref::recurrent_forward<D>(ind, optd, dual(S0, dS0));

  // The forward over duals computes what it computes over Q (values), plus the derivative.
  const auto plain = kla::ref::recurrent_forward<Q>(in, opt, S0);
  require_equal(kla::ref::value_part<Q>(fwd.o), plain.o, "dual and rational outputs");
  require_equal(kla::ref::value_part<Q>(fwd.state), plain.state, "dual and rational states");

  const auto g = kla::ref::recurrent_backward<Q>(in, opt, S0, up);
  const Q lhs = oracle::frobenius(up.o, kla::ref::tangent_part<Q>(fwd.o)) +
                oracle::frobenius(up.state, kla::ref::tangent_part<Q>(fwd.state));
  const Q rhs = oracle::frobenius(g.q, dir.q) + oracle::frobenius(g.k, dir.k) +
                oracle::frobenius(g.v, dir.v) + Q(g.eta.dot(dir.eta)) +
                oracle::frobenius(g.alpha, dir.alpha) + oracle::frobenius(g.state, dS0);
  if (lhs != rhs) {
    std::ostringstream os;
    os << "<dO, J d> + <dS_T, J_S d> = " << lhs << " but <grad, d> = " << rhs;
    RC_FAIL(os.str());
  }
}
