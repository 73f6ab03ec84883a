// grad.normalized_key — SPEC §8 (backward pass through the normalised-key form): with
// r_t = sqrt(‖k_t‖²+ε), k̂ = k/r, v̂ = v/r, KLA's gradients equal GDN's gradients on
// (q, k̂, v̂, β = η, α) pushed through the chain
//   dk = (dk̂ − k̂ (k̂·dk̂ + v̂·dv̂)) / r,   dv = dv̂ / r,   dη = dβ,   dq, dα, dS_0 unchanged,
// exactly (r rational by the construction of ours.normalized_key, keys_with_rational_norms).
// With G = 2 value heads sharing the key head (each its own v, η, α, S_0 and upstream
// gradients), the key gradient is the sum over the value heads and the chain takes the sums.
#include <vector>

#include "generators.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("grad.normalized_key", "SPEC 8 (normalised-key chain)") {
  const Idx dk = dim(8), dv = dim(8);
  const Idx T = uniform(1, 10);
  const Idx heads = uniform(1, 2);
  const DecayKind decay = any_decay();
  auto base = head_inputs(T, dk, dv, decay);
  const auto opt = options(false);
  const Vec<Q> r = keys_with_rational_norms(base, opt.eps);
  auto gdn = opt;
  gdn.coefficient = kla::ref::Coefficient::given;

  Mat<Q> dk_sum = Mat<Q>::Zero(T, dk);
  std::vector<Mat<Q>> dk_hat, v_hat, dv_hat;
  std::vector<kla::ref::HeadGradients<Q>> kla_grads;
  Mat<Q> k_hat;
  for (Idx h = 0; h < heads; ++h) {
    // Value head h: the shared q, k; its own v, η, α, initial state and upstream gradients.
    auto in = head_inputs(T, dk, dv, decay);
    in.q = base.q;
    in.k = base.k;
    const Mat<Q> S0 = *matrix(dk, dv);
    kla::ref::HeadOutputs<Q> up;
    up.o = *matrix(T, dv);
    up.state = *matrix(dk, dv);
    const auto hat = kla::ref::normalize_keys_with<Q>(in, r);
    const auto g_kla = kla::ref::recurrent_backward<Q>(in, opt, S0, up);
    const auto g_gdn = kla::ref::recurrent_backward<Q>(hat, gdn, S0, up);
    require_equal(g_kla.q, g_gdn.q, "KLA and GDN(k^, v^) dq");
    require_equal(g_kla.eta, g_gdn.eta, "KLA d eta and GDN(k^, v^) d beta");
    require_equal(g_kla.alpha, g_gdn.alpha, "KLA and GDN(k^, v^) d alpha");
    require_equal(g_kla.state, g_gdn.state, "KLA and GDN(k^, v^) dS_0");
    if (heads == 1) {
      const auto chained = kla::ref::kla_gradients_from_normalized<Q>(hat, r, g_gdn);
      require_equal(g_kla.k, chained.k, "KLA dk and the chain of GDN(k^, v^)'s");
      require_equal(g_kla.v, chained.v, "KLA dv and the chain of GDN(k^, v^)'s");
    }
    k_hat = hat.k;
    dk_sum += g_kla.k;
    dk_hat.push_back(g_gdn.k);
    v_hat.push_back(hat.v);
    dv_hat.push_back(g_gdn.v);
    kla_grads.push_back(g_kla);
  }
  const auto chain = kla::ref::key_l2norm_chain<Q>(k_hat, r, dk_hat, v_hat, dv_hat);
  require_equal(dk_sum, chain.dk, "KLA dk summed over value heads and the grouped chain");
  for (Idx h = 0; h < heads; ++h)
    require_equal(kla_grads[static_cast<size_t>(h)].v, chain.dv[static_cast<size_t>(h)],
                  "KLA dv and the grouped chain's");
}
