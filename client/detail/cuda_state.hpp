#pragma once

// Whether CUDA can still be called: not while the process exits
// (process_exit.hpp) and not once the CUDA runtime is unloading, which a
// resource held in a function-local static outlives. Resources then make no
// CUDA or daemon call and print nothing: the daemon reclaims what a closed
// session held.

#include "client/detail/process_exit.hpp"

#include <cuda_runtime_api.h>

namespace rmmd::detail {

/// `err` says CUDA is being torn down under us (and marks the process as
/// exiting when it is the runtime unloading).
inline bool cuda_is_going(cudaError_t err) noexcept
{
  return cuda_is_unloading(err) || err == cudaErrorContextIsDestroyed;
}

/// The process exits, or the CUDA runtime is going: leave everything as it is.
inline bool leave_everything() noexcept
{
  if (process_is_exiting()) { return true; }
  int device = 0;
  auto err   = cudaGetDevice(&device);
  if (err != cudaSuccess) { cudaGetLastError(); }
  return cuda_is_going(err);
}

}  // namespace rmmd::detail
