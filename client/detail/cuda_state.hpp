#pragma once

// Whether CUDA can still be called: not while the process exits (RMM's flag)
// and not once the CUDA runtime is unloading, which a resource held in a
// static can outlive. Resources then make no CUDA or daemon call and print
// nothing: the daemon reclaims what a closed session held.

#include <cuda_runtime_api.h>

#include <rmm/process_is_exiting.hpp>

namespace rmmd::detail {

/// `err` says CUDA is being torn down under us.
inline bool cuda_is_going(cudaError_t err) noexcept
{
  return err == cudaErrorCudartUnloading || err == cudaErrorContextIsDestroyed;
}

/// The process exits, or the CUDA runtime is going: leave everything as it is.
inline bool leave_everything() noexcept
{
  if (rmm::process_is_exiting()) { return true; }
  int device = 0;
  auto err   = cudaGetDevice(&device);
  if (err != cudaSuccess) { cudaGetLastError(); }
  return cuda_is_going(err);
}

}  // namespace rmmd::detail
