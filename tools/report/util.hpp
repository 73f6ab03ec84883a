// Small utilities of the precision report: error metrics and summaries, number formatting, CSV
// output, a thread pool loop and a progress line on stderr.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kla::report {

/// Relative RMS error ‖x − ref‖/‖ref‖ over entries [0, n) (the whole vector by default), and the
/// number of non-finite entries of x. Non-finite entries make the error infinite: a column that
/// produced NaN/Inf is never reported as accurate.
struct ErrorStat {
  double rel = 0;
  long nonfinite = 0;
};
inline ErrorStat rel_rms(const std::vector<double>& x, const std::vector<double>& ref,
                         size_t n = size_t(-1)) {
  n = std::min({n, x.size(), ref.size()});
  ErrorStat s;
  long double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      ++s.nonfinite;
      continue;
    }
    const long double d = (long double)x[i] - ref[i];
    num += d * d;
    den += (long double)ref[i] * ref[i];
  }
  if (s.nonfinite)
    s.rel = INFINITY;
  else if (den == 0)
    s.rel = num == 0 ? 0.0 : INFINITY;
  else
    s.rel = double(std::sqrt(num / den));
  return s;
}

/// Whether every entry of x is finite.
inline bool all_finite(const std::vector<double>& x) {
  return std::all_of(x.begin(), x.end(), [](double y) { return std::isfinite(y); });
}

/// Geometric mean (NaN for none; the entries must be positive).
inline double geomean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / double(v.size()));
}

/// Median, the upper one of an even count (NaN for none).
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Short human form of a number: 3 significant digits, "NaN/Inf" for non-finite values.
inline std::string fmt(double x, int digits = 2) {
  if (!std::isfinite(x)) return "NaN/Inf";
  if (x == 0) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}
/// Full-precision CSV form ("nan"/"inf" for non-finite values, which Python's float() reads).
inline std::string num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}
/// An eps or key-norm value as the report writes it: 0, 1e-06, 0.01, 100.
inline std::string eps_str(double x) {
  if (x == 0) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

class Csv {
 public:
  Csv(const std::string& path, const std::vector<std::string>& header) : f_(path) {
    if (!f_) throw std::runtime_error("cannot write " + path);
    row(header);
  }
  /// Cells with a comma or quote are quoted (RFC 4180), so labels may contain them.
  void row(const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      f_ << (i ? "," : "");
      if (cells[i].find_first_of(",\"") == std::string::npos) {
        f_ << cells[i];
        continue;
      }
      f_ << '"';
      for (char c : cells[i]) f_ << (c == '"' ? "\"\"" : std::string(1, c));
      f_ << '"';
    }
    f_ << "\n";
  }

 private:
  std::ofstream f_;
};

/// Progress of one section on stderr: at most one line every 3 s, plus a final line.
class Progress {
 public:
  Progress(std::string label, double total)
      : label_(std::move(label)),
        total_(total > 0 ? total : 1),
        start_(clock::now()),
        last_(start_) {}
  void add(double work) {
    std::lock_guard<std::mutex> lock(m_);
    done_ += work;
    const auto now = clock::now();
    if (std::chrono::duration<double>(now - last_).count() < 3.0) return;
    last_ = now;
    const double el = std::chrono::duration<double>(now - start_).count();
    const double frac = std::min(1.0, done_ / total_);
    std::fprintf(stderr, "[kla_report] %-34s %3.0f%%  %5.1f s elapsed, ETA %.0f s\n",
                 label_.c_str(), 100 * frac, el, frac > 0 ? el * (1 - frac) / frac : 0.0);
  }
  double finish() {
    const double el = std::chrono::duration<double>(clock::now() - start_).count();
    std::fprintf(stderr, "[kla_report] %-34s done in %.1f s\n", label_.c_str(), el);
    return el;
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string label_;
  double total_, done_ = 0;
  clock::time_point start_, last_;
  std::mutex m_;
};

/// Runs fn(i) for i in [0, n) on `threads` threads; items are taken in index order, so callers
/// put the most expensive items first. The first exception is rethrown after all threads stop.
inline void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::mutex m;
  auto worker = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!err) err = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace kla::report
