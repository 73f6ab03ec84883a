// Fuzz target 4: the command line of kla_report (tools/report/cli.cpp). The bytes are split at
// NUL into argv[1..]. parse() must either return a Config whose values lie in the documented
// ranges or throw UsageError; any other exception, crash or sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "report/cli.hpp"

namespace {
void require(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"kla_report"};
  std::string cur;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    const kla::report::Config c = kla::report::parse(static_cast<int>(argv.size()), argv.data());
    if (c.help) return 0;
    require(!c.out.empty());
    require(c.dk >= 1 && c.dk <= 256 && c.dv >= 1 && c.dv <= 256);
    require(c.max_len >= 64 && c.max_len <= (1 << 22));
    require(c.long_dim >= 1 && c.long_dim <= 256);
    require(c.threads >= 1);
    require(!(c.quick && c.full));
    require(!c.command.empty());
  } catch (const kla::report::UsageError&) {
    // The documented outcome of bad usage.
  }
  return 0;
}
