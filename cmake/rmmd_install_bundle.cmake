# Runs at install time (from cmake/rmmd_install.cmake's install(CODE)), once
# the run-time dependency set has copied the bundled libraries into
# <prefix>/RMMD_BUNDLE_DIR:
#
# - Each bundled library without a run path gets $ORIGIN (patchelf):
#   Debian's libraries have none, and the dynamic loader looks up a
#   library's own dependencies with that library's run path, not with the
#   program's. So libgrpc++ finds libgrpc beside it, on a system without gRPC.
# - The Debian copyright file of the package each bundled library came from
#   goes to <prefix>/RMMD_LICENSE_DIR/<package>/copyright, where dpkg knows
#   the library (the wheels' licenses are installed by rmmd_install.cmake).
#
# In: RMMD_PATCHELF (the patchelf program; may be empty or -NOTFOUND),
#     RMMD_BUNDLE_DIR, RMMD_LICENSE_DIR (relative to the prefix).

set(_dir "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${RMMD_BUNDLE_DIR}")
# file(INSTALL) adds DESTDIR itself.
set(_licenses "${CMAKE_INSTALL_PREFIX}/${RMMD_LICENSE_DIR}")
if(NOT RMMD_PATCHELF OR NOT EXISTS "${RMMD_PATCHELF}")
  message(FATAL_ERROR
    "patchelf is needed to install rmmd: it gives the bundled libraries in ${_dir} the run "
    "path \$ORIGIN. Install it (scripts/setup.sh does: apt-get install patchelf) and "
    "configure again.")
endif()

file(GLOB _files LIST_DIRECTORIES false "${_dir}/*.so" "${_dir}/*.so.*")
set(_names)
foreach(_lib IN LISTS _files)
  get_filename_component(_name "${_lib}" NAME)
  # Our own libraries have their INSTALL_RPATH; links lead to a file here.
  if(IS_SYMLINK "${_lib}" OR _name MATCHES "^librmmd_")
    continue()
  endif()
  list(APPEND _names "${_name}")
  execute_process(COMMAND "${RMMD_PATCHELF}" --print-rpath "${_lib}"
                  OUTPUT_VARIABLE _runpath RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "patchelf --print-rpath ${_lib} failed (${_rc})")
  endif()
  if(_runpath STREQUAL "")
    execute_process(COMMAND "${RMMD_PATCHELF}" --set-rpath "\$ORIGIN" "${_lib}"
                    RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "patchelf --set-rpath \$ORIGIN ${_lib} failed (${_rc})")
    endif()
    message(STATUS "Run path \$ORIGIN: ${_lib}")
  endif()
endforeach()

# Which Debian package each library came from, in one query.
find_program(_dpkg_query dpkg-query)
if(_dpkg_query AND _names)
  set(_patterns)
  foreach(_name IN LISTS _names)
    list(APPEND _patterns "*/${_name}")
  endforeach()
  # Exits non-zero when some name is no package's (the wheels' libraries).
  execute_process(COMMAND "${_dpkg_query}" -S ${_patterns}
                  OUTPUT_VARIABLE _owners ERROR_QUIET)
  string(REPLACE "\n" ";" _owners "${_owners}")
  set(_packages)
  foreach(_line IN LISTS _owners)
    # "libgrpc29:amd64: /usr/lib/x86_64-linux-gnu/libgrpc.so.29.0.0"
    if(_line MATCHES "^([^:, ]+)(:[a-z0-9]+)?: (/.*)$")
      get_filename_component(_file "${CMAKE_MATCH_3}" NAME)
      if(_file IN_LIST _names)
        list(APPEND _packages "${CMAKE_MATCH_1}")
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _packages)
  foreach(_pkg IN LISTS _packages)
    if(EXISTS "/usr/share/doc/${_pkg}/copyright")
      file(INSTALL "/usr/share/doc/${_pkg}/copyright" DESTINATION "${_licenses}/${_pkg}"
           PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
    endif()
  endforeach()
endif()
