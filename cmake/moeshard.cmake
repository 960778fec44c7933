# add_gtest(NAME SOURCES... [LIBS libs...] [LABELS labels...])
# One helper for every unit test: links GTest, registers with ctest, passes the testdata folder.
set(MOESHARD_TESTDATA "${CMAKE_SOURCE_DIR}/../shared/testdata" CACHE PATH "Folder of the shared test models")
function(add_gtest name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "MOESHARD_TESTDATA=${MOESHARD_TESTDATA};MOESHARD_BIN=${CMAKE_BINARY_DIR}"
    SKIP_RETURN_CODE 77)
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
