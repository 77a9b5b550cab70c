# Install rules and the packages (CPack). Included last from the top-level
# CMakeLists.txt, once every target exists.
#
# Two components, which are two Debian packages:
#   runtime  -> rmmd      what a node runs: the daemon, rmmctl, the client
#                         library, the private libraries, systemd files,
#                         config, docs
#   dev      -> rmmd-dev  what a client's build needs: headers, the CMake
#                         package, rmmd.pc, and RMM's own headers and CMake
#                         packages (RMM, CCCL, NVTX, rapids_logger)
# and one portable archive (TGZ) holding both, without the systemd unit
# (cmake/rmmd_cpack_project.cmake).
#
# Layout under the prefix (/usr in the .deb, anything with --prefix):
#   bin/rmmd, bin/rmmctl                 the daemon and the operator's CLI
#   lib/librmmd_client.so.0*             the client library (rmmd::client);
#                                        lib/librmmd_client.so is rmmd-dev's
#   lib/rmmd/                            private libraries: librmmd_proto.so
#                                        and every run-time dependency that is
#                                        not on every Debian and Ubuntu system
#                                        (below), each with run path $ORIGIN
#   lib/rmmd/rmm/, lib/rmmd/rapids_logger/
#                                        (rmmd-dev) the librmm-cu13 and
#                                        rapids-logger wheels' include/ and
#                                        lib64/cmake/, their libraries linked
#                                        to the copies in lib/rmmd/
#   include/rmmd/                        (rmmd-dev) the client's public headers
#   lib/cmake/rmmd/                      (rmmd-dev) rmmdConfig.cmake, version,
#                                        targets
#   lib/pkgconfig/rmmd.pc                (rmmd-dev) the same for pkg-config
#   lib/systemd/system/rmmd.service      the unit, its paths made to match
#   lib/sysusers.d/rmmd.conf             the rmmd user and group
#   lib/tmpfiles.d/rmmd.conf             where deploy/ has one
#   share/doc/rmmd/                      example config, docs, the licenses
#                                        of everything in lib/rmmd/
#   <sysconfdir>/rmmd/rmmd.conf          the config, from the example; never
#                                        overwritten (/etc when prefix is /usr)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RMMD_PRIVATE_LIBDIR "${CMAKE_INSTALL_LIBDIR}/rmmd")
set(RMMD_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/rmmd")
set(RMMD_PACKAGE_MAINTAINER "rmmd maintainers <rmmd-maintainers@example.org>"
    CACHE STRING "Maintainer field of the .deb")
# Sets the run path of the bundled libraries (cmake/rmmd_install_bundle.cmake).
find_program(RMMD_PATCHELF patchelf DOC "patchelf, for the run paths of the bundled libraries")

# --- run paths ----------------------------------------------------------------
# Installed programs and libraries find each other relative to themselves
# ($ORIGIN), so a prefix can be moved (a DESTDIR staging tree, a .deb, the
# archive unpacked anywhere). No absolute path: every library they need that a
# system may lack is bundled into lib/rmmd (below).
file(RELATIVE_PATH _rmmd_bin_to_lib "/${CMAKE_INSTALL_BINDIR}" "/${CMAKE_INSTALL_LIBDIR}")
set_target_properties(rmmd rmmctl PROPERTIES
  INSTALL_RPATH "$ORIGIN/${_rmmd_bin_to_lib};$ORIGIN/${_rmmd_bin_to_lib}/rmmd")
set_target_properties(rmmd_client PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  EXPORT_NAME client
  INSTALL_RPATH "$ORIGIN/rmmd")
# The C ABI (include/rmmd/rmmd.h): beside librmmd_client, which it links, on
# the system's library path, where Python's ctypes and PyTorch's pluggable
# allocator load it by name.
set_target_properties(rmmd_c PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  EXPORT_NAME c
  INSTALL_RPATH "$ORIGIN;$ORIGIN/rmmd")
# Its gRPC and protobuf are the bundled ones beside it. CMake can only rewrite
# a run path that the build gave the library, and this one needs none in the
# build tree (its dependencies are the system's): $ORIGIN there too.
set_target_properties(rmmd_proto PROPERTIES BUILD_RPATH "$ORIGIN" INSTALL_RPATH "$ORIGIN")

# --- programs and libraries ---------------------------------------------------
install(TARGETS rmmd rmmctl
  RUNTIME_DEPENDENCY_SET rmmd_bundled
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS rmmd_client rmmd_c EXPORT rmmdTargets
  RUNTIME_DEPENDENCY_SET rmmd_bundled
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
# Linked privately by librmmd_client (and by the programs): not part of the
# API, so it sits in the private directory, found through $ORIGIN/rmmd. It is
# exported (as rmmd::detail_proto, no headers, no usage requirements) only
# because CMake links consumers of a shared library with -rpath-link to its
# shared dependencies.
set_target_properties(rmmd_proto PROPERTIES EXPORT_NAME detail_proto)
install(TARGETS rmmd_proto EXPORT rmmdTargets
  LIBRARY DESTINATION ${RMMD_PRIVATE_LIBDIR} COMPONENT runtime NAMELINK_SKIP)

# What the programs and the client library need at run time is copied into
# lib/rmmd, except what every Debian 12 and Ubuntu 22.04/24.04 system has (the
# package Depends on those, through dpkg-shlibdeps): glibc's libraries, GCC's
# libstdc++ and libgcc_s, and libsystemd (whose own dependencies come with
# it, so they are not followed). The CUDA driver (libcuda) is the node's.
# So gRPC, protobuf, abseil, OpenSSL, c-ares, re2, zlib, cpp-httplib and
# brotli ship in the package, as librmm, librapids_logger (the librmm-cu13
# wheel) and libcudart (the CUDA toolkit; NVIDIA allows shipping it) do: the
# package is built on Debian 12, whose library package names and versions
# other systems do not have (Ubuntu 24.04 has libgrpc++1.51t64, no
# libabsl20220623; Ubuntu 22.04 has gRPC 1.30). The highest glibc symbol
# version any of them needs is checked by tests/packaging/deb_test.sh.
install(RUNTIME_DEPENDENCY_SET rmmd_bundled
  PRE_EXCLUDE_REGEXES "^librmmd_" "^ld-linux" "^linux-vdso" "^libc\\.so" "^libm\\.so"
                      "^libdl\\.so" "^libpthread\\.so" "^librt\\.so" "^libutil\\.so"
                      "^libresolv\\.so" "^libstdc\\+\\+\\.so" "^libgcc_s\\.so"
                      "^libsystemd\\.so" "^libcuda\\.so"
  DIRECTORIES ${RMMD_RMM_RPATH}
  LIBRARY DESTINATION ${RMMD_PRIVATE_LIBDIR} COMPONENT runtime)
# Debian's libraries have no run path: each bundled library gets $ORIGIN, so
# the ones it needs are found beside it (a program's run path covers only its
# own direct dependencies); and each one's Debian copyright file goes to the
# docs.
install(CODE "
  set(RMMD_PATCHELF \"${RMMD_PATCHELF}\")
  set(RMMD_BUNDLE_DIR \"${RMMD_PRIVATE_LIBDIR}\")
  set(RMMD_LICENSE_DIR \"${CMAKE_INSTALL_DOCDIR}/third-party\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/rmmd_install_bundle.cmake\")" COMPONENT runtime)

# --- the client's headers and CMake and pkg-config packages (rmmd-dev) --------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/rmmd
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.hpp"
  PATTERN "*.h")
install(EXPORT rmmdTargets NAMESPACE rmmd:: DESTINATION ${RMMD_CMAKEDIR} COMPONENT dev)

# The client's headers include RMM's (and through them CCCL's, NVTX's and
# rapids_logger's), so a client's build needs RMM 26.10's headers and CMake
# packages, from the same wheels as the bundled librmm. They ship here, laid
# out as in the wheels, so that their CMake packages find each other as they
# do there; the libraries they name are links to the bundled copies.
get_filename_component(_rmmd_rmm_prefix "${rmm_DIR}/../../.." ABSOLUTE)
get_filename_component(_rmmd_logger_prefix "${rapids_logger_DIR}/../../.." ABSOLUTE)
install(DIRECTORY ${_rmmd_rmm_prefix}/include/
  DESTINATION ${RMMD_PRIVATE_LIBDIR}/rmm/include COMPONENT dev)
install(DIRECTORY ${_rmmd_rmm_prefix}/lib64/cmake ${_rmmd_rmm_prefix}/lib64/rapids
  DESTINATION ${RMMD_PRIVATE_LIBDIR}/rmm/lib64 COMPONENT dev)
install(DIRECTORY ${_rmmd_logger_prefix}/include/
  DESTINATION ${RMMD_PRIVATE_LIBDIR}/rapids_logger/include COMPONENT dev)
install(DIRECTORY ${_rmmd_logger_prefix}/lib64/cmake
  DESTINATION ${RMMD_PRIVATE_LIBDIR}/rapids_logger/lib64 COMPONENT dev)
install(CODE "
  set(_d \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${RMMD_PRIVATE_LIBDIR}\")
  file(CREATE_LINK ../../librmm.so \"\${_d}/rmm/lib64/librmm.so\" SYMBOLIC)
  file(CREATE_LINK ../../librapids_logger.so \"\${_d}/rapids_logger/lib64/librapids_logger.so\" SYMBOLIC)"
  COMPONENT dev)

# rmmdConfig.cmake asks for the same major.minor of RMM and CUDA as this build.
set(RMMD_RMM_VERSION "${rmm_VERSION_MAJOR}.${rmm_VERSION_MINOR}")
set(RMMD_CUDA_VERSION_MAJOR "${CUDAToolkit_VERSION_MAJOR}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/rmmdConfig.cmake.in
  ${PROJECT_BINARY_DIR}/rmmdConfig.cmake INSTALL_DESTINATION ${RMMD_CMAKEDIR}
  PATH_VARS RMMD_PRIVATE_LIBDIR)
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rmmdConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/rmmdConfig.cmake ${PROJECT_BINARY_DIR}/rmmdConfigVersion.cmake
  DESTINATION ${RMMD_CMAKEDIR} COMPONENT dev)
# pkg-config, for builds without CMake >= 4.0 (which RMM's CMake package needs).
# The compile definitions are the ones RMM's and CCCL's packages give a
# client (rmm-dependencies.cmake, CCCL's thrust-config.cmake): some choose
# CCCL's ABI namespaces, so a client compiles with the same ones as
# librmmd_client. tests/packaging/install_consumer_test.sh checks that they
# are what CMake passes.
set(RMMD_PC_DEFINITIONS
    -DCCCL_DISABLE_PDL -DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR
    -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CUDA -DTHRUST_DISABLE_ABI_NAMESPACE
    -DTHRUST_HOST_SYSTEM=THRUST_HOST_SYSTEM_CPP -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR)
list(JOIN RMMD_PC_DEFINITIONS " " RMMD_PC_DEFINITIONS)
configure_file(${PROJECT_SOURCE_DIR}/cmake/rmmd.pc.in ${PROJECT_BINARY_DIR}/rmmd.pc @ONLY)
# The C ABI's: C programs need neither RMM's headers nor CUDA's.
configure_file(${PROJECT_SOURCE_DIR}/cmake/rmmd-c.pc.in ${PROJECT_BINARY_DIR}/rmmd-c.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/rmmd.pc ${PROJECT_BINARY_DIR}/rmmd-c.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# --- systemd, config, docs ----------------------------------------------------
# systemd looks in <prefix>/lib/..., never in a multiarch directory.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/sysusers.d/rmmd.conf DESTINATION lib/sysusers.d
  COMPONENT runtime)
if(EXISTS ${PROJECT_SOURCE_DIR}/deploy/tmpfiles.d/rmmd.conf)
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/tmpfiles.d/rmmd.conf DESTINATION lib/tmpfiles.d
    COMPONENT runtime)
endif()
set(_rmmd_example "")
if(EXISTS ${PROJECT_SOURCE_DIR}/deploy/rmmd.conf.example)
  set(_rmmd_example ${PROJECT_SOURCE_DIR}/deploy/rmmd.conf.example)
  install(FILES ${_rmmd_example} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
endif()
foreach(_doc README.md docs/operations.md docs/configuration.md)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_doc})
    install(FILES ${PROJECT_SOURCE_DIR}/${_doc} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
  endif()
endforeach()
# The licenses of the bundled wheel libraries (Apache-2.0), from their dist-info.
get_filename_component(_rmmd_site "${rmm_DIR}/../../../.." ABSOLUTE)
foreach(_wheel librmm rapids_logger)
  file(GLOB _lic "${_rmmd_site}/${_wheel}*.dist-info/licenses/LICENSE*")
  if(_lic)
    install(FILES ${_lic} DESTINATION ${CMAKE_INSTALL_DOCDIR}/third-party/${_wheel}
      COMPONENT runtime)
  endif()
endforeach()

# The CUDA runtime's license: the toolkit's EULA, or, in a toolkit made of
# NVIDIA's wheels (as on our build machines), the cuda-runtime wheel's.
get_filename_component(_rmmd_cuda_root "${CUDAToolkit_BIN_DIR}/.." ABSOLUTE)
file(GLOB _lic "${_rmmd_cuda_root}/EULA.txt"
     "${_rmmd_cuda_root}/dist-info/nvidia_cuda_runtime-*.dist-info/licenses/*")
if(_lic)
  install(FILES ${_lic} DESTINATION ${CMAKE_INSTALL_DOCDIR}/third-party/cuda_runtime
    COMPONENT runtime)
endif()

# The unit and the config file need the install-time prefix (cmake --install
# --prefix, or /usr under CPack): see cmake/rmmd_install_system.cmake. The
# archive (RMMD_ARCHIVE, set by cmake/rmmd_cpack_project.cmake) has no unit:
# it can be unpacked anywhere, and a unit names absolute paths.
install(CODE "
  set(RMMD_UNIT_IN \"${PROJECT_SOURCE_DIR}/deploy/systemd/rmmd.service\")
  set(RMMD_SCRATCH_DIR \"${PROJECT_BINARY_DIR}/rmmd-install\")
  set(RMMD_CONF_EXAMPLE \"${_rmmd_example}\")
  set(RMMD_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(RMMD_SYSCONFDIR \"${CMAKE_INSTALL_SYSCONFDIR}\")
  set(RMMD_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/rmmd_install_system.cmake\")" COMPONENT runtime)

# --- the packages ---------------------------------------------------------------
# `cpack --config build/CPackConfig.cmake` makes both; `-G DEB` or `-G TGZ` one.
set(CPACK_GENERATOR DEB TGZ)
set(CPACK_PACKAGE_NAME rmmd)
set(CPACK_PACKAGE_VENDOR "rmmd")
set(CPACK_PACKAGE_CONTACT "${RMMD_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
# Per generator: the DEB installs under /usr, the archive under its own top
# directory with no unit.
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/cmake/rmmd_cpack_project.cmake)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL runtime dev)
# xz (the .deb) on every core.
set(CPACK_THREADS 0)
# The archive's name and top directory (rmmd_cpack_project.cmake).
set(CPACK_RMMD_ARCHIVE_NAME "rmmd-${PROJECT_VERSION}-linux-${CMAKE_SYSTEM_PROCESSOR}")

# The Debian packages: rmmd and rmmd-dev.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${RMMD_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME rmmd)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION admin)
string(JOIN "\n" CPACK_DEBIAN_RUNTIME_DESCRIPTION
  "node-wide CUDA memory pools lent to the node's processes"
  "rmmd owns the CUDA memory pools and a shared host memory pool of a node and lends"
  "allocations from them to the node's processes. The package holds the daemon, its"
  "systemd unit, rmmctl and the client library; its gRPC, protobuf, RMM and CUDA runtime"
  "libraries are private copies in /usr/lib/rmmd. rmmd-dev holds what a client's build needs.")
# Depends from dpkg-shlibdeps: it finds the bundled libraries inside the
# package through their $ORIGIN run paths and gives them no dependency, so
# only libc6, libstdc++6, libgcc-s1 and libsystemd0 remain (deb_test.sh checks).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# systemd-sysusers or, without it, useradd (passwd) makes the rmmd user.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME rmmd-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
string(JOIN "\n" CPACK_DEBIAN_DEV_DESCRIPTION
  "rmmd client library: headers, CMake and pkg-config packages"
  "What a program's build needs to use rmmd's client library: the headers, the CMake"
  "package (find_package(rmmd), target rmmd::client), rmmd.pc, and the headers and"
  "CMake packages of RMM ${RMMD_RMM_VERSION} (with CCCL, NVTX and rapids_logger) that the"
  "headers include, in /usr/lib/rmmd. The CUDA ${RMMD_CUDA_VERSION_MAJOR} toolkit is the system's.")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "rmmd (= ${PROJECT_VERSION})")
set(_rmmd_debian ${PROJECT_BINARY_DIR}/debian-control)
file(MAKE_DIRECTORY ${_rmmd_debian})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA)
foreach(_script postinst prerm postrm)
  file(COPY ${PROJECT_SOURCE_DIR}/deploy/debian/${_script} DESTINATION ${_rmmd_debian}
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                        WORLD_READ WORLD_EXECUTE)
  list(APPEND CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${_rmmd_debian}/${_script})
endforeach()
if(_rmmd_example)
  # dpkg keeps an operator's edits to a conffile across upgrades.
  file(WRITE ${_rmmd_debian}/conffiles "/etc/rmmd/rmmd.conf\n")
  list(APPEND CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${_rmmd_debian}/conffiles)
else()
  file(REMOVE ${_rmmd_debian}/conffiles)
endif()
include(CPack)
