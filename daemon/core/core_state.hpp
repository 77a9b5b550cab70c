#pragma once

// The core's shared state: what more than one of its parts (sessions,
// leases, buffers, pools) reads or changes, and the one mutex that guards
// all of it. A request for memory is checked against the pool, the session's
// and its uid's quotas, and charged to all three at once (the all-or-nothing
// ledger): that is why the parts share one lock rather than each keeping
// its own.
//
// Owns: the pools (their backends per tenant and their counters), the open
// sessions, each uid's charged bytes, the shared buffers and their names,
// the address-stable allocations, the statistics' history, the restart summary, the reclaim
// coordinator, the packed blocks, the options in force and the drain flags. It also holds the
// helpers every part uses: finding a session, the checks of a request for memory, quotas and
// charges, pressure and the wait for reclaim.
//
// Lock discipline: `mutex` guards every member but `trim_mutex` and those
// a comment marks fixed. REQUIRES: every helper (the `_locked` ones) is
// called with `mutex` held; wait_for_reclaim_locked() lets go of it while it
// waits, through the caller's lock. `trim_mutex` serialises backends' trims
// and is never taken with `mutex` held.

#include "daemon/core/core_entries.hpp"
#include "daemon/core/core_options.hpp"
#include "daemon/core/core_stats.hpp"
#include "daemon/core/packed_blocks.hpp"
#include "daemon/core/reclaim_coordinator.hpp"
#include "daemon/core/request_text.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rmmd::core {

/// "N bytes", for messages.
[[nodiscard]] std::string bytes_text(std::size_t bytes);

/// Fills `out` from the kernel's random source (getrandom). Throws
/// std::runtime_error if it fails.
void random_bytes(std::span<std::byte> out);

/// How a request that finds its pool short goes on (reclaim_policy, plus
/// the hold of allocate_or_hold and create_buffer_or_hold).
enum class short_of_room : std::uint8_t { wait, hold, refuse };

/// A request's pool and alignment, once check_request_locked() passed.
struct checked_request {
  pool_entry* pool{};
  std::size_t alignment{};
};

struct core_state {
  explicit core_state(core_options given);
  core_state(core_state const&)            = delete;
  core_state& operator=(core_state const&) = delete;

  /// The session `id`, or nullptr (never opened, or closed).
  [[nodiscard]] session_entry* find_session_locked(session_id id) const;
  /// The session `id`, or UNAUTHENTICATED saying that `request` came from a
  /// closed session.
  [[nodiscard]] absl::StatusOr<session_entry*> session_locked(session_id id,
                                                              std::string_view request) const;

  /// The checks every request for memory passes (allocate, create_buffer):
  /// a known pool, a size of at least 1 byte and at most the pool's
  /// capacity, and an alignment (0: default_alignment) that is a power of
  /// two the pool accepts. `request` names it in messages.
  [[nodiscard]] absl::StatusOr<checked_request> check_request_locked(std::string_view request,
                                                                     pool_id pool,
                                                                     std::size_t bytes,
                                                                     std::size_t alignment) const;

  /// Adds (sign +1) or takes back (-1) `bytes` on the pool and the tenant's
  /// backend, the session (if still open) and the uid.
  void charge_locked(pool_entry& p,
                     session_entry* s,
                     uid_t uid,
                     tenant_key const& tenant,
                     pool_id pool,
                     std::size_t bytes,
                     int sign) noexcept;
  /// Takes `bytes` back from `uid`'s charge (forgetting a uid that holds 0).
  void uncharge_uid_locked(uid_t uid, std::size_t bytes) noexcept;

  /// Why the session's or its uid's quota cannot take `charge` more, if so.
  [[nodiscard]] std::optional<absl::Status> quota_refusal_locked(session_entry const& s,
                                                                 std::size_t charge,
                                                                 request_text const& what) const;
  /// Why `charge` more bytes for session `s` in pool `p` would break a quota
  /// or overrun the pool (`what`: the request, for the message), if it
  /// would; a pool short of room is marked under pressure.
  std::optional<absl::Status> refusal_locked(pool_entry& p,
                                             session_entry const& s,
                                             std::size_t charge,
                                             request_text const& what);

  /// Marks `pool` under pressure for a while (see lease_allocator::report_usage).
  static void signal_pressure_locked(pool_entry& pool);

  /// Whether other sessions' idle slabs could make `charge` bytes of room.
  [[nodiscard]] bool reclaim_could_serve_locked(pool_id pool,
                                                session_id requester,
                                                std::size_t charge) const;
  /// Waits for idle slabs as reclaim_coordinator::wait_for_room does.
  bool wait_for_reclaim_locked(std::unique_lock<std::mutex>& lock,
                               pool_id pool,
                               session_id requester,
                               std::size_t charge,
                               std::size_t ask_for = 0);

  mutable std::mutex mutex;
  std::mutex trim_mutex;  // one trim at a time; never held with `mutex`
  /// Access, quotas and the admin uid; reclaim_timeout, pack_up_to and the
  /// other packing settings as given at construction (reclaim and packed
  /// keep the ones in force). `tenancy` is fixed.
  core_options options;
  bool draining{false};
  bool sessions_closed{false};                     // stop_new_sessions() was called
  std::vector<std::unique_ptr<pool_entry>> pools;  // index == pool id; fixed once serving
  session_map sessions;
  std::unordered_map<uid_t, std::size_t> uid_bytes;  // leases, packed blocks and buffers
  std::map<buffer_id, std::unique_ptr<buffer_entry>> buffers;
  std::unordered_map<std::string, buffer_id> buffer_names;  // named buffers only (not deleted)
  std::condition_variable_any buffers_changed;              // a publish, a session's end, a drain
  std::map<stable_id, std::unique_ptr<stable_entry>> stables;  // address-stable allocations
  std::uint64_t wake_waits{};                                  // see stable_totals
  std::uint64_t wake_failures{};
  core_stats stats;
  restart_summary restart;
  reclaim_coordinator reclaim;
  packed_blocks packed;  // last: its sweeper stops (and joins) before the rest is destroyed
};

}  // namespace rmmd::core
