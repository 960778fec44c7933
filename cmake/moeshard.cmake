# The test models: assembled there by the `testdata` target from tests/testdata (tests/testdata/CMakeLists.txt).
set(MOESHARD_TESTDATA "${CMAKE_BINARY_DIR}/testdata" CACHE PATH "Folder the test models are assembled in")

# add_gtest(NAME SOURCES... [LIBS libs...] [LABELS labels...])
# One helper for every unit test: links GTest, registers with ctest, passes the testdata folder.
# Only tests labelled gpu may skip, and only without a GPU (tests/gpu_test_main.cc exits 77, which
# ctest reports as Skipped); a case that skips itself in any other test fails that test.
function(add_gtest name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${name} PRIVATE MOESHARD_TESTDATA_DIR="${MOESHARD_TESTDATA}")
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "MOESHARD_TESTDATA=${MOESHARD_TESTDATA};MOESHARD_BIN=${CMAKE_BINARY_DIR}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if("gpu" IN_LIST T_LABELS)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  else()
    set_tests_properties(${name} PROPERTIES FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
endfunction()
