#pragma once

// Reclaim: a request whose pool is short waits, up to reclaim_timeout, while
// the sessions that hold idle slabs or empty packed blocks there are asked to
// give them back (DESIGN.md, "Memory that moves").
//
// Owns: the reclaim notifier, the timeout, the count of requests waiting for
// room and the condition they wait on.
//
// Lock discipline: guarded by the core's mutex. REQUIRES: every member is
// called with it held; wait_for_room() lets go of it (through the caller's
// lock) while it notifies sessions and waits.

#include "daemon/core/core_entries.hpp"
#include "daemon/core/packed_blocks.hpp"
#include "daemon/core/types.hpp"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>

namespace rmmd::core {

/// Asks session `session` to give back its idle slabs of `pool` now: `bytes`
/// is what the waiting request still lacks. Must not block (it sends one
/// datagram); called without the core's lock.
using reclaim_notifier = std::function<void(session_id session, pool_id pool, std::size_t bytes)>;

class reclaim_coordinator {
 public:
  explicit reclaim_coordinator(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  void set_notifier(reclaim_notifier notify)
  {
    notify_ = std::move(notify);
  }
  void set_timeout(std::chrono::milliseconds timeout) noexcept
  {
    timeout_ = timeout;
  }

  /// Whether a short request may wait at all: a notifier is set and the
  /// timeout is not 0.
  [[nodiscard]] bool enabled() const noexcept
  {
    return timeout_.count() > 0 && notify_ != nullptr;
  }

  /// Idle slab bytes (and empty packed blocks) that sessions other than
  /// `requester` could give back in `pool`.
  [[nodiscard]] std::size_t reclaimable(session_map const& sessions,
                                        packed_blocks const& blocks,
                                        pool_id pool,
                                        session_id requester) const;

  /// Whether a request charging `charge` to `p` lacks room that other
  /// sessions' idle slabs could make: then worth a wait.
  [[nodiscard]] bool could_serve(session_map const& sessions,
                                 packed_blocks const& blocks,
                                 pool_entry const& p,
                                 pool_id pool,
                                 session_id requester,
                                 std::size_t charge) const;

  /// What wait_for_room() waits for, and what stops it early.
  struct wait_request {
    pool_id pool{};
    session_id requester{};
    std::size_t charge{};
    /// 0: until the pool has room for `charge`. Otherwise (the ledger had
    /// room, the backend did not): asks for that many bytes and waits until
    /// what it asked for is back.
    std::size_t ask_for{};
  };

  /// Asks sessions holding reclaimable slabs of the pool to give them back
  /// (empty packed blocks first, then as many sessions as the room needs,
  /// those with the most first), then waits until the room is there, the
  /// deadline, the requester's end or `draining`. Lets go of the lock while
  /// it notifies and waits. Returns whether the room is there.
  bool wait_for_room(std::unique_lock<std::mutex>& lock,
                     session_map const& sessions,
                     packed_blocks& blocks,
                     pool_entry const& p,
                     wait_request const& request,
                     bool const& draining);

  /// Wakes the waiters to look again (room came back, a session ended).
  void room_changed() noexcept
  {
    if (waiters_ > 0) { room_changed_.notify_all(); }
  }

  /// Waits, letting go of the lock, until room_changed() or `deadline` (a
  /// wake waiting for others to free memory).
  void wait_for_change(std::unique_lock<std::mutex>& lock,
                       std::chrono::steady_clock::time_point deadline)
  {
    ++waiters_;
    room_changed_.wait_until(lock, deadline);
    --waiters_;
  }

  /// Whether a request waits for room now.
  [[nodiscard]] bool waiting() const noexcept
  {
    return waiters_ > 0;
  }

 private:
  reclaim_notifier notify_;  // set before serving
  std::chrono::milliseconds timeout_;
  std::condition_variable room_changed_;  // a pool got room, a session's end, a drain
  std::size_t waiters_{};                 // requests waiting on room_changed_
};

}  // namespace rmmd::core
