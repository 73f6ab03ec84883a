// The Markdown of report.md (see markdown.hpp).
#include "report/markdown.hpp"

#include <sstream>

namespace kla::report {

namespace {

/// A Markdown table cell: a bare '|' (as in |k|) would end the cell, so it is escaped.
std::string md_cell(const std::string& c) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == '|' && (i == 0 || c[i - 1] != '\\')) out += '\\';
    out += c[i];
  }
  return out;
}

}  // namespace

std::string md_table(const std::vector<std::string>& head,
                     const std::vector<std::vector<std::string>>& rows) {
  std::ostringstream os;
  os << "|";
  for (const auto& h : head) os << " " << md_cell(h) << " |";
  os << "\n|";
  for (size_t i = 0; i < head.size(); ++i) os << (i ? "---:|" : "---|");
  os << "\n";
  for (const auto& r : rows) {
    os << "|";
    for (const auto& c : r) os << " " << md_cell(c) << " |";
    os << "\n";
  }
  return os.str();
}

std::string image(const std::string& png, const std::string& alt) {
  return "![" + alt + "](" + png + ")\n\n";
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

}  // namespace kla::report
