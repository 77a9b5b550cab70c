#pragma once

#include "daemon/core/pool_backend.hpp"
#include "daemon/core/types.hpp"

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace rmmd::core {

/// One allocation lent to one session: what the daemon needs to give it back,
/// nothing more. A busy node holds a million of these, so they stay small (32
/// bytes; 40 with the id in the table): no export data (the client has it),
/// no strings, no times.
struct lease {
  pool_id pool{};
  /// Carved out of one of its session's packed blocks (lease_allocator::allocate's
  /// may_pack): `address` lies in that block, `offset` is its place there,
  /// and the backend has nothing of its own to free.
  bool packed{false};
  std::size_t bytes{};     ///< bytes the backend reserved (packed: the block's range)
  std::uint64_t offset{};  ///< backend_allocation::offset
  void* address{};         ///< backend_allocation::address

  /// What the backend handed out, less the export data (which deallocate()
  /// does not need).
  [[nodiscard]] backend_allocation block() const
  {
    return backend_allocation{.bytes = bytes, .offset = offset, .address = address};
  }
};

static_assert(sizeof(lease) == 32, "a lease is kept a million times: keep it small");

/// The leases of one session, by id.
using lease_table = absl::flat_hash_map<allocation_id, lease>;

/// Every live lease, kept per owning session: a lease is found by its owner
/// and id (every call comes from the owner), and a closing session takes its
/// whole table at once. Ids come from one counter: unique across sessions,
/// never reused. Not thread-safe.
///
/// Memory: one open-addressing table per session that has held a lease, 41
/// bytes a slot, at most 7/8 full: 47 to 94 bytes a live lease. A table
/// shrinks once it is 1/16 full (see erase), and goes with its session.
class lease_ledger {
 public:
  /// Records `l` as held by `owner` under a fresh id and returns that id.
  allocation_id record(session_id owner, lease l);

  /// The lease `owner` holds under `id`, or nullptr (held by another session,
  /// or by none).
  [[nodiscard]] lease const* find(session_id owner, allocation_id id) const;

  /// The session holding `id`, if any. Looks through every session: for the
  /// error path (telling "not yours" from "no such lease"), not per call.
  [[nodiscard]] std::optional<session_id> owner_of(allocation_id id) const;

  /// Removes and returns the lease. REQUIRES: find(owner, id) != nullptr.
  lease erase(session_id owner, allocation_id id);

  /// Removes and returns every lease `owner` holds (empty if none).
  lease_table take_all(session_id owner);

  /// Leases `owner` holds.
  [[nodiscard]] std::size_t held_count(session_id owner) const;

  /// Live leases of every session.
  [[nodiscard]] std::size_t size() const noexcept
  {
    return size_;
  }

 private:
  allocation_id next_id_{1};
  std::size_t size_{};
  absl::flat_hash_map<session_id, lease_table> by_owner_;  // owners without leases are absent
};

}  // namespace rmmd::core
