// The report's random problems (see problems.hpp).
#include "report/problems.hpp"

#include <cmath>
#include <random>
#include <vector>

namespace kla::report {

Problem draw(const Draw& d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> N(0, 1);
  std::uniform_real_distribution<double> U(0, 1);
  Problem p;
  p.T = d.T;
  p.dk = d.dk;
  p.dv = d.dv;
  std::vector<double> shared(size_t(d.dk));
  for (double& x : shared) x = N(rng);
  auto unit = [&](std::vector<double>& x) {
    double n = 0;
    for (double y : x) n += y * y;
    n = std::sqrt(n);
    for (double& y : x) y /= n;
  };
  unit(shared);
  std::vector<double> dir(size_t(d.dk));
  for (int t = 0; t < d.T; ++t) {
    for (int i = 0; i < d.dk; ++i) dir[i] = N(rng) / std::sqrt(double(d.dk));
    for (int i = 0; i < d.dk; ++i) dir[i] += d.correlation * shared[i];
    unit(dir);
    const double norm =
        d.knorm_lo * std::exp(std::log(d.knorm_hi / d.knorm_lo) * U(rng));  // log-uniform
    for (int i = 0; i < d.dk; ++i) p.k.push_back(dir[i] * norm);
    for (int i = 0; i < d.dk; ++i) dir[i] = N(rng);
    unit(dir);
    for (int i = 0; i < d.dk; ++i) p.q.push_back(dir[i]);
    for (int j = 0; j < d.dv; ++j) p.v.push_back(N(rng));
    p.eta.push_back(d.eta_lo + (d.eta_hi - d.eta_lo) * U(rng));
    if (!(d.alpha_lo == 1.0 && d.alpha_hi == 1.0))
      p.alpha.push_back(d.alpha_lo + (d.alpha_hi - d.alpha_lo) * U(rng));
  }
  return p;
}

Draw around(int T, int dk, int dv, double knorm) {
  Draw d;
  d.T = T;
  d.dk = dk;
  d.dv = dv;
  d.knorm_lo = knorm / std::sqrt(2.0);
  d.knorm_hi = knorm * std::sqrt(2.0);
  return d;
}

}  // namespace kla::report
