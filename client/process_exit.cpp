#include "client/detail/process_exit.hpp"

#include <rmm/mr/per_device_resource.hpp>

#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace rmmd::detail {

std::atomic<bool> process_exit_marked{false};

namespace {

/// How far the watch has come: each step registers the handler once more.
enum class watch_state : int {
  none,         ///< never registered
  before_cuda,  ///< registered by a caller that had not necessarily started CUDA
  after_cuda,   ///< registered after CUDA started: final
};

std::atomic<watch_state> watched{watch_state::none};
std::atomic<std::size_t> registrations{0};
std::mutex registering;  // constant-initialised: usable from any static's constructor

void mark_exiting() noexcept
{
  process_exit_marked.store(true, std::memory_order_release);
}

/// Marks the exit as it begins: glibc's exit() first runs the calling
/// thread's thread_local destructors, then the atexit handlers and the
/// statics' destructors. So when the main thread exits the process (main
/// returns, or it calls exit()), this runs before every static's destructor,
/// wherever that static was registered: what one atexit handler cannot do
/// (a static registered after it is destroyed before it runs).
struct exit_sentinel {
  exit_sentinel()                                = default;
  exit_sentinel(exit_sentinel const&)            = delete;
  exit_sentinel& operator=(exit_sentinel const&) = delete;
  ~exit_sentinel()
  {
    mark_exiting();
  }
};

/// Gives the main thread its sentinel (once; other threads get none: their
/// thread_local objects go when they end, not when the process does).
void watch_main_thread() noexcept
{
  if (::gettid() != ::getpid()) { return; }
  thread_local exit_sentinel sentinel;
  static_cast<void>(&sentinel);
}

/// Registers the handler if the watch has not reached `state` yet.
void watch_until(watch_state state) noexcept
{
  if (watched.load(std::memory_order_acquire) >= state) { return; }
  std::lock_guard lock(registering);
  if (watched.load(std::memory_order_relaxed) >= state) { return; }
  // RMM registers the handler behind rmm::process_is_exiting() once, right
  // after it makes its per-device resource map: have it made now (if it was
  // not), so that RMM's handler is registered before ours and runs after it.
  static_cast<void>(rmm::mr::detail::get_ref_map());
  // A failed registration only loses this chance to see the exit coming; the
  // next resource tries again.
  if (std::atexit(mark_exiting) != 0) { return; }
  registrations.fetch_add(1, std::memory_order_relaxed);
  watched.store(state, std::memory_order_release);
}

}  // namespace

void watch_process_exit() noexcept
{
  watch_main_thread();
  watch_until(watch_state::after_cuda);
}

void watch_process_exit_before_cuda() noexcept
{
  watch_main_thread();
  watch_until(watch_state::before_cuda);
}

std::size_t process_exit_registrations() noexcept
{
  return registrations.load(std::memory_order_relaxed);
}

bool cuda_is_unloading(cudaError_t err) noexcept
{
  if (err != cudaErrorCudartUnloading) { return false; }
  mark_exiting();
  return true;
}

}  // namespace rmmd::detail
