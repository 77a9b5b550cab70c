# Sanitized builds (CMakePresets.json: asan, tsan, fuzz).
#
# RMMD_SANITIZE is a -fsanitize= list ("address,undefined", "thread"); it
# instruments the product this project compiles (daemon/, client/, common/,
# rmmctl/, harness/), so the daemon and the client libraries inside every
# program the tests start are the sanitized ones. Debian's libraries (gRPC,
# protobuf, abseil, GoogleTest) and RMM stay as they are, and so, to keep a
# cold CI within its time, do two parts of ours with ASan (the asan preset):
# - the generated protobuf code (proto/: RMMD_GENERATED_COMPILE_OPTIONS), as
#   Debian's libprotobuf, which runs it (140 CPU seconds instrumented);
# - the test programs' own code (tests/: RMMD_HARNESS_COMPILE_OPTIONS), as
#   Debian's GoogleTest. ASan's runtime still checks their heap (every
#   malloc and free, leaks) and the product code they call. Instrumenting
#   them doubled the asan build (28.6 s for daemon_core_test.cpp against
#   11.6 s at -O1; 1,524 of its 2,898 CPU seconds).
# TSan instruments both: a lock or a join it cannot see would show the
# product's accesses as races, and it is cheap to compile (12.2 s there).
# libFuzzer builds (fuzz preset) instrument everything, for coverage.
#
# Every process writes its sanitizer reports under ${RMMD_SANITIZER_LOG_DIR}
# (the test presets point ASAN_OPTIONS/UBSAN_OPTIONS/TSAN_OPTIONS' log_path
# there): the daemon and the clients the tests start are not the test itself,
# and a report of theirs must fail the run as surely as one of the test's.
# rmmd_add_sanitizer_fixture() adds the tests that empty that directory
# before the suite and fail, printing every report, after it.

set(RMMD_SANITIZE "" CACHE STRING "-fsanitize= list for every target (empty: none)")

# libFuzzer (tests/fuzz): every target gets libFuzzer's coverage
# instrumentation, so the fuzzers see which branches of the daemon's code an
# input reached; only the fuzzers themselves link libFuzzer's main.
option(RMMD_BUILD_FUZZERS "Build the libFuzzer targets in tests/fuzz (needs clang)" OFF)
if(RMMD_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "RMMD_BUILD_FUZZERS needs clang (libFuzzer): configure with the fuzz "
                        "preset, or -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

set(RMMD_TEST_PROPERTIES)
set(RMMD_GENERATED_COMPILE_OPTIONS)
set(RMMD_HARNESS_COMPILE_OPTIONS)
if(RMMD_SANITIZE MATCHES "address" AND NOT RMMD_BUILD_FUZZERS)
  set(RMMD_GENERATED_COMPILE_OPTIONS -fno-sanitize=all)
  set(RMMD_HARNESS_COMPILE_OPTIONS -fno-sanitize=all)
endif()
if(NOT RMMD_SANITIZE)
  function(rmmd_add_sanitizer_fixture)
  endfunction()
  return()
endif()

if(RMMD_SANITIZE MATCHES "thread" AND RMMD_SANITIZE MATCHES "address")
  message(FATAL_ERROR "RMMD_SANITIZE: ThreadSanitizer does not combine with AddressSanitizer")
endif()

# -fno-sanitize-recover: UBSan's findings end the process like ASan's, so none
# is lost in a log that nobody reads. Frame pointers: usable stacks at -O1.
add_compile_options(-fsanitize=${RMMD_SANITIZE} -fno-omit-frame-pointer)
add_link_options(-fsanitize=${RMMD_SANITIZE})
if(RMMD_SANITIZE MATCHES "undefined")
  add_compile_options(-fno-sanitize-recover=undefined)
endif()
# GCC warns (-Wtsan) that TSan cannot model the std::atomic_thread_fence in
# CCCL's cuda::std::atomic (RMM's shared_resource reference count, in every
# file that includes RMM); that is CCCL's code, not ours, and with -Werror
# the warning would stop the build.
if(RMMD_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options(-Wno-tsan)
endif()

set(RMMD_SANITIZER_LOG_DIR "${PROJECT_BINARY_DIR}/sanitizer-logs")
# For gtest_discover_tests(... PROPERTIES ${RMMD_TEST_PROPERTIES}).
set(RMMD_TEST_PROPERTIES FIXTURES_REQUIRED sanitizer_logs)
file(MAKE_DIRECTORY "${RMMD_SANITIZER_LOG_DIR}")

# Call after enable_testing(): the fixture every test of the suite requires.
function(rmmd_add_sanitizer_fixture)
  add_test(NAME sanitizer_logs.clear
           COMMAND ${CMAKE_COMMAND} -D "DIR=${RMMD_SANITIZER_LOG_DIR}" -D MODE=clear
                   -P ${PROJECT_SOURCE_DIR}/cmake/rmmd_sanitizer_logs.cmake)
  add_test(NAME sanitizer_logs.check
           COMMAND ${CMAKE_COMMAND} -D "DIR=${RMMD_SANITIZER_LOG_DIR}" -D MODE=check
                   -P ${PROJECT_SOURCE_DIR}/cmake/rmmd_sanitizer_logs.cmake)
  # ctest adds both to any selection (-L, -R) that holds a test requiring them.
  set_tests_properties(sanitizer_logs.clear PROPERTIES FIXTURES_SETUP sanitizer_logs)
  set_tests_properties(sanitizer_logs.check PROPERTIES FIXTURES_CLEANUP sanitizer_logs)
endfunction()
