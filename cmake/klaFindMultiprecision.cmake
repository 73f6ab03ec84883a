# Looks for GMP and MPFR (Boost.Multiprecision's gmp_rational and mpfr_float) and sets
# KLA_MP_FOUND; the paths are the cache entries KLA_GMP_LIBRARY, KLA_MPFR_LIBRARY and
# KLA_MPFR_INCLUDE_DIR (set them to override). Never fails: the caller decides.
# Used by the build (klaMultiprecision.cmake) and by the installed klaConfig.cmake for the
# reference component, since the paths found where kla was built mean nothing where it is used.
# With KLA_STATIC_RUNTIME the static archives are preferred, so binaries run on machines that
# lack the shared libraries (the GPU machine, SPEC §6).
if(KLA_STATIC_RUNTIME)
  find_library(KLA_GMP_LIBRARY NAMES libgmp.a gmp)
  find_library(KLA_MPFR_LIBRARY NAMES libmpfr.a mpfr)
else()
  find_library(KLA_GMP_LIBRARY NAMES gmp)
  find_library(KLA_MPFR_LIBRARY NAMES mpfr)
endif()
find_path(KLA_MPFR_INCLUDE_DIR mpfr.h)
mark_as_advanced(KLA_GMP_LIBRARY KLA_MPFR_LIBRARY KLA_MPFR_INCLUDE_DIR)
if(KLA_GMP_LIBRARY AND KLA_MPFR_LIBRARY AND KLA_MPFR_INCLUDE_DIR)
  set(KLA_MP_FOUND TRUE)
else()
  set(KLA_MP_FOUND FALSE)
endif()
