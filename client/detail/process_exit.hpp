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
#include <cstddef>

namespace rmmd::detail {

/// Set once exit() ran the handler below or CUDA said it is unloading (read
/// through process_is_exiting() or exit_marked()).
extern std::atomic<bool> process_exit_marked;

/// Registers an atexit handler that marks the process as exiting, at most
/// twice per process (so making many resources does not grow the atexit
/// list). REQUIRES: the caller has started CUDA (it imported a pool, or
/// page-locked one); watch_process_exit_before_cuda() is for the others.
///
/// Why once after CUDA started is enough: atexit handlers and the
/// destructors of objects of static storage duration run in the reverse
/// order of their registration, and the CUDA runtime registers its own
/// teardown when it starts. A static whose destructor was registered before
/// our handler is destroyed after the handler ran, so its resources see the
/// exit. A static registered after our handler is destroyed before it: but
/// that was after CUDA started, so it is also destroyed before CUDA unloads,
/// and its resources may still free through CUDA and the session as usual.
/// A handler registered before CUDA started (by a host resource) does not
/// give that guarantee, hence the second registration.
///
/// And where the main thread exits the process (main returns, or calls
/// exit()), a thread_local object of the main thread, made on the first
/// call, marks the exit before anything else: glibc runs the exiting
/// thread's thread_local destructors first. Then even a static made after
/// the handler (a function-local static resource) sees the exit. A main
/// thread that calls pthread_exit while others go on counts as an exit too:
/// resources then leave their memory to the session's end.
///
/// It first makes RMM register its own exit handler (RMM does so once, as
/// its per-device resource map is made), so that ours, registered after it,
/// runs before it: from then on RMM's flag is never set while ours is not.
void watch_process_exit() noexcept;

/// As watch_process_exit(), for a caller that may not have started CUDA (a
/// host resource that is not page-locked, a shared buffer): registers only
/// if nothing has yet. A later watch_process_exit() registers once more.
void watch_process_exit_before_cuda() noexcept;

/// How many times this process has registered the handler (0, 1 or 2).
[[nodiscard]] std::size_t process_exit_registrations() noexcept;

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
