// kla_params -> KernelParams (api/translate.hpp). Pure host arithmetic.
#include "api/translate.hpp"

#include <cmath>

#include "layout/chunk_geometry.hpp"

namespace kla::detail {

kernels::KernelParams translate(const kla_params& p, const plan::Plan& plan) {
  kernels::KernelParams k{};
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.o = p.o;
  for (int d = 0; d < 3; ++d) {
    k.qs[d] = p.q_strides[d];
    k.ks[d] = p.k_strides[d];
    k.vs[d] = p.v_strides[d];
    k.os[d] = p.o_strides[d];
  }
  k.g = p.g;
  k.eta = p.eta;
  for (int d = 0; d < 2; ++d) {
    k.gs[d] = p.g_strides[d];
    k.es[d] = p.eta_strides[d];
  }
  k.eta_value = p.eta_value;
  k.eps = p.eps;
  k.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(p.head_dim_k));
  k.kaczmarz = p.coefficient == KLA_COEFF_KACZMARZ;
  k.l2norm = p.readout == KLA_READOUT_Q_L2NORM ? 1 : p.readout == KLA_READOUT_QK_L2NORM ? 2 : 0;
  k.s_in = p.initial_state;
  k.s_out = p.final_state;
  k.pool = p.state_pool;
  k.indices = p.state_pool ? p.state_indices : nullptr;
  k.cu_seqlens = p.cu_seqlens;
  k.N = int(plan.num_seqs);
  k.T = int(p.seq_len);
  k.H = int(p.num_heads);
  k.HV = int(p.num_v_heads);
  k.K = int(p.head_dim_k);
  k.V = int(p.head_dim_v);
  k.ws = static_cast<float*>(p.workspace);
  k.ws_record_floats = layout::ws_record_bytes(p.head_dim_k, p.head_dim_v) / 4;
  k.max_chunks = int(plan.max_chunks);
  // The K / Q images follow the records (kla_workspace_size's layout).
  k.ws_images =
      p.workspace && plan.prep_images
          ? static_cast<char*>(p.workspace) +
                layout::ws_records_bytes(plan.num_seqs, p.seq_len, p.cu_seqlens != nullptr,
                                         p.num_v_heads, p.head_dim_k, p.head_dim_v)
          : nullptr;
  return k;
}

}  // namespace kla::detail
