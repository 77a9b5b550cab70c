#pragma once

// Address-stable memory that a sleep or a free gave back, kept for the
// next address-stable allocation or wake of the same uid on the device
// (--keep-released-memory), instead of going back to the driver at once.
//
// Why: the driver clears memory a process freed before it serves it again.
// On an H200 with no other free memory, a 60 GiB cuMemCreate right after
// 60 GiB were released waits 148 ms for that (about 2.4 ms per GiB,
// bench/experiments/vmm_handoff.cu); served from here it is a list of
// allocations the client maps one after another.
//
// Only the same uid gets a spare back. A client that kept the fd (or an
// import) of memory it put to sleep could read whatever the next owner
// writes there: memory for another uid comes from the driver, cleared.
// Spares are the daemon's memory but nobody's charge: the ledger shows them
// free, and every allocation of the device that finds it full gives them
// all back first (give_back()), as does a trim. A spare not taken within
// its time goes back by itself.
//
// Thread-safe. One per device, shared by that device's pools.

#include "daemon/core/pool_backend.hpp"

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

namespace rmmd::backends::cuda {

class spare_memory {
 public:
  using clock = std::chrono::steady_clock;

  /// The device's (every pool of it shares one; made by the first ask),
  /// or null when `keep_for` is 0.
  static std::shared_ptr<spare_memory> of_device(int device, std::chrono::milliseconds keep_for);

  spare_memory(int device, std::chrono::milliseconds keep_for);
  spare_memory(spare_memory const&)            = delete;
  spare_memory& operator=(spare_memory const&) = delete;
  /// Gives every spare back.
  ~spare_memory();

  /// Keeps `memory` (an allocation of its own with its fd; this takes it)
  /// for `owner`'s next allocation. REQUIRES: no process maps it any more
  /// (its next owner gets the same physical memory). Throws std::bad_alloc
  /// (the memory stays the caller's then).
  void keep(core::shared_allocation memory, uid_t owner);

  /// `owner`'s spares for an allocation of `bytes` (the caller's now): one
  /// of exactly `bytes` where there is one; else, where `max_pieces` > 1,
  /// the largest that fit one after another, at most `max_pieces` - 1 of
  /// them (room for a new piece) unless they fill `bytes` exactly.
  std::vector<core::shared_allocation> take(std::size_t bytes, uid_t owner, std::size_t max_pieces);

  /// Gives every spare back to the driver, and returns once what the
  /// expiry was giving back meanwhile is back too; returns the bytes it
  /// gave back itself.
  std::size_t give_back() noexcept;

  [[nodiscard]] std::size_t bytes() const noexcept
  {
    return bytes_.load(std::memory_order_relaxed);
  }
  /// Bytes given back to the driver since the start, by give_back() and by
  /// expiry: an allocation that failed retries where this grew meanwhile.
  [[nodiscard]] std::uint64_t released() const noexcept
  {
    return released_.load(std::memory_order_acquire);
  }

 private:
  struct spare {
    core::shared_allocation memory;
    uid_t owner{};
    clock::time_point until;
  };

  /// Gives back each spare whose time is up, until stopped.
  void expire(std::stop_token stop);
  /// Gives `taken` (out of spares_ already, so without mutex_) back to the
  /// driver under releasing_; returns their bytes.
  std::size_t release(std::vector<spare> const& taken) noexcept;

  int device_;
  std::chrono::milliseconds keep_for_;
  std::mutex mutex_;
  std::condition_variable_any changed_;
  std::vector<spare> spares_;  // guarded by mutex_
  std::atomic<std::size_t> bytes_{0};
  std::atomic<std::uint64_t> released_{0};
  /// Held while spares taken out of spares_ are given back (never with
  /// mutex_), so that give_back() returns after the expiry's batch.
  std::mutex releasing_;
  std::jthread expirer_;  // last: it reads the members above
};

}  // namespace rmmd::backends::cuda
