// Command line of kla_report, separate from the program so it can be fuzzed (fuzz/) and tested.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

namespace kla::report {

/// Bad usage: the message names the option; the program prints it with usage() and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Config {
  std::string out = "docs/report";
  std::uint64_t seed = 20250101;
  bool quick = false, full = false, plots = true;
  int dk = 16, dv = 16;
  int threads = 0;
  int max_len = 0;   // §4 longest sequence (0 = preset)
  int long_dim = 0;  // §4 head size (0 = preset)
  std::string python = "/usr/bin/python3";
  std::string plot_script;  ///< empty: tools/plot_report.py of the source tree
  std::string command;
  bool help = false;  ///< --help: print usage() and exit 0
  // Sizes, set from the preset (quick / default / full).
  int t_sweep = 512, t_defect = 16, t_forms = 2048, t_stress = 512, t_contraction = 256;
  std::vector<double> eps_list = {0, 1e-12, 1e-9, 1e-6, 1e-4, 1e-3, 1e-2};
  std::vector<double> knorms = {1e-4, 1e-3, 1e-2, 1e-1, 1, 10, 100};
  std::vector<int> chunks = {16, 32, 64, 128};
};

void usage(std::ostream& os);
/// s quoted for a POSIX shell (unchanged when it has no special characters).
std::string shell_quote(const std::string& s);
/// Parses argv (argv[0] is the program). Throws UsageError on any bad option or value.
Config parse(int argc, const char* const* argv);

}  // namespace kla::report
