# Install rules and the Debian package (CPack). Included last from the
# top-level CMakeLists.txt, once every target exists.
#
# Layout under the prefix (/usr in the .deb, anything with --prefix):
#   bin/rmmd, bin/rmmctl                 the daemon and the operator's CLI
#   lib/librmmd_client.so*               the client library (rmmd::client)
#   lib/rmmd/                            private libraries: librmmd_proto.so and
#                                        the non-Debian runtime dependencies
#                                        (librmm, librapids_logger, libcudart)
#   include/rmmd/                        the client's public headers
#   lib/cmake/rmmd/                      rmmdConfig.cmake, version, targets
#   lib/systemd/system/rmmd.service      the unit, its paths made to match
#   lib/sysusers.d/rmmd.conf             the rmmd user and group
#   lib/tmpfiles.d/rmmd.conf             where deploy/ has one
#   share/doc/rmmd/                      example config, docs, bundled licenses
#   <sysconfdir>/rmmd/rmmd.conf          the config, from the example; never
#                                        overwritten (/etc when prefix is /usr)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RMMD_PRIVATE_LIBDIR "${CMAKE_INSTALL_LIBDIR}/rmmd")
set(RMMD_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/rmmd")
set(RMMD_PACKAGE_MAINTAINER "rmmd maintainers <rmmd-maintainers@example.org>"
    CACHE STRING "Maintainer field of the .deb")

# --- run paths ----------------------------------------------------------------
# Installed programs and libraries find each other relative to themselves
# ($ORIGIN), so a prefix can be moved (a DESTDIR staging tree, a .deb). No
# absolute wheel path: the wheel libraries are bundled into lib/rmmd (below).
file(RELATIVE_PATH _rmmd_bin_to_lib "/${CMAKE_INSTALL_BINDIR}" "/${CMAKE_INSTALL_LIBDIR}")
set_target_properties(rmmd rmmctl PROPERTIES
  INSTALL_RPATH "$ORIGIN/${_rmmd_bin_to_lib};$ORIGIN/${_rmmd_bin_to_lib}/rmmd")
set_target_properties(rmmd_client PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  EXPORT_NAME client
  INSTALL_RPATH "$ORIGIN/rmmd")
# librmmd_proto's own dependencies are Debian's gRPC and protobuf: no run path.

# --- programs and libraries ---------------------------------------------------
install(TARGETS rmmd rmmctl
  RUNTIME_DEPENDENCY_SET rmmd_bundled
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS rmmd_client EXPORT rmmdTargets
  RUNTIME_DEPENDENCY_SET rmmd_bundled
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Linked privately by librmmd_client (and by the programs): not part of the
# API, so it sits in the private directory, found through $ORIGIN/rmmd. It is
# exported (as rmmd::detail_proto, no headers) only because CMake links
# consumers of a shared library with -rpath-link to its shared dependencies.
set_target_properties(rmmd_proto PROPERTIES EXPORT_NAME detail_proto)
install(TARGETS rmmd_proto EXPORT rmmdTargets
  LIBRARY DESTINATION ${RMMD_PRIVATE_LIBDIR} NAMELINK_SKIP)

# Whatever the programs and the client library need at run time that the
# system's own library directories do not provide (the librmm-cu13 wheel's
# librmm.so and librapids_logger.so, and libcudart from the CUDA toolkit
# where that is not a Debian package) is copied into lib/rmmd. Libraries
# under /lib and /usr/lib come from Debian packages: the .deb declares those
# (dpkg-shlibdeps).
install(RUNTIME_DEPENDENCY_SET rmmd_bundled
  PRE_EXCLUDE_REGEXES "^librmmd_" "^ld-linux" "^libc\\.so" "^libm\\.so" "^libstdc\\+\\+" "^libgcc_s"
  POST_EXCLUDE_REGEXES "^/lib/" "^/lib64/" "^/usr/lib/" "^/usr/lib64/"
  DIRECTORIES ${RMMD_RMM_RPATH}
  LIBRARY DESTINATION ${RMMD_PRIVATE_LIBDIR})

# --- the client's headers and CMake package -----------------------------------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/rmmd
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
install(EXPORT rmmdTargets NAMESPACE rmmd:: DESTINATION ${RMMD_CMAKEDIR})
# rmmdConfig.cmake asks for the same major.minor of RMM and CUDA as this build.
set(RMMD_RMM_VERSION "${rmm_VERSION_MAJOR}.${rmm_VERSION_MINOR}")
set(RMMD_CUDA_VERSION_MAJOR "${CUDAToolkit_VERSION_MAJOR}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/rmmdConfig.cmake.in
  ${PROJECT_BINARY_DIR}/rmmdConfig.cmake INSTALL_DESTINATION ${RMMD_CMAKEDIR})
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rmmdConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/rmmdConfig.cmake ${PROJECT_BINARY_DIR}/rmmdConfigVersion.cmake
  DESTINATION ${RMMD_CMAKEDIR})

# --- systemd, config, docs ----------------------------------------------------
# systemd looks in <prefix>/lib/..., never in a multiarch directory.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/sysusers.d/rmmd.conf DESTINATION lib/sysusers.d)
if(EXISTS ${PROJECT_SOURCE_DIR}/deploy/tmpfiles.d/rmmd.conf)
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/tmpfiles.d/rmmd.conf DESTINATION lib/tmpfiles.d)
endif()
set(_rmmd_example "")
if(EXISTS ${PROJECT_SOURCE_DIR}/deploy/rmmd.conf.example)
  set(_rmmd_example ${PROJECT_SOURCE_DIR}/deploy/rmmd.conf.example)
  install(FILES ${_rmmd_example} DESTINATION ${CMAKE_INSTALL_DOCDIR})
endif()
foreach(_doc README.md docs/operations.md)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_doc})
    install(FILES ${PROJECT_SOURCE_DIR}/${_doc} DESTINATION ${CMAKE_INSTALL_DOCDIR})
  endif()
endforeach()
# The licenses of the bundled wheel libraries (Apache-2.0), from their dist-info.
get_filename_component(_rmmd_site "${rmm_DIR}/../../../.." ABSOLUTE)
foreach(_wheel librmm rapids_logger)
  file(GLOB _lic "${_rmmd_site}/${_wheel}*.dist-info/licenses/LICENSE*")
  if(_lic)
    install(FILES ${_lic} DESTINATION ${CMAKE_INSTALL_DOCDIR}/third-party/${_wheel})
  endif()
endforeach()

# The unit and the config file need the install-time prefix (cmake --install
# --prefix, or /usr under CPack): see cmake/rmmd_install_system.cmake.
install(CODE "
  set(RMMD_UNIT_IN \"${PROJECT_SOURCE_DIR}/deploy/systemd/rmmd.service\")
  set(RMMD_SCRATCH_DIR \"${PROJECT_BINARY_DIR}/rmmd-install\")
  set(RMMD_CONF_EXAMPLE \"${_rmmd_example}\")
  set(RMMD_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(RMMD_SYSCONFDIR \"${CMAKE_INSTALL_SYSCONFDIR}\")
  set(RMMD_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/rmmd_install_system.cmake\")")

# --- the Debian package -------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME rmmd)
set(CPACK_PACKAGE_VENDOR "rmmd")
set(CPACK_PACKAGE_CONTACT "${RMMD_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION
    "rmmd owns the CUDA memory pools and a shared host memory pool of a node and lends\n"
    "allocations from them to the node's processes. The package holds the daemon, its\n"
    "systemd unit, rmmctl, and the client library with its headers and CMake package\n"
    "(find_package(rmmd), target rmmd::client).")
string(JOIN "" CPACK_PACKAGE_DESCRIPTION ${CPACK_PACKAGE_DESCRIPTION})
# Install with DESTDIR and the real prefix, so the install-time code above
# sees /usr (the unit's paths, /etc for the config).
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${RMMD_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
# Debian library dependencies from dpkg-shlibdeps. It finds the bundled ones in
# the package itself: CPack turns the $ORIGIN run paths into staging paths.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# systemd-sysusers or, without it, useradd (passwd) makes the rmmd user.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(_rmmd_debian ${PROJECT_BINARY_DIR}/debian-control)
file(MAKE_DIRECTORY ${_rmmd_debian})
foreach(_script postinst prerm postrm)
  file(COPY ${PROJECT_SOURCE_DIR}/deploy/debian/${_script} DESTINATION ${_rmmd_debian}
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                        WORLD_READ WORLD_EXECUTE)
  list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${_rmmd_debian}/${_script})
endforeach()
if(_rmmd_example)
  # dpkg keeps an operator's edits to a conffile across upgrades.
  file(WRITE ${_rmmd_debian}/conffiles "/etc/rmmd/rmmd.conf\n")
  list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${_rmmd_debian}/conffiles)
else()
  file(REMOVE ${_rmmd_debian}/conffiles)
endif()
include(CPack)
