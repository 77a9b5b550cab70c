#pragma once

// Packed blocks: blocks of a CUDA pool that the daemon leases to one session
// each and carves that session's small direct allocations out of, so that
// one export and one import serve many allocations (core_options::pack_up_to).
//
// Owns: every session's packed blocks (their memory, the ranges carved out of
// them, whether they were retired), the block ids, the retire notifier, and
// the idle-block sweeper: a thread that, while any block exists, asks
// sessions for the empty blocks they kept longer than pack_idle.
//
// Lock discipline: guarded by the core's mutex, which the constructor is
// given. REQUIRES: every member but the constructor and the destructor is
// called with it held. The sweeper takes it itself; the destructor stops the
// sweeper, and must not be called with it held.
//
// Bookkeeping only: the core charges a block to its pool, session and uid,
// and calls the backend to allocate and free it.

#include "daemon/core/core_entries.hpp"
#include "daemon/core/lease_ledger.hpp"
#include "daemon/core/offset_allocator.hpp"
#include "daemon/core/pool_backend.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/statusor.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <thread>
#include <vector>

namespace rmmd::core {

/// Asks session `session` to let go of its packed blocks `blocks` of `pool`,
/// which hold none of its leases (see lease_allocator::drop_blocks). Returns how
/// many of `blocks`, from the first, the session was asked for (the others
/// could not be sent: they stay the session's to carve from, and are asked
/// for again later). Must not block and must not call the core: it is called
/// with the core's lock held.
using retire_notifier = std::function<std::size_t(
    session_id session, pool_id pool, std::vector<block_id> const& blocks)>;

class packed_blocks {
 public:
  /// `pack_up_to` is lowered to `block_size`. Starts the idle-block sweeper,
  /// which sweeps a few times per `idle`.
  packed_blocks(std::mutex& core_mutex,
                std::size_t pack_up_to,
                std::size_t block_size,
                std::chrono::milliseconds idle);
  packed_blocks(packed_blocks const&)            = delete;
  packed_blocks& operator=(packed_blocks const&) = delete;
  ~packed_blocks();

  /// Who carries RetireBlocks to sessions. Without one, a session's empty
  /// blocks stay with it until it ends, and count as nothing reclaimable.
  void set_retire_notifier(retire_notifier notify);

  /// Packs requests of at most `bytes` from now on (lowered to the block
  /// size; 0: none). Blocks already leased stay.
  void set_pack_up_to(std::size_t bytes) noexcept;

  [[nodiscard]] std::size_t block_size() const noexcept
  {
    return block_size_;
  }

  /// Whether a request of `bytes` aligned to `alignment` to a pool of
  /// `capacity` is small enough to pack (only CUDA pools pack: the caller
  /// checks the pool's kind).
  [[nodiscard]] bool packs(std::size_t capacity,
                           std::size_t bytes,
                           std::size_t alignment) const noexcept
  {
    return pack_up_to_ > 0 && bytes <= pack_up_to_ && alignment <= default_alignment &&
           block_size_ <= capacity;
  }

  /// A range carved out of a block: the lease the core records.
  struct carving {
    block_id block{};
    backend_allocation const* memory{};  ///< the whole block (valid until the next call)
    lease range;                         ///< packed; its offset and address in the block
  };

  /// A range of `bytes` for `session` out of one of its blocks of `pool`
  /// with room, or nullopt when none has.
  std::optional<carving> carve(session_id session,
                               pool_id pool,
                               std::size_t bytes,
                               std::size_t alignment);

  /// Adds a block the backend just allocated (charged by the caller) to
  /// `session`'s blocks of `pool`.
  void add(session_id session, pool_id pool, backend_allocation memory);

  /// Whether room is wanted in a pool: a request waits for it, or the pool is
  /// under pressure. Read only when a block falls empty.
  struct room_signal {
    bool waiting{};
    std::chrono::steady_clock::time_point pressure_until{};
  };

  /// Gives a packed lease's range back to its block. Retires the block when
  /// it is empty and the session has another empty one there, or when room
  /// is wanted (`room`).
  void release(session_id session, lease const& range, room_signal room) noexcept;

  /// A block that leaves: the caller frees its memory and uncharges it.
  struct leaving {
    pool_id pool{};
    backend_allocation memory;
  };

  /// The blocks `ids` of `session`, which its client dropped, leave.
  /// NOT_FOUND for a block the session does not hold, FAILED_PRECONDITION
  /// for one not retired (then none leaves). A block named twice leaves once.
  absl::StatusOr<std::vector<leaving>> drop(session_id session, std::span<block_id const> ids);

  /// Every block of `session` leaves (its session closed).
  std::vector<leaving> take_all(session_id session);

  /// Retires every empty block of `pool` (an operator's trim).
  void retire_empty(pool_id pool) noexcept;

  /// A block asked back, until its session drops it (or ends).
  struct retired_block {
    session_id session{};
    std::uintptr_t base{};
    block_id id{};
  };

  /// Retires empty blocks of `pool` of sessions other than `requester` until
  /// `wanted` bytes are asked for; returns the bytes asked for, and appends
  /// the blocks to `retired`.
  std::size_t retire_for_room(pool_id pool,
                              session_id requester,
                              std::size_t wanted,
                              std::vector<retired_block>& retired);

  /// Whether `r` (of `pool`) has been dropped, or went with its session.
  [[nodiscard]] bool gone(pool_id pool, retired_block const& r) const;

  /// Bytes of empty, unretired blocks of `pool` that sessions other than
  /// `requester` could give back (0 without a retire notifier).
  [[nodiscard]] std::size_t reclaimable(pool_id pool, session_id requester) const;

  /// `session`'s blocks per pool: their bytes not carved (idle), and of
  /// those the bytes of empty unretired blocks (reclaimable).
  [[nodiscard]] std::map<pool_id, idle_slabs> idle(session_id session) const;

 private:
  struct block {
    block_id id{};
    backend_allocation memory;  ///< the block, with its export data
    offset_allocator ranges;    ///< offsets into it (pure arithmetic)
    std::size_t leases{};       ///< live leases carved out of it
    std::size_t lease_bytes{};  ///< their bytes
    /// Asked to be dropped: nothing more is carved out of it, and it goes
    /// once the client says it freed its import (or with the session).
    bool retired{false};
    std::chrono::steady_clock::time_point empty_since{};  ///< when `leases` last fell to 0
  };
  /// A session's blocks of one pool, by the block's address in the daemon
  /// (a lease's address finds its block).
  using pool_blocks    = std::map<std::uintptr_t, block>;
  using session_blocks = std::map<pool_id, pool_blocks>;

  /// Asks `session` to drop `ids` of `pool` and marks retired those it was
  /// asked for (the first ones: see retire_notifier).
  void retire(session_id session, pool_id pool, std::vector<block_id> const& ids) noexcept;
  void retire_idle() noexcept;
  void sweep_idle_blocks(std::stop_token stop);

  std::mutex& mutex_;  // the core's
  std::size_t pack_up_to_;
  std::size_t const block_size_;
  std::chrono::milliseconds const idle_;
  retire_notifier retire_notify_;
  block_id next_block_{1};
  std::size_t count_{};  // blocks of every session: while any, the sweeper sweeps
  std::map<session_id, session_blocks> by_session_;
  std::condition_variable_any blocks_exist_;
  std::jthread idle_sweeper_;  // last: stops (and joins) before the rest is destroyed
};

}  // namespace rmmd::core
