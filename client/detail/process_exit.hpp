#pragma once

// Private to librmmd_client: whether the process has begun exiting, so that
// the resources' destructors and frees make no CUDA call and print nothing
// then (the daemon reclaims what a session held when its socket closes).
//
// rmm::process_is_exiting() alone is not enough: RMM sets it from an atexit
// handler registered when its per-device resource map is first used, so a
// program that never touches that map never sees it set, and a resource kept
// in a static was destroyed after the CUDA runtime had begun unloading
// (cudaErrorCudartUnloading) while that flag still said no.

#include <rmm/process_is_exiting.hpp>

#include <cuda_runtime_api.h>

#include <atomic>

namespace rmmd::detail {

/// Set once exit() ran the handler below or CUDA said it is unloading (read
/// through process_is_exiting() or exit_marked()).
extern std::atomic<bool> process_exit_marked;

/// Registers (again) an atexit handler that marks the process as exiting.
/// Handlers and the destructors of objects of static storage duration run in
/// the reverse order of their registration, so a resource calls this once
/// it is constructed: then the handler runs before the destructor of any
/// static that already held the place it was put in (a std::optional, a
/// std::unique_ptr, a container). Costs one atexit entry per call.
///
/// It first makes RMM register its own exit handler (RMM does so once, as
/// its per-device resource map is made), so that ours, registered after it,
/// runs before it: from then on RMM's flag is never set while ours is not.
void watch_process_exit() noexcept;

/// Whether our handler has marked the process as exiting (or CUDA said it is
/// unloading). Enough, and one load cheaper than process_is_exiting(), in
/// code that only runs once watch_process_exit() has: a resource's frees.
[[nodiscard]] inline bool exit_marked() noexcept
{
  return process_exit_marked.load(std::memory_order_acquire);
}

/// True once exit() has run the handler above or RMM's own, or once a CUDA
/// call has answered cudaErrorCudartUnloading (see cuda_is_unloading). Never
/// calls CUDA. For code that may run without watch_process_exit() having run
/// (a session's end).
[[nodiscard]] inline bool process_is_exiting() noexcept
{
  return exit_marked() || rmm::process_is_exiting();
}

/// Returns true (and marks the process as exiting) when `err` says that the
/// CUDA runtime is unloading: the caller then stops quietly.
bool cuda_is_unloading(cudaError_t err) noexcept;

}  // namespace rmmd::detail
