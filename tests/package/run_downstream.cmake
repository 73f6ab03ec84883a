# cmake -P script: install kla into a prefix, then configure tests/package/downstream against it
# once per way of asking for it (building and running the examples where it should work, checking
# the message where it should fail). Fails on the first error.
cmake_minimum_required(VERSION 3.25)
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "downstream ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "downstream ${what}: ok\n${out}")
endfunction()

# consumer(<name> [CONFIGURE_ONLY] <configure arguments>...): configure, build, run what was built.
function(consumer name)
  set(args ${ARGN})
  list(REMOVE_ITEM args CONFIGURE_ONLY)
  set(bin ${DOWNSTREAM_BINARY}/${name})
  step("${name}: configure" ${CMAKE_COMMAND} -S ${DOWNSTREAM_SOURCE} -B ${bin} -G ${GENERATOR}
       -DCMAKE_PREFIX_PATH=${KLA_PREFIX} -DCMAKE_BUILD_TYPE=Release ${args})
  if("CONFIGURE_ONLY" IN_LIST ARGN)
    return()
  endif()
  step("${name}: build" ${CMAKE_COMMAND} --build ${bin})
  foreach(exe downstream_reference downstream_cuda)
    if(EXISTS ${bin}/${exe})
      step("${name}: run ${exe}" ${bin}/${exe})
    endif()
  endforeach()
endfunction()

# must_fail(<name> <text the failure must mention> <configure arguments>...)
function(must_fail name mention)
  set(bin ${DOWNSTREAM_BINARY}/${name})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${DOWNSTREAM_SOURCE} -B ${bin} -G ${GENERATOR}
                          -DCMAKE_PREFIX_PATH=${KLA_PREFIX} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps long messages: compare with whitespace runs collapsed.
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out} ${err}")
  if(rc EQUAL 0 OR NOT flat MATCHES "${mention}")
    message(FATAL_ERROR "downstream ${name}: expected a configure failure mentioning "
                        "'${mention}', got (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "downstream ${name}: failed as expected\n${err}")
endfunction()

file(REMOVE_RECURSE ${KLA_PREFIX} ${DOWNSTREAM_BINARY})
step(install ${CMAKE_COMMAND} --install ${KLA_BUILD_DIR} --prefix ${KLA_PREFIX})

set(installed reference)
if(KLA_HAS_CUDA)
  set(installed reference,cuda)
endif()
# Eigen3, Boost, GMP and MPFR out of reach: the packages disabled, and find_library / find_path
# (how the config looks for GMP and MPFR) searching only an empty root.
set(no_reference_deps
    -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=TRUE -DCMAKE_DISABLE_FIND_PACKAGE_Boost=TRUE
    -DCMAKE_FIND_ROOT_PATH=${DOWNSTREAM_BINARY}/empty-root
    -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY)

# No COMPONENTS: everything installed.
consumer(all -DKLA_EXPECT_COMPONENTS=${installed})
# The reference component alone (kla::cuda not loaded).
consumer(reference -DKLA_COMPONENTS=reference -DKLA_EXPECT_COMPONENTS=reference)
if(KLA_HAS_CUDA)
  # The cuda component alone needs none of the reference component's dependencies...
  consumer(cuda ${no_reference_deps} -DKLA_COMPONENTS=cuda -DKLA_EXPECT_COMPONENTS=cuda)
  # ...which are truly out of reach there: the reference component fails, naming them all.
  must_fail(reference-without-deps "reference component needs Eigen3 3.4, Boost 1.81, GMP and MPFR"
            ${no_reference_deps} -DKLA_COMPONENTS=reference)
  # An optional component that cannot load leaves the package found.
  consumer(cuda-optional-reference CONFIGURE_ONLY ${no_reference_deps} -DKLA_COMPONENTS=cuda
           -DKLA_OPTIONAL_COMPONENTS=reference -DKLA_EXPECT_COMPONENTS=cuda)
else()
  must_fail(cuda-not-installed "cuda component is not installed" -DKLA_COMPONENTS=cuda)
  consumer(reference-optional-cuda CONFIGURE_ONLY -DKLA_COMPONENTS=reference
           -DKLA_OPTIONAL_COMPONENTS=cuda -DKLA_EXPECT_COMPONENTS=reference)
endif()
must_fail(unknown-component "kla has no component \"nonsuch\"" -DKLA_COMPONENTS=nonsuch)
