# Defines the interface target kla_mp (exported as kla::mp): GMP and MPFR for Boost.Multiprecision.
# The installed package does not re-run this: its klaConfig.cmake looks for GMP and MPFR again
# (klaFindMultiprecision.cmake) and points kla::mp at what it finds.
if(TARGET kla_mp)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/klaFindMultiprecision.cmake)
if(NOT KLA_MP_FOUND)
  message(FATAL_ERROR "kla needs GMP and MPFR (libgmp, libmpfr, mpfr.h); found: "
                      "KLA_GMP_LIBRARY=${KLA_GMP_LIBRARY} KLA_MPFR_LIBRARY=${KLA_MPFR_LIBRARY} "
                      "KLA_MPFR_INCLUDE_DIR=${KLA_MPFR_INCLUDE_DIR}")
endif()
add_library(kla_mp INTERFACE)
set_target_properties(kla_mp PROPERTIES EXPORT_NAME mp)
# MPFR before GMP: the linker resolves left to right and MPFR needs GMP.
target_link_libraries(kla_mp INTERFACE $<BUILD_INTERFACE:${KLA_MPFR_LIBRARY};${KLA_GMP_LIBRARY}>
                                       $<INSTALL_INTERFACE:mpfr;gmp>)
