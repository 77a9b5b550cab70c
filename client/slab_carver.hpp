#pragma once

// The fast path of rmmd::ipc_memory_resource (allocation_mode::slab): RMM's
// pool_memory_resource over the resource's own direct path, plus a thread
// that reports what was carved and gives idle slabs back.

#include <rmmd/ipc_memory_resource.hpp>

#include <rmm/mr/pool_memory_resource.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stop_token>
#include <thread>

namespace rmmd::detail {

class slab_carver {
 public:
  /// `owner` outlives the carver (it owns it).
  explicit slab_carver(ipc_memory_resource_impl& owner);
  slab_carver(slab_carver const&)            = delete;
  slab_carver& operator=(slab_carver const&) = delete;
  /// Stops the keeper and gives every slab back (not while the process exits).
  ~slab_carver();

  [[nodiscard]] void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment);
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment) noexcept;

  /// Stops the keeper and forgets the slabs without a CUDA or daemon call
  /// (the process exits: the daemon reclaims them with the session).
  void abandon() noexcept;

  /// Gives the slabs back if nothing is carved from them; returns their bytes.
  std::size_t trim() noexcept;

 private:
  /// The keeper: reports carved usage and its slabs (when they change, and
  /// every second while slabs are held, to hear of pressure), and trims when
  /// idle, pressed, or asked by the daemon (a reclaim request: at once).
  void keep(std::stop_token stop) noexcept;

  ipc_memory_resource_impl& owner_;
  // Shared for allocate/deallocate, exclusive to create or drop the pool.
  std::shared_mutex pool_mutex_;
  std::unique_ptr<rmm::mr::pool_memory_resource> pool_;
  std::atomic<std::size_t> carved_bytes_{0};
  std::atomic<std::size_t> carved_count_{0};
  std::atomic<std::size_t> slab_bytes_{0};  // leased by the pool from the daemon
  std::mutex keeper_mutex_;
  std::condition_variable_any keeper_wake_;
  bool reclaim_asked_{false};  // guarded by keeper_mutex_: the daemon asked for idle slabs
  std::uint64_t reclaim_watch_{};
  std::jthread keeper_;  // last: stops before the rest goes
};

}  // namespace rmmd::detail
