#pragma once

// The fast path of rmmd::ipc_memory_resource (allocation_mode::slab): RMM's
// pool_memory_resource over the resource's own direct path (one per carving
// lane: a lane per thread that allocates, up to a bound, made when a second
// thread comes), plus a thread that reports what was carved and gives idle
// slabs back.

#include "client/lane_chooser.hpp"

#include <rmmd/ipc_memory_resource.hpp>

#include <rmm/mr/pool_memory_resource.hpp>

#include <array>
#include <atomic>
#include <chrono>
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
  /// The most carving lanes a resource may have (ipc_resource_options).
  static constexpr std::size_t max_lanes = 16;
  /// How many lanes automatic lanes (auto_carving_lanes) may grow to: the
  /// CPUs this process may run on, 1 to max_lanes.
  [[nodiscard]] static std::size_t auto_lanes() noexcept;

  /// `owner` outlives the carver (it owns it). Throws rmmd::logic_error when
  /// the options ask for more than max_lanes.
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

  /// Gives back the slabs of every lane nothing is carved from; returns
  /// their bytes.
  std::size_t trim() noexcept;

  /// What is carved now (the keeper reports it): allocations not yet freed
  /// (allocate() calls under way included), and their bytes as RMM's pool
  /// carves them (rounded up to 256 bytes).
  struct carved_figures {
    std::size_t count{};
    std::size_t bytes{};
  };
  /// Each lane's from one read of its word, so that they agree (a count of 0
  /// with bytes left would be a report the daemon refuses).
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
  /// One RMM pool and its bookkeeping. A resource has up to lane_count_ of
  /// them: a thread's allocations are carved by that thread's lane
  /// (lane_chooser), so that threads do not share RMM's pool mutex. A lane
  /// makes its pool (and leases its first slab) when it first carves.
  struct lane {
    /// The lane's whole bookkeeping per call is one atomic add to this word
    /// (allocate() adds carving(bytes) before it touches the pool,
    /// deallocate() takes it off after). While it counts anyone, `pool`
    /// stays: trim() takes the pool only by closing a word of zero. So
    /// carving calls take no lock of ours (RMM's pool has its own), and the
    /// keeper reads the figures it reports from the same word.
    alignas(64) std::atomic<std::uint64_t> users{closed};
    /// Makes and takes `pool` (never held by a carving call).
    alignas(64) std::mutex pool_mutex;
    std::unique_ptr<rmm::mr::pool_memory_resource> pool;
    std::atomic<std::size_t> slab_bytes{0};  // leased by the pool from the daemon
    /// Lanes but the first: their slabs' address ranges, [begin, end) in
    /// slots 2i and 2i+1, so that deallocate() finds a pointer's lane (one
    /// not in any other lane's slabs is the first lane's). Written by the
    /// pool's upstream (under RMM's pool mutex, or by trim() with the pool
    /// taken), read without a lock; `slots` bounds the scan.
    static constexpr std::size_t max_slabs = 32;
    std::array<std::atomic<std::uintptr_t>, 2 * max_slabs> ranges{};
    std::atomic<std::size_t> slots{0};
    /// Something was freed into the pool on cudaStreamPerThread, whose
    /// events RMM keeps per thread, out of reach of the pool's own wait: a
    /// trim of this lane then waits for the whole device (trim_lanes()).
    std::atomic<bool> per_thread_frees{false};
    [[nodiscard]] bool holds(std::uintptr_t p) const noexcept;
    [[nodiscard]] carved_figures carved() const noexcept;
  };

  using clock = std::chrono::steady_clock;
  /// What the keeper remembers between its ticks.
  struct keeper_state {
    carved_figures reported{};  // as last reported
    std::size_t reported_slabs{};
    clock::time_point last_report{};
    std::array<clock::time_point, max_lanes> idle_since{};  // by lane: last seen carving
    bool reporting{true};                                   // until the daemon is gone
  };
  /// The keeper: reports carved usage and its slabs (when they change, and
  /// every second while slabs are held, to hear of pressure), and trims when
  /// idle, pressed, or asked by the daemon (a reclaim request: at once).
  void keep(std::stop_token stop) noexcept;
  /// One tick of the keeper: `asked` when the daemon asked for idle slabs.
  void keep_once(keeper_state& state, bool asked) noexcept;
  /// Notes which lanes carve now (their idle time starts again); returns
  /// whether any lane holds slabs.
  bool note_idle_lanes(keeper_state& state, clock::time_point now) noexcept;
  /// Reports when the figures changed, or every second while `holding`;
  /// returns whether the daemon named this pool as under pressure.
  bool report_if_due(keeper_state& state, bool holding, clock::time_point now) noexcept;
  /// Reports the figures now (after a trim, or answering a reclaim request).
  void report_now(keeper_state& state, clock::time_point now) noexcept;
  /// What the daemon of `generation` hears: carved bytes, the slabs (those
  /// it lent), and the reclaimable ones.
  [[nodiscard]] carved_usage usage(carved_figures carved,
                                   std::size_t slabs,
                                   std::uint32_t generation) const noexcept;
  /// The slabs of the lanes nothing is carved from.
  [[nodiscard]] std::size_t reclaimable_bytes() const noexcept;
  /// allocate() when the lane's word says closed: makes its pool (leasing its
  /// first slab) unless another thread did, and opens it.
  void open_pool(lane& l);
  /// allocate() in one lane (inline: the fast path's only call is RMM's).
  [[nodiscard, gnu::always_inline]] void* carve(lane& l,
                                                cuda::stream_ref stream,
                                                std::size_t bytes,
                                                std::size_t alignment);
  /// carve() where the lane's pool must lease a slab (capture_checks::
  /// slow_path_only): on a capturing stream, takes `counted` off the lane's
  /// word and returns a lease of its own (the owner's allocate_captured());
  /// else nullptr, and the pool carves (and grows) as usual.
  [[nodiscard, gnu::noinline]] void* lease_if_capturing(lane& l,
                                                        std::uint64_t counted,
                                                        cuda::stream_ref stream,
                                                        std::size_t bytes,
                                                        std::size_t alignment);
  /// Throws the logic_error of an alignment above 256 bytes.
  [[noreturn, gnu::cold]] void refuse_alignment(std::size_t bytes, std::size_t alignment) const;
  /// The lane whose slab holds `ptr` (`hint` is tried first). Once lanes
  /// spread: before, every pointer is lane 0's.
  [[nodiscard]] std::size_t lane_of(void const* ptr, std::size_t hint) const noexcept;
  /// Gives back the slabs of the lanes that `which` picks and from which
  /// nothing is carved; returns their bytes.
  template <typename Pick>
  std::size_t trim_lanes(Pick which) noexcept;
  [[nodiscard]] std::size_t slab_bytes() const noexcept;

  // A lane's `users`, from the top bit down: `closed` (its pool may not be
  // used: there is none yet, or trim() is taking it; allocate() then takes
  // open_pool()'s way), the count of carved allocations (28 bits: 268 M),
  // and their bytes in units of 256 (35 bits: 8 TiB).
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
  /// A stream of the pool's device of the carver's own (non-blocking; null
  /// if CUDA would not make one): a trim gives slabs back in its order,
  /// never in the legacy stream's, which another thread's capture forbids.
  cudaStream_t release_stream_{};
  std::size_t const lane_count_;
  std::array<lane, max_lanes> lanes_;  // the first lane_count_ may be used
  lane_chooser chooser_;               // which lane serves the calling thread
  /// capture_checks::slow_path_only: allocate() asks for capture only where
  /// the lane's pool would lease a slab (the owner asked on every call else).
  bool const asks_on_slow_path_;
  std::mutex keeper_mutex_;
  std::condition_variable_any keeper_wake_;
  bool reclaim_asked_{false};  // guarded by keeper_mutex_: the daemon asked for idle slabs
  std::uint64_t reclaim_watch_{};
  std::jthread keeper_;  // last: stops before the rest goes
};

}  // namespace rmmd::detail
