// The report's random problems: the settings a section draws its inputs with, and the drawing
// itself, a pure function of the settings and a seed (so every number can be reproduced).
#pragma once

#include <cstdint>

#include "report/common.hpp"

namespace kla::report {

/// How a problem's inputs are drawn. Key directions are Gaussian (or correlated with one shared
/// direction), key norms log-uniform in [knorm_lo, knorm_hi], v ~ N(0,1), q a unit vector (the
/// read-out is o = Sᵀq with scale 1, i.e. the paper's l2-normalised query without the rounding
/// of 1/‖q‖), η uniform in [eta_lo, eta_hi], α uniform in [alpha_lo, alpha_hi] (none if
/// alpha_lo == 1 == alpha_hi).
struct Draw {
  int T = 256, dk = 16, dv = 16;
  double knorm_lo = 1, knorm_hi = 1;
  double eta_lo = 0.1, eta_hi = 1.0;
  double alpha_lo = 0.98, alpha_hi = 1.0;
  double correlation = 0;  ///< weight of the shared key direction (0 = independent keys)
};

/// The problem of settings d and seed `seed`, in fp64 (not yet rounded to a storage dtype).
Problem draw(const Draw& d, std::uint64_t seed);

/// Draw around a nominal key norm: log-uniform within a factor sqrt(2) either side.
Draw around(int T, int dk, int dv, double knorm);

}  // namespace kla::report
