#include "client/detail/process_exit.hpp"

#include <rmm/mr/per_device_resource.hpp>

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
  // RMM registers the handler behind rmm::process_is_exiting() once, right
  // after it makes its per-device resource map: have it made now (if it was
  // not), so that RMM's handler is registered before ours and runs after it.
  static_cast<void>(rmm::mr::detail::get_ref_map());
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
