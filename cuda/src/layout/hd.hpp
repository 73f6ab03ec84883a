// KLA_HD marks the layout functions that device code also calls at run time (nvcc sees
// __host__ __device__; a host compiler sees plain constexpr functions).
#pragma once

#ifdef __CUDACC__
#define KLA_HD __host__ __device__
#else
#define KLA_HD
#endif
