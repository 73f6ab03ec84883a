// What the sections ask of the report's columns as a whole (see columns.hpp).
#include "report/columns.hpp"

#include <set>
#include <stdexcept>

#include "report/markdown.hpp"

namespace kla::report {

std::vector<const Backend*> traced(const Backends& bk) {
  std::vector<const Backend*> out;
  for (const auto& b : bk)
    if (b->has_trace()) out.push_back(b.get());
  return out;
}

std::vector<TokenRecord> trace_of(const Backend& b, const Problem& p, double eps) {
  auto tr = b.trace(p, eps);
  if (!tr) throw std::logic_error(b.id() + " declined the trace it offers");
  return std::move(*tr);
}

std::string trace_notes(const Backends& bk) {
  std::string out;
  std::set<std::string> seen;
  std::vector<std::string> none;
  for (const auto& b : bk) {
    if (!b->has_trace()) none.push_back(b->id());
    const std::string n = b->has_trace() ? b->trace_note() : "";
    if (!n.empty() && seen.insert(n).second) out += n + "\n\n";
  }
  if (!none.empty()) out += "Left out (no per-token state exposed): " + join(none, ", ") + ".\n\n";
  return out;
}

const Backend* model_of(const Backends& bk, const Backend& b) {
  if (b.model_id().empty()) return nullptr;
  for (const auto& c : bk)
    if (c->id() == b.model_id()) return c.get();
  return nullptr;
}

bool has_kernels(const Backends& bk) {
  for (const auto& b : bk)
    if (!b->model_id().empty()) return true;
  return false;
}

}  // namespace kla::report
