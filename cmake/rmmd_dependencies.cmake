# Finds every dependency the ordinary way. RMM comes from the librmm-cu13 wheel
# that scripts/setup.sh installs into .venv; its CMake packages live under the
# wheels' lib64/, which CMake does not search below a prefix, so the three
# _DIR variables are pointed there unless the caller set them.

find_package(Threads REQUIRED)
find_package(CUDAToolkit 13 REQUIRED)

set(RMMD_VENV "${PROJECT_SOURCE_DIR}/.venv" CACHE PATH "Python venv holding the librmm-cu13 wheel")
file(GLOB _rmmd_site LIST_DIRECTORIES true "${RMMD_VENV}/lib/python3*/site-packages")
if(_rmmd_site)
  list(GET _rmmd_site 0 _rmmd_site)
  if(NOT rmm_DIR)
    set(rmm_DIR "${_rmmd_site}/librmm/lib64/cmake/rmm")
  endif()
  if(NOT nvtx3_DIR)
    set(nvtx3_DIR "${_rmmd_site}/librmm/lib64/cmake/nvtx3")
  endif()
  if(NOT rapids_logger_DIR)
    set(rapids_logger_DIR "${_rmmd_site}/rapids_logger/lib64/cmake/rapids_logger")
  endif()
endif()
find_package(rmm 26.10 REQUIRED CONFIG)
# librmm.so needs librapids_logger.so at run time: keep both wheel lib dirs in
# the rpath of everything we link (the build tree's rpath is used as is).
get_filename_component(_rmmd_rmm_lib "${rmm_DIR}/../.." ABSOLUTE)
get_filename_component(_rmmd_logger_lib "${rapids_logger_DIR}/../.." ABSOLUTE)
set(RMMD_RMM_RPATH "${_rmmd_rmm_lib};${_rmmd_logger_lib}")

find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
if(RMMD_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
