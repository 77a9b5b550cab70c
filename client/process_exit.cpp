#include "client/detail/process_exit.hpp"

#include <rmm/process_is_exiting.hpp>

#include <atomic>
#include <cstdlib>

namespace rmmd::detail {
namespace {

std::atomic<bool> exiting{false};

void mark_exiting() noexcept
{
  exiting.store(true, std::memory_order_release);
}

}  // namespace

void watch_process_exit() noexcept
{
  // A failed registration only loses this one chance to see the exit coming.
  static_cast<void>(std::atexit(mark_exiting));
}

bool process_is_exiting() noexcept
{
  return exiting.load(std::memory_order_acquire) || rmm::process_is_exiting();
}

bool cuda_is_unloading(cudaError_t err) noexcept
{
  if (err != cudaErrorCudartUnloading) { return false; }
  mark_exiting();
  return true;
}

}  // namespace rmmd::detail
