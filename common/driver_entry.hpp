#pragma once

// One CUDA driver function, reached through the runtime's
// cudaGetDriverEntryPointByVersion: nothing links libcuda, so programs built
// with it still start on a machine without a driver (the host backend, CI).
// Every driver call rmmd makes outside the runtime goes through here
// (common/vmm.hpp's virtual memory calls, the client's context and capture
// queries, the daemon's buffer import, the tests' kernels). Header-only.

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>

namespace rmmd::gpu {

/// Sets `fn` to the driver's `symbol` with the ABI of CUDA `version`
/// (12000: 12.0) and returns true; or leaves `fn` as it was, clears the
/// runtime's error, says why in `why` when it is given and still empty
/// ("the CUDA driver has no cuMemCreate (cudaErrorNoDevice)"), and returns
/// false. `Fn` is the function's pointer type.
template <typename Fn>
bool driver_entry_point(char const* symbol, Fn& fn, int version = 12000, std::string* why = nullptr)
{
  static_assert(std::is_pointer_v<Fn> && std::is_function_v<std::remove_pointer_t<Fn>>);
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  auto const err = cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    if (why != nullptr && why->empty()) {
      char const* const reason = err != cudaSuccess ? cudaGetErrorName(err)
                                 : found == cudaDriverEntryPointVersionNotSufficent
                                     ? "the driver is older than the version asked for"
                                     : "no such symbol";
      *why = std::string("the CUDA driver has no ") + symbol + " (" + reason + ")";
    }
    return false;
  }
  fn = reinterpret_cast<Fn>(p);
  return true;
}

}  // namespace rmmd::gpu
