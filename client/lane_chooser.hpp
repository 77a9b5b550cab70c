#pragma once

// Which carving lane of a slab-mode resource serves the calling thread
// (client/slab_carver.hpp). Threads of one process that carve from one RMM
// pool queue on its mutex; a lane per thread, up to a bound, keeps them
// apart, and a process whose one thread allocates keeps a single lane.
//
// Owns: the thread that carves alone (while only one has), and the table of
// threads seen with their lanes. Lock-free on every call; spread() takes
// spread_mutex_ once, when the second thread comes.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#if !defined(__has_builtin)
#define __has_builtin(x) 0
#endif
#if !__has_builtin(__builtin_thread_pointer)
#include <pthread.h>
#endif

namespace rmmd::detail {

class lane_chooser {
 public:
  /// `lanes`: how many lanes there may be (1 or more). `per_thread_at_once`:
  /// threads take lanes round-robin from their first call (an explicit
  /// carving_lanes above 1); otherwise the first thread carves alone in lane
  /// 0, and lanes are per thread from the moment a second thread calls
  /// pick() (automatic lanes; never with one lane).
  lane_chooser(std::size_t lanes, bool per_thread_at_once) noexcept
      : lanes_(lanes), solo_(per_thread_at_once && lanes > 1 ? many : nobody)
  {
  }
  lane_chooser(lane_chooser const&)            = delete;
  lane_chooser& operator=(lane_chooser const&) = delete;

  /// The calling thread's lane, below lanes(); a thread seen for the first
  /// time is given one. The thread carving alone pays one load and a
  /// compare.
  [[nodiscard, gnu::always_inline]] std::size_t pick() noexcept
  {
    auto const me = this_thread();
    if (solo_.load(std::memory_order_relaxed) == me) [[likely]] { return 0; }
    return pick_slow(me);
  }

  /// Whether every lane but the first is unused: until then every pointer
  /// is lane 0's. A thread that got a pointer from another thread (which
  /// the program synchronised with) sees the lanes spread if they had.
  [[nodiscard]] bool single() const noexcept
  {
    return solo_.load(std::memory_order_relaxed) != many;
  }

  /// The calling thread's lane if it has one, else 0 (a hint, for a free).
  [[nodiscard]] std::size_t hint() const noexcept;

  [[nodiscard]] std::size_t lanes() const noexcept
  {
    return lanes_;
  }

  /// How many threads have a lane of their own in the table (not counting
  /// those past its 64 slots, which share lanes by hash).
  [[nodiscard]] std::size_t threads_seen() const noexcept;

  /// A key for the calling thread, unique among live threads, never 0 or 1.
  [[nodiscard, gnu::always_inline]] static std::uintptr_t this_thread() noexcept
  {
#if __has_builtin(__builtin_thread_pointer)
    return reinterpret_cast<std::uintptr_t>(__builtin_thread_pointer());
#else
    return static_cast<std::uintptr_t>(pthread_self());
#endif
  }

 private:
  /// solo_: no thread has picked yet, or lanes are per thread.
  static constexpr std::uintptr_t nobody = 0;
  static constexpr std::uintptr_t many   = 1;

  [[gnu::noinline]] std::size_t pick_slow(std::uintptr_t me) noexcept;
  /// A second thread came: the one carving alone keeps lane 0 (in the table
  /// before solo_ says `many`), the next threads take lanes 1, 2, ...
  void spread(std::uintptr_t solo) noexcept;
  /// The lane of `thread` in the table; with `assign`, one is given to a
  /// thread not there yet (round-robin, by hash once the table is full).
  [[nodiscard]] std::size_t lane_of(std::uintptr_t thread, bool assign) noexcept;
  [[nodiscard]] std::size_t find(std::uintptr_t thread) const noexcept;

  std::size_t const lanes_;
  /// The thread carving alone (its key), `nobody`, or `many`.
  alignas(64) std::atomic<std::uintptr_t> solo_;
  /// Threads seen, with their lanes: key << 8 | lane (the key's low 56
  /// bits), 0 if free.
  static constexpr std::size_t slots = 64;
  std::atomic<std::uint64_t> threads_[slots]{};
  std::atomic<std::size_t> next_lane_{0};
  std::mutex spread_mutex_;
};

}  // namespace rmmd::detail
