#pragma once

// The leases: allocating (a lease of its own, or one carved out of a
// session's packed block), freeing, the packed blocks a client dropped, the
// fast-path sessions' usage reports and the pressure they hear of, and the
// wait for other sessions' idle slabs when a pool is short.
//
// Owns: the lease ledger (which session holds which lease). The pools, the
// sessions' and uids' charges, the packed blocks and the reclaim
// coordinator are core_state's: buffers charge the same pools and quotas.
//
// Lock discipline: every public member takes the core's mutex itself, and
// lets go of it only where a comment says so: allocate() while the backend
// allocates (tens of us for a CUDA pool) and while it waits for idle slabs,
// having counted the bytes against the pool and quotas first and taking
// them back (and freeing the block) if the call fails in the end, so a
// rejected request never leaves partial state behind; free() while the
// backend frees, having taken the lease out of the ledger, uncharging the
// bytes once the backend has them back. The private members that end in
// `_locked` are called with the mutex held (daemon_core's among them).

#include "daemon/core/core_state.hpp"
#include "daemon/core/grants.hpp"
#include "daemon/core/lease_ledger.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstddef>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rmmd::core {

class lease_allocator {
 public:
  explicit lease_allocator(core_state& state) : state_(state) {}
  lease_allocator(lease_allocator const&)            = delete;
  lease_allocator& operator=(lease_allocator const&) = delete;

  /// Who carries reclaim requests to sessions (the session listener). Call
  /// before serving requests; without one, a short pool refuses at once.
  void set_reclaim_notifier(reclaim_notifier notify);

  /// Who carries RetireBlocks to sessions (the session listener). Without
  /// one, a session's empty packed blocks stay with it until it ends.
  void set_retire_notifier(retire_notifier notify);

  /// INVALID_ARGUMENT (size 0, bad alignment, unknown pool),
  /// RESOURCE_EXHAUSTED (larger than the pool, quota, pool limit, backend out
  /// of memory),
  /// UNAVAILABLE (draining), UNAUTHENTICATED (session gone).
  ///
  /// When the pool lacks room for the request but other sessions report idle
  /// slabs there (slabs with nothing carved) that would make enough, it asks
  /// them through the reclaim notifier to give those back and waits, up to
  /// the reclaim timeout, for the room (`policy`); then it allocates, or
  /// refuses as it would have at once. A request that idle slabs cannot serve
  /// is refused at once. The wait holds no lock: other calls go on.
  ///
  /// With `may_pack`, a small request to a CUDA pool (up to pack_up_to)
  /// may be carved out of a packed block: a block the daemon leases to this
  /// session alone, charged to it and its uid like a lease of that size, and
  /// exported once. When no block of the session has room, a new one is
  /// leased; when the pool or a quota has no room for a block, the request
  /// is served as a lease of its own.
  absl::StatusOr<lease_grant> allocate(session_id session,
                                       pool_id pool,
                                       std::size_t bytes,
                                       std::size_t alignment,
                                       reclaim_policy policy = reclaim_policy::wait,
                                       bool may_pack         = false);

  /// allocate() for a caller whose thread must not block: where allocate()
  /// would wait for idle slabs to come back, answers reclaim_hold instead
  /// and changes nothing.
  answer_or_hold<lease_grant> allocate_or_hold(session_id session,
                                               pool_id pool,
                                               std::size_t bytes,
                                               std::size_t alignment,
                                               bool may_pack = false);

  /// The client has freed its imports of packed blocks `blocks`, which the
  /// daemon retired (retire_notifier): frees them. NOT_FOUND for a block the
  /// session does not hold, FAILED_PRECONDITION for one not retired (nothing
  /// is freed then); UNAUTHENTICATED (session gone).
  absl::Status drop_blocks(session_id session, std::span<block_id const> blocks);

  /// Frees the lease now. NOT_FOUND (unknown id, or already freed),
  /// PERMISSION_DENIED (held by another session).
  absl::Status free(session_id session, allocation_id id);

  /// A fast-path session's report of what it carved out of its slabs; each
  /// pool's figure replaces the last. Returns the pools under pressure (an
  /// allocation failed for want of memory there lately, or the operator asked
  /// for a trim), whose idle slabs the session should give back.
  /// INVALID_ARGUMENT (unknown pool, a pool twice, more carved than the
  /// session holds there; nothing is recorded), UNAUTHENTICATED (session gone).
  absl::StatusOr<std::vector<pool_id>> report_usage(session_id session,
                                                    std::vector<carved_usage> const& usage);

  /// Marks `pool` under pressure for a while (see report_usage).
  void signal_pressure(pool_id pool);

 private:
  friend class daemon_core;

  struct allocation_request {
    session_id session{};
    pool_id pool{};
    std::size_t bytes{};
    std::size_t alignment{};
    short_of_room when_short{};
    bool may_pack{};
  };

  /// Charges `charge` bytes to pool `pool`, session `s` and its uid, lets go
  /// of the lock while `backend_call` runs (other sessions' calls go on
  /// meanwhile, and concurrent requests cannot together overrun a quota or
  /// the pool), takes the lock and the charge back, and finds the session
  /// again. Returns what `backend_call` returned and the session, or nullptr
  /// when it closed meanwhile (its leases are gone, not this charge).
  template <class BackendCall>
  auto call_backend_charged(std::unique_lock<std::mutex>& lock,
                            pool_id pool,
                            session_entry& s,
                            std::size_t charge,
                            BackendCall&& backend_call);

  /// allocate() but for the reclaim counters; `waited` is set once it waited.
  answer_or_hold<lease_grant> allocate_once(allocation_request const& r, bool& waited);
  answer_or_hold<lease_grant> allocate_counted(allocation_request const& r);
  /// A packed lease for `s` out of one of its blocks with room, or nullopt.
  std::optional<lease_grant> carve_packed_locked(session_entry& s,
                                                 pool_entry& p,
                                                 allocation_request const& r,
                                                 std::size_t alignment);
  /// A packed lease out of a new block for `s`, or nullopt when there is no
  /// room for a block (the caller serves the request unpacked). Lets go of
  /// the lock while the backend allocates.
  std::optional<absl::StatusOr<lease_grant>> pack_in_new_block_locked(
      std::unique_lock<std::mutex>& lock,
      session_entry& s,
      allocation_request const& r,
      std::size_t alignment);
  /// A lease of its own from the backend, charged `charge` while it works.
  answer_or_hold<lease_grant> lease_from_backend_locked(std::unique_lock<std::mutex>& lock,
                                                        session_entry& s,
                                                        allocation_request const& r,
                                                        std::size_t alignment,
                                                        std::size_t charge,
                                                        request_text const& what,
                                                        bool& waited);
  /// Short of room that other sessions' idle slabs would make: holds, or
  /// asks them and waits. Returns the refusal or hold that ends the request,
  /// or nullopt when it goes on (with `s` found again).
  std::optional<answer_or_hold<lease_grant>> wait_for_room_locked(
      std::unique_lock<std::mutex>& lock,
      session_entry*& s,
      allocation_request const& r,
      std::size_t charge,
      request_text const& what,
      bool& waited);

  void release_lease_locked(session_id session, allocation_id id) noexcept;
  /// Frees every lease and packed block `s` holds, in one batch per pool (a
  /// closing session).
  void release_all_leases_locked(session_entry& s) noexcept;
  /// How many leases `session` holds.
  [[nodiscard]] std::size_t held_count_locked(session_id session) const
  {
    return ledger_.held_count(session);
  }

  core_state& state_;
  lease_ledger ledger_;
};

}  // namespace rmmd::core
