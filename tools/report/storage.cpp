// Storage dtypes of the report's problems (common.hpp): names, rounding, and a problem rounded
// to its storage. Shared by every column, the CPU reference ones, the arithmetic models and the
// CUDA columns' test alike.
#include <Eigen/Core>
#include <cfloat>
#include <cmath>

#include "common.hpp"

namespace kla::report {

std::string storage_name(Storage s) {
  switch (s) {
    case Storage::fp64: return "fp64";
    case Storage::fp32: return "fp32";
    case Storage::bf16: return "bf16";
    case Storage::fp16: return "fp16";
  }
  return "?";
}

double round_to(Storage s, double x) {
  switch (s) {
    case Storage::fp64: return x;
    // Via float: double rounding differs from direct rounding only on exact ties of the 24-bit
    // intermediate, which random data does not hit in practice; all columns share the values.
    case Storage::fp32: return double(float(x));
    case Storage::bf16: return double(float(Eigen::bfloat16(float(x))));
    case Storage::fp16: return double(float(Eigen::half(float(x))));
  }
  return x;
}

double min_normal(Storage s) {
  switch (s) {
    case Storage::fp64: return DBL_MIN;
    case Storage::fp32:
    case Storage::bf16: return FLT_MIN;
    case Storage::fp16: return std::ldexp(1.0, -14);
  }
  return 0;
}

Problem Problem::rounded(Storage s) const {
  Problem r = *this;
  for (auto* vec : {&r.q, &r.k, &r.v, &r.eta, &r.alpha})
    for (double& x : *vec) x = round_to(s, x);
  return r;
}

}  // namespace kla::report
