# Defines the interface target kla_mp (exported as kla::mp): GMP and MPFR for Boost.Multiprecision.
# With KLA_STATIC_RUNTIME the static archives are preferred, so binaries run on machines that
# lack the shared libraries (the GPU machine, SPEC §6).
if(TARGET kla_mp OR TARGET kla::mp)
  return()
endif()
if(KLA_STATIC_RUNTIME)
  find_library(KLA_GMP_LIBRARY NAMES libgmp.a gmp REQUIRED)
  find_library(KLA_MPFR_LIBRARY NAMES libmpfr.a mpfr REQUIRED)
else()
  find_library(KLA_GMP_LIBRARY NAMES gmp REQUIRED)
  find_library(KLA_MPFR_LIBRARY NAMES mpfr REQUIRED)
endif()
find_path(KLA_MPFR_INCLUDE_DIR mpfr.h REQUIRED)
add_library(kla_mp INTERFACE)
set_target_properties(kla_mp PROPERTIES EXPORT_NAME mp)
# MPFR before GMP: the linker resolves left to right and MPFR needs GMP.
target_link_libraries(kla_mp INTERFACE $<BUILD_INTERFACE:${KLA_MPFR_LIBRARY};${KLA_GMP_LIBRARY}>
                                       $<INSTALL_INTERFACE:mpfr;gmp>)
