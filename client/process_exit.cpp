#include "client/detail/process_exit.hpp"

#include <cstdlib>

namespace rmmd::detail {

std::atomic<bool> process_exit_marked{false};

namespace {

void mark_exiting() noexcept
{
  process_exit_marked.store(true, std::memory_order_release);
}

}  // namespace

void watch_process_exit() noexcept
{
  // A failed registration only loses this one chance to see the exit coming.
  static_cast<void>(std::atexit(mark_exiting));
}

bool cuda_is_unloading(cudaError_t err) noexcept
{
  if (err != cudaErrorCudartUnloading) { return false; }
  mark_exiting();
  return true;
}

}  // namespace rmmd::detail
