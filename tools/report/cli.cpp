// Command line of kla_report (see cli.hpp).
#include "report/cli.hpp"

#include <algorithm>
#include <iostream>
#include <thread>

namespace kla::report {

namespace {

void usage_text(std::ostream& os) {
  os << "usage: kla_report [options]\n"
        "Writes the precision / eps sensitivity report (Markdown + CSV + PNG) of KLA.\n"
        "  --out DIR        output directory (default docs/report; replaced atomically)\n"
        "  --seed N         base seed of every random input (default 20250101)\n"
        "  --quick          tiny sweep for smoke tests (seconds)\n"
        "  --full           larger sweep: longer sequences, dk = dv = 32 (about 4x the default)\n"
        "  --dk N, --dv N   head sizes of the sweeps of sections 2, 3, 5, 6, 7 (default 16)\n"
        "  --max-len N      longest sequence of section 4 (default 65536, quick 1024)\n"
        "  --long-dim N     head size (dk = dv) of section 4 (default 8)\n"
        "  --threads N      worker threads (default: all cores)\n"
        "  --no-plots       skip the PNG plots (the report says so)\n"
        "  --python PATH    Python with matplotlib for the plots (default /usr/bin/python3)\n"
        "  --help           this text\n";
}

[[noreturn]] void bad_usage(const std::string& msg) {
  throw UsageError(msg);
}

long parse_int(const std::string& opt, const std::string& s, long lo, long hi) {
  try {
    size_t pos = 0;
    const long v = std::stol(s, &pos);
    if (pos != s.size() || v < lo || v > hi) throw std::out_of_range(s);
    return v;
  } catch (const std::exception&) {
    bad_usage(opt + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
              "], got '" + s + "'");
  }
}

}  // namespace

void usage(std::ostream& os) {
  usage_text(os);
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Config parse(int argc, const char* const* argv) {
  Config c;
  bool dk_set = false, dv_set = false;
  for (int i = 0; i < argc; ++i) {
    if (i) c.command += ' ';
    c.command += shell_quote(argv[i]);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      c.help = true;
      return c;
    } else if (a == "--out") {
      c.out = value();
      if (c.out.empty()) bad_usage("--out needs a non-empty directory");
    } else if (a == "--seed") {
      c.seed = std::uint64_t(parse_int(a, value(), 0, 1L << 62));
    } else if (a == "--quick") {
      c.quick = true;
    } else if (a == "--full") {
      c.full = true;
    } else if (a == "--dk") {
      c.dk = int(parse_int(a, value(), 1, 256));
      dk_set = true;
    } else if (a == "--dv") {
      c.dv = int(parse_int(a, value(), 1, 256));
      dv_set = true;
    } else if (a == "--max-len") {
      c.max_len = int(parse_int(a, value(), 64, 1 << 22));
    } else if (a == "--long-dim") {
      c.long_dim = int(parse_int(a, value(), 1, 256));
    } else if (a == "--threads") {
      c.threads = int(parse_int(a, value(), 1, 1024));
    } else if (a == "--no-plots") {
      c.plots = false;
    } else if (a == "--python") {
      c.python = value();
    } else {
      bad_usage("unknown option '" + a + "'");
    }
  }
  if (c.quick && c.full) bad_usage("--quick and --full exclude each other");
  if (c.quick) {
    if (!dk_set) c.dk = 8;
    if (!dv_set) c.dv = 8;
    c.t_sweep = 48;
    c.t_defect = 6;
    c.t_forms = 128;
    c.t_stress = 128;
    c.t_contraction = 48;
    c.knorms = {1e-4, 1e-2, 1, 100};
    c.chunks = {16, 64};
    if (!c.max_len) c.max_len = 1024;
    if (!c.long_dim) c.long_dim = 4;
  } else if (c.full) {
    if (!dk_set) c.dk = 32;
    if (!dv_set) c.dv = 32;
    c.t_sweep = 1024;
    c.t_defect = 32;
    c.t_forms = 4096;
    c.t_stress = 2048;
    c.t_contraction = 1024;
    if (!c.long_dim) c.long_dim = 16;
  }
  if (!c.max_len) c.max_len = 65536;
  if (!c.long_dim) c.long_dim = 8;
  if (!c.threads) c.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  return c;
}

}  // namespace kla::report
