// What the sections ask of the report's columns as a whole: which expose a per-token trace,
// which are kernels and which CPU column models each kernel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "report/common.hpp"

namespace kla::report {

/// The report's columns in report order (make_backends).
using Backends = std::vector<std::unique_ptr<Backend>>;

/// The columns that expose a per-token trace (the per-token sections 3 and 7 use these).
std::vector<const Backend*> traced(const Backends& bk);

/// b's per-token trace of p; throws when b declines the trace it offers (has_trace()).
std::vector<TokenRecord> trace_of(const Backend& b, const Problem& p, double eps);

/// The columns' notes on how their per-token traces are obtained (once each), and which columns
/// the per-token sections leave out for want of one: Markdown paragraphs.
std::string trace_notes(const Backends& bk);

/// The CPU column that models kernel column `b` (Backend::model_id), or nullptr.
const Backend* model_of(const Backends& bk, const Backend& b);

/// Whether any column is a kernel column (one with a CPU model): the CUDA columns.
bool has_kernels(const Backends& bk);

}  // namespace kla::report
