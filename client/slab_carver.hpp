#pragma once

// The fast path of rmmd::ipc_memory_resource (allocation_mode::slab): RMM's
// pool_memory_resource over the resource's own direct path, plus a thread
// that reports what was carved and gives idle slabs back.

#include <rmmd/ipc_memory_resource.hpp>

#include <rmm/mr/pool_memory_resource.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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

  /// What is carved now (the keeper reports it): allocations not yet freed
  /// (allocate() calls under way included), and their bytes as RMM's pool
  /// carves them (rounded up to 256 bytes).
  struct carved_figures {
    std::size_t count{};
    std::size_t bytes{};
  };
  /// Both from one read of the word, so that they agree (a count of 0 with
  /// bytes left would be a report the daemon refuses).
  [[nodiscard]] carved_figures carved() const noexcept;
  [[nodiscard]] std::size_t carved_count() const noexcept
  {
    return carved().count;
  }
  [[nodiscard]] std::size_t carved_bytes() const noexcept
  {
    return carved().bytes;
  }

 private:
  /// The keeper: reports carved usage and its slabs (when they change, and
  /// every second while slabs are held, to hear of pressure), and trims when
  /// idle, pressed, or asked by the daemon (a reclaim request: at once).
  void keep(std::stop_token stop) noexcept;
  /// allocate() when users_ says closed: makes the pool (leasing its first
  /// slab) unless another thread did, and opens it.
  void open_pool();

  // users_, from the top bit down: `closed` (pool_ may not be used: there is
  // none yet, or trim() is taking it; allocate() then takes open_pool()'s
  // way), the count of carved allocations (28 bits: 268 M), and their bytes
  // in units of 256 (35 bits: 8 TiB).
  static constexpr std::uint64_t closed     = std::uint64_t{1} << 63;
  static constexpr unsigned count_shift     = 35;
  static constexpr std::uint64_t one_carved = std::uint64_t{1} << count_shift;
  static constexpr std::uint64_t units_mask = one_carved - 1;
  static constexpr std::uint64_t count_mask = (closed - 1) & ~units_mask;
  static constexpr unsigned unit_shift      = 8;  // RMM's pool carves in 256 bytes
  [[nodiscard]] static constexpr std::uint64_t carving(std::size_t bytes) noexcept
  {
    return one_carved + ((std::uint64_t{bytes} + (1u << unit_shift) - 1) >> unit_shift);
  }

  ipc_memory_resource_impl& owner_;
  /// The carver's whole bookkeeping per call is one atomic add to this word
  /// (allocate() adds carving(bytes) before it touches the pool, deallocate()
  /// takes it off after). While it counts anyone, pool_ stays: trim() takes
  /// the pool only by closing a word of zero. So carving calls take no lock
  /// of ours (RMM's pool has its own), and the keeper reads the figures it
  /// reports from the same word.
  alignas(64) std::atomic<std::uint64_t> users_{closed};
  /// Makes and takes pool_ (never held by a carving call).
  alignas(64) std::mutex pool_mutex_;
  std::unique_ptr<rmm::mr::pool_memory_resource> pool_;
  std::atomic<std::size_t> slab_bytes_{0};  // leased by the pool from the daemon
  std::mutex keeper_mutex_;
  std::condition_variable_any keeper_wake_;
  bool reclaim_asked_{false};  // guarded by keeper_mutex_: the daemon asked for idle slabs
  std::uint64_t reclaim_watch_{};
  std::jthread keeper_;  // last: stops before the rest goes
};

}  // namespace rmmd::detail
