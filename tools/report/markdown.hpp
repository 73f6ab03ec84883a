// The Markdown of report.md: a section (title, finding, body) and the pieces its body is made
// of (tables, images, comma-joined lists).
#pragma once

#include <string>
#include <vector>

namespace kla::report {

/// One section of report.md: its finding is computed from the numbers and also opens the
/// report's list of findings.
struct Section {
  std::string title, finding, body;
};

/// A table with a left-aligned first column and right-aligned others; a bare '|' in a cell (as
/// in |k|) is escaped so that it does not end the cell.
std::string md_table(const std::vector<std::string>& head,
                     const std::vector<std::vector<std::string>>& rows);

/// An image paragraph.
std::string image(const std::string& png, const std::string& alt);

/// The items of v separated by sep.
std::string join(const std::vector<std::string>& v, const std::string& sep);

}  // namespace kla::report
