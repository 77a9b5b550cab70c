# cmake -D DIR=... -D MODE=clear|check -P rmmd_sanitizer_logs.cmake
#
# clear: removes the reports of an earlier run. check: prints every report
# that a process of this run (a test, the daemon, a client it started) wrote
# under DIR, and fails if there is one.
if(MODE STREQUAL "clear")
  file(REMOVE_RECURSE "${DIR}")
  file(MAKE_DIRECTORY "${DIR}")
  return()
endif()
file(GLOB _reports LIST_DIRECTORIES false "${DIR}/*")
if(NOT _reports)
  message(STATUS "no sanitizer reports in ${DIR}")
  return()
endif()
list(LENGTH _reports _count)
foreach(_r IN LISTS _reports)
  file(READ "${_r}" _text)
  message("==== ${_r}\n${_text}")
endforeach()
message(FATAL_ERROR "${_count} sanitizer report(s) in ${DIR} (printed above)")
