// Test-only fault injection. The proof checks must be able to fail: with KLA_REF_MUTANTS
// defined, a global switch plants one fault into the reference, and `proofs_check --mutants`
// (ctest proofs.mutants) runs every statement against every fault. Without the macro the switch
// is a compile-time constant and every hook folds away.
//
// Two kinds of fault. The four of SPEC §2 are gross: they break the coefficient or the decay
// bookkeeping that nearly every statement goes through. The others are each aimed at one
// statement's own claim (a projection, a multiplier, μ, a contraction factor, the chunk system,
// a WY sum, a read-out, a key normalisation, a backward-pass term...), planted where that claim's
// code path runs, so that deleting or weakening that statement's check shows:
// proofs_check/main.cpp's ownership table says which statement owns which fault,
// proofs_check/README.md shows the matrix.
#pragma once

#include <array>
#include <string_view>

namespace kla::ref {

enum class Mutant {
  none,
  // SPEC §2 (gross).
  gdn_coefficient,   ///< β = η (GDN) where Kaczmarz asks for η/(‖k‖²+ε)
  eps_dropped,       ///< β = η/‖k‖²
  gamma_off_by_one,  ///< decay ratio γ_i/γ_j taken over tokens j..i instead of j+1..i
  nonstrict_mask,    ///< chunk system uses A (diagonal included) instead of A⁻
  // Aimed at one statement each (the owner is in proofs_check/main.cpp).
  residual_undecayed,   ///< token_step: e = v − Sᵀk read before the decay, S̃ + βk eᵀ
  project_undecayed,    ///< token_step: S + βk(v − Sᵀk)ᵀ, the projection of S, not of S̃
  multiplier_sign,      ///< token_step: S̃ − βk eᵀ (multiplier λ = +e/‖k‖²)
  decay_after_update,   ///< token_step: D(S + βk(v − Sᵀk)ᵀ), the decay after the write
  loss_half_dropped,    ///< token_loss: ‖Sᵀk − v‖² without the ½
  trace_residual_sign,  ///< token_step's trace reports S̃ᵀk − v as the residual
  gradient_sign,        ///< token_loss_gradient: k(v − Sᵀk)ᵀ
  projection_residual_sign,  ///< exact_projection: S̃ − k eᵀ/‖k‖²
  proximal_mu,               ///< proximal_weight: μ = η/(‖k‖²+ε) (the Kaczmarz β)
  contraction_eps_dropped,   ///< contraction_factor: 1 − η (‖k‖²/(‖k‖²+ε) taken as 1)
  chunk_mask_upper,          ///< chunk system: causal mask missing above the diagonal
  chunk_beta_right,          ///< chunk system: I + (A⁻∘KKᵀ)B, β_j instead of β_i
  chunk_out_strict_mask,     ///< chunk output: (A⁻∘QKᵀ)U, the diagonal j = i left out
  readout_scale_ignored,     ///< read-out o = Sᵀq, opt.scale ignored (both forms)
  gate_channel_reversed,     ///< chunk state carry: per-channel γ_C/γ_j in reverse channel order
  wy_P_sum_range,            ///< wy_P: Σ over r < i instead of r ≤ i
  wy_H_undecayed,            ///< wy_H: Σ k_r u_rᵀ without the decay ratio Γ(i,r)
  value_unnormalized,        ///< normalize_keys_with: k̂ = k/r but v̂ = v (not v/r)
  // Backward pass (grad.hpp, grad_chunk.hpp).
  grad_carry_undecayed,  ///< recurrent_backward: ∂ℓ/∂S_{t−1} = ∂ℓ/∂S̃, diag(α_t) left out
  grad_kaczmarz_norm_term,  ///< coefficient_backward: β's dependence on ‖k‖² left out of dk
  grad_decay_one_channel,   ///< scalar decay's dα: channel 0's share, not the channel sum
  grad_chunk_gram_term,  ///< chunk backward: ∂L_ij/∂k_j (the Gram matrix's column key) left out
  grad_chunk_carry_no_gamma,  ///< chunk backward: ∂ℓ/∂S_0 += ∂ℓ/∂S_out without diag(γ_C)
  grad_chain_value_term,      ///< key_l2norm_chain: dk without the −k̂ (v̂·dv̂)/r term
  // Segment maps (segment.hpp, segment_backward.hpp).
  segment_combine_order,  ///< combine: M₁ M₂ where the later segment's M₂ must act last
  segment_grad_fold_untransposed,     ///< fold_gradients: M_r G_r where M_rᵀ G_r belongs
  truncation_certificate_min_decay,   ///< state_gradient_contraction: Π min α, not Π max α
  gradient_bound_decays_own_outputs,  ///< state_gradient_bounds: γ_c (L_c + B_{c+1})
};

inline constexpr std::array<Mutant, 4> gross_mutants = {
    Mutant::gdn_coefficient, Mutant::eps_dropped, Mutant::gamma_off_by_one, Mutant::nonstrict_mask};

inline constexpr std::array<Mutant, 32> all_mutants = {
    Mutant::gdn_coefficient,
    Mutant::eps_dropped,
    Mutant::gamma_off_by_one,
    Mutant::nonstrict_mask,
    Mutant::residual_undecayed,
    Mutant::project_undecayed,
    Mutant::multiplier_sign,
    Mutant::decay_after_update,
    Mutant::loss_half_dropped,
    Mutant::trace_residual_sign,
    Mutant::gradient_sign,
    Mutant::projection_residual_sign,
    Mutant::proximal_mu,
    Mutant::contraction_eps_dropped,
    Mutant::chunk_mask_upper,
    Mutant::chunk_beta_right,
    Mutant::chunk_out_strict_mask,
    Mutant::readout_scale_ignored,
    Mutant::gate_channel_reversed,
    Mutant::wy_P_sum_range,
    Mutant::wy_H_undecayed,
    Mutant::value_unnormalized,
    Mutant::grad_carry_undecayed,
    Mutant::grad_kaczmarz_norm_term,
    Mutant::grad_decay_one_channel,
    Mutant::grad_chunk_gram_term,
    Mutant::grad_chunk_carry_no_gamma,
    Mutant::grad_chain_value_term,
    Mutant::segment_combine_order,
    Mutant::segment_grad_fold_untransposed,
    Mutant::truncation_certificate_min_decay,
    Mutant::gradient_bound_decays_own_outputs,
};

constexpr std::string_view mutant_name(Mutant m) {
  switch (m) {
    case Mutant::none: return "none";
    case Mutant::gdn_coefficient: return "gdn_coefficient";
    case Mutant::eps_dropped: return "eps_dropped";
    case Mutant::gamma_off_by_one: return "gamma_off_by_one";
    case Mutant::nonstrict_mask: return "nonstrict_mask";
    case Mutant::residual_undecayed: return "residual_undecayed";
    case Mutant::project_undecayed: return "project_undecayed";
    case Mutant::multiplier_sign: return "multiplier_sign";
    case Mutant::decay_after_update: return "decay_after_update";
    case Mutant::loss_half_dropped: return "loss_half_dropped";
    case Mutant::trace_residual_sign: return "trace_residual_sign";
    case Mutant::gradient_sign: return "gradient_sign";
    case Mutant::projection_residual_sign: return "projection_residual_sign";
    case Mutant::proximal_mu: return "proximal_mu";
    case Mutant::contraction_eps_dropped: return "contraction_eps_dropped";
    case Mutant::chunk_mask_upper: return "chunk_mask_upper";
    case Mutant::chunk_beta_right: return "chunk_beta_right";
    case Mutant::chunk_out_strict_mask: return "chunk_out_strict_mask";
    case Mutant::readout_scale_ignored: return "readout_scale_ignored";
    case Mutant::gate_channel_reversed: return "gate_channel_reversed";
    case Mutant::wy_P_sum_range: return "wy_P_sum_range";
    case Mutant::wy_H_undecayed: return "wy_H_undecayed";
    case Mutant::value_unnormalized: return "value_unnormalized";
    case Mutant::grad_carry_undecayed: return "grad_carry_undecayed";
    case Mutant::grad_kaczmarz_norm_term: return "grad_kaczmarz_norm_term";
    case Mutant::grad_decay_one_channel: return "grad_decay_one_channel";
    case Mutant::grad_chunk_gram_term: return "grad_chunk_gram_term";
    case Mutant::grad_chunk_carry_no_gamma: return "grad_chunk_carry_no_gamma";
    case Mutant::grad_chain_value_term: return "grad_chain_value_term";
    case Mutant::segment_combine_order: return "segment_combine_order";
    case Mutant::segment_grad_fold_untransposed: return "segment_grad_fold_untransposed";
    case Mutant::truncation_certificate_min_decay: return "truncation_certificate_min_decay";
    case Mutant::gradient_bound_decays_own_outputs: return "gradient_bound_decays_own_outputs";
  }
  return "?";
}

#ifdef KLA_REF_MUTANTS
inline Mutant& active_mutant() {
  static Mutant m = Mutant::none;
  return m;
}
#else
constexpr Mutant active_mutant() {
  return Mutant::none;
}
#endif

}  // namespace kla::ref
