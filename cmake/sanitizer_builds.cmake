# The fuzzing and ThreadSanitizer builds. `make test-asan` builds the libFuzzer targets too
# (MOESHARD_FUZZ with MOESHARD_SANITIZE: one build instead of two); `make test-tsan` has its own
# build folder with only its targets built.
option(MOESHARD_FUZZ "Build the libFuzzer targets (needs clang) with ASan and UBSan" OFF)
option(MOESHARD_TSAN "Build with ThreadSanitizer" OFF)
if(MOESHARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MOESHARD_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++)")
  endif()
  if(NOT MOESHARD_SANITIZE)
    add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
    add_link_options(-fsanitize=address,undefined)
  endif()
endif()
# The coverage the fuzzers steer by (-fsanitize=fuzzer-no-link) only on the libraries they
# exercise, after every target is defined: the parsers, the model config, the credential and the
# internal services' handlers. Not the kernels or the model runner: instrumented everywhere, the
# sanitizer build's tests took 407 s instead of 137 (a call at every comparison of every loop).
function(moeshard_fuzz_coverage)
  if(NOT MOESHARD_FUZZ)
    return()
  endif()
  set(covered moeshard_formats moeshard_tokenizer moeshard_proto_convert moeshard_model moeshard_credential
      moeshard_security moeshard_coordinator moeshard_worker_service)
  # Linked by a fuzzer but not steered by: protoc's generated code, the communicators.
  set(uncovered moeshard_proto moeshard_comm)
  foreach(t ${covered})
    if(TARGET ${t})
      target_compile_options(${t} PRIVATE -fsanitize=fuzzer-no-link)
    endif()
  endforeach()
  # Every project library a fuzzer links (tests/fuzz add_fuzzer records them) is on one list.
  get_property(linked GLOBAL PROPERTY MOESHARD_FUZZ_LIBS)
  foreach(lib ${linked})
    if(lib MATCHES "^moeshard_" AND NOT lib IN_LIST covered AND NOT lib IN_LIST uncovered)
      message(FATAL_ERROR "a fuzzer links ${lib}: put it on the coverage list or the uncovered list of "
                          "moeshard_fuzz_coverage in cmake/sanitizer_builds.cmake")
    endif()
  endforeach()
endfunction()
if(MOESHARD_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
