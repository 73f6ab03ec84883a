// Test-only fault injection. The proof checks must be able to fail: with KLA_REF_MUTANTS
// defined, a global switch plants one of the faults of SPEC §2 into the reference, and the
// `proofs.mutants` test demands that some property rejects each of them. Without the macro
// the switch is a compile-time constant and costs nothing.
#pragma once

#include <array>
#include <string_view>

namespace kla::ref {

enum class Mutant {
  none,
  gdn_coefficient,   ///< β = η (GDN) where Kaczmarz asks for η/(‖k‖²+ε)
  eps_dropped,       ///< β = η/‖k‖²
  gamma_off_by_one,  ///< decay ratio γ_i/γ_j taken over tokens j..i instead of j+1..i
  nonstrict_mask,    ///< chunk system uses A (diagonal included) instead of A⁻
};

inline constexpr std::array<Mutant, 4> all_mutants = {
    Mutant::gdn_coefficient, Mutant::eps_dropped, Mutant::gamma_off_by_one, Mutant::nonstrict_mask};

constexpr std::string_view mutant_name(Mutant m) {
  switch (m) {
    case Mutant::none: return "none";
    case Mutant::gdn_coefficient: return "gdn_coefficient";
    case Mutant::eps_dropped: return "eps_dropped";
    case Mutant::gamma_off_by_one: return "gamma_off_by_one";
    case Mutant::nonstrict_mask: return "nonstrict_mask";
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
