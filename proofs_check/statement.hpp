// A checked statement of the paper (SPEC §2): an id, where the paper states it, and a
// RapidCheck property. Each statement lives in its own file named by its id and registers
// itself here; `proofs_check` runs the registry.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kla::proofs {

struct Statement {
  std::string id;                  ///< SPEC §2 id, e.g. "thm1.projection"
  std::string paper;               ///< where the paper states it
  std::function<void()> property;  ///< nullary RapidCheck property (draws with *gen)
};

inline std::vector<Statement>& registry() {
  static std::vector<Statement> r;
  return r;
}

struct Registration {
  explicit Registration(Statement s) { registry().push_back(std::move(s)); }
};

}  // namespace kla::proofs

#define KLA_PROOF_CONCAT2(a, b) a##b
#define KLA_PROOF_CONCAT(a, b) KLA_PROOF_CONCAT2(a, b)
/// KLA_STATEMENT("thm1.constraint", "Theorem 1") { ...property body... }
/// Names come from __COUNTER__ so several statement files can share one unity-build TU.
#define KLA_STATEMENT(ID, PAPER) KLA_STATEMENT_IMPL(ID, PAPER, __COUNTER__)
#define KLA_STATEMENT_IMPL(ID, PAPER, N)                                               \
  static void KLA_PROOF_CONCAT(kla_statement_body_, N)();                              \
  static const ::kla::proofs::Registration KLA_PROOF_CONCAT(kla_statement_reg_, N){    \
      ::kla::proofs::Statement{ID, PAPER, &KLA_PROOF_CONCAT(kla_statement_body_, N)}}; \
  static void KLA_PROOF_CONCAT(kla_statement_body_, N)()
