# The test models: assembled there by the `testdata` target from tests/testdata (tests/testdata/CMakeLists.txt).
set(MOESHARD_TESTDATA "${CMAKE_BINARY_DIR}/testdata" CACHE PATH "Folder the test models are assembled in")

# add_gtest(NAME SOURCES... [LIBS libs...] [LABELS labels...] [LONG_CASES gtest-filter])
# One helper for every unit test: links GTest, registers with ctest, passes the testdata folder.
# Only tests labelled gpu may skip, and only without a GPU (tests/gpu_test_main.cc exits 77, which
# ctest reports as Skipped); a case that skips itself in any other test fails that test.
# LONG_CASES: the cases matching the filter (minutes under the sanitizers: the larger test models)
# run as a second ctest test, NAME_long, labelled long (the release build runs it, `make
# test-unit`); NAME runs every other case.
# With MOESHARD_CPU_TESTS=OFF a test with none of the labels gpu, long, cudahost (and no
# LONG_CASES) is neither built nor registered.
function(add_gtest name)
  cmake_parse_arguments(T "" "LONG_CASES" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT MOESHARD_CPU_TESTS AND NOT T_LONG_CASES AND NOT "${T_LABELS}" MATCHES "gpu|long|cudahost")
    return()
  endif()
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${name} PRIVATE MOESHARD_TESTDATA_DIR="${MOESHARD_TESTDATA}")
  # Tests under tests/ share its precompiled header (same flags there: tests/CMakeLists.txt).
  if(TARGET moeshard_test_pch AND CMAKE_CURRENT_SOURCE_DIR MATCHES "^${PROJECT_SOURCE_DIR}/tests(/|$)")
    target_precompile_headers(${name} REUSE_FROM moeshard_test_pch)
    # -pthread everywhere: the header is built with it (gRPC's targets add it), which clang checks.
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-pthread>)
  endif()
  if(T_LONG_CASES)
    add_test(NAME ${name} COMMAND ${name} --gtest_filter=-${T_LONG_CASES})
    add_test(NAME ${name}_long COMMAND ${name} --gtest_filter=${T_LONG_CASES})
    set(tests ${name} ${name}_long)
  else()
    add_test(NAME ${name} COMMAND ${name})
    set(tests ${name})
  endif()
  set_tests_properties(${tests} PROPERTIES
    ENVIRONMENT "MOESHARD_TESTDATA=${MOESHARD_TESTDATA};MOESHARD_BIN=${CMAKE_BINARY_DIR}")
  if(T_LABELS)
    set_tests_properties(${tests} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if(T_LONG_CASES)
    set_tests_properties(${name}_long PROPERTIES LABELS "long;${T_LABELS}")
  endif()
  if("gpu" IN_LIST T_LABELS)
    set_tests_properties(${tests} PROPERTIES SKIP_RETURN_CODE 77)
  else()
    # A filter that matches no case runs nothing: gtest's summary then says 0 tests ran.
    set_tests_properties(${tests} PROPERTIES FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\];Running 0 tests from 0 test suites")
  endif()
endfunction()
