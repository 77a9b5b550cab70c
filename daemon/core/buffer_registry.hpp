#pragma once

// The named shared buffers (DESIGN.md, "Named shared buffers";
// docs/sharing.md has the rules from a user's side): creating, publishing,
// opening, closing and deleting them, their manifests, their write leases
// (docs/failover.md; buffer_leases.cpp), the buffers kept across a restart
// (buffer_keeper.hpp) and adopted after one, and peering's holds: this
// node's buffers held by other nodes' daemons (remote holds), and other
// nodes' buffers held by sessions here (foreign holds).
//
// Owns: the next buffer id, the remote holds, the opens waiting for a
// buffer or its write lease (and the next ticket of such a wait), the keeper
// and who is told of a foreign hold's end. The buffers (their leases among
// them) and their names are core_state's (stats read them; a buffer is
// charged to the same pools and quotas as leases).
//
// A buffer is charged once, when it is created: to its pool, to its
// creator's uid until it is freed, and to its creating session's quota
// while that session holds it. Holders are sessions (and remote holds); a
// session's end drops its holds (and frees what it created and never
// published).
//
// Lock discipline: every public member takes the core's mutex itself and
// lets go of it only where a comment says so (create_buffer while the
// backend allocates; open_buffer while it waits, for a buffer or for its
// write lease; publish_buffer while the keeper keeps; set_buffer_manifest
// while the manifest is checked; the foreign release notifier is called
// without it). The private members that
// end in `_locked` are called with the mutex held (daemon_core's among them).

#include "daemon/core/buffer_keeper.hpp"
#include "daemon/core/core_entries.hpp"
#include "daemon/core/core_state.hpp"
#include "daemon/core/grants.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::core {

class buffer_registry {
 public:
  explicit buffer_registry(core_state& state);
  buffer_registry(buffer_registry const&)            = delete;
  buffer_registry& operator=(buffer_registry const&) = delete;

  // Named shared buffers (DESIGN.md, "Named shared buffers"). Every call
  // answers UNAUTHENTICATED when the session is gone, and a refused call
  // changes nothing.

  /// A buffer of `bytes` in `pool`, held by `session` and visible to no other
  /// until published. INVALID_ARGUMENT (a name against the rule of
  /// common/buffer_name.hpp, size 0, alignment, unknown pool),
  /// ALREADY_EXISTS (the name is taken), RESOURCE_EXHAUSTED (quota, pool,
  /// larger than the pool),
  /// UNAVAILABLE (draining). The backend allocates without the lock; the name
  /// is taken meanwhile. A pool short of room waits for idle slabs as in
  /// lease_allocator::allocate() (`policy`), with the name not yet taken.
  absl::StatusOr<buffer_grant> create_buffer(session_id session,
                                             std::string_view name,
                                             pool_id pool,
                                             std::size_t bytes,
                                             buffer_options const& options,
                                             reclaim_policy policy = reclaim_policy::wait);

  /// create_buffer() for a caller whose thread must not block: see
  /// lease_allocator::allocate_or_hold().
  answer_or_hold<buffer_grant> create_buffer_or_hold(session_id session,
                                                     std::string_view name,
                                                     pool_id pool,
                                                     std::size_t bytes,
                                                     buffer_options const& options);

  /// Opens `id` to every allowed session and wakes those waiting for it.
  /// NOT_FOUND (no such buffer), FAILED_PRECONDITION (not the creating
  /// session, published already, or deleted).
  absl::Status publish_buffer(session_id session, buffer_id id);

  /// The published buffer named `name`; `session` holds it (once more) until
  /// it closes it or ends. NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION
  /// (not yet published; the creating session may open its own). Until
  /// `wait_until` it waits for the name to appear and be published (not for
  /// a permission), and answers UNAVAILABLE if the daemon drains meanwhile.
  /// `how`: read-write only for its creating session or where the creator
  /// allowed writers (PERMISSION_DENIED otherwise); labels it expects, in key
  /// order, else FAILED_PRECONDITION naming the first that differs. A
  /// refused open holds nothing.
  ///
  /// The write lease (docs/failover.md): with `how.exclusive` (and
  /// read_write; INVALID_ARGUMENT otherwise) the session takes the lease,
  /// a grant carrying its generation, when no other session holds it or a
  /// plain read-write open and nobody waits before it; else, until
  /// `wait_until`, it waits in line (first come, first served) and is
  /// granted when the holder closes it or its session ends; then
  /// DEADLINE_EXCEEDED naming the holder, and nothing changed. A session
  /// ending takes its waits out of line (UNAUTHENTICATED to them); a
  /// delete ends them (NOT_FOUND). FAILED_PRECONDITION: a second lease of
  /// the same session, or a plain read-write open while another session
  /// holds or waits for the lease.
  ///
  /// With `how.standby` too (a standby, docs/failover.md): the open does not
  /// wait for the lease (`wait_until` still bounds the wait for the buffer's
  /// publication). The session holds the buffer at once, with the lease
  /// where it is free (a grant with its generation) and else standing in
  /// line (lease_generation 0) until wait_buffer_lease() finds it granted;
  /// closing the open (hold_kind::lease) or the session's end takes it out
  /// of line. FAILED_PRECONDITION also when the session holds the lease or
  /// stands in line for it already.
  absl::StatusOr<buffer_grant> open_buffer(session_id session,
                                           std::string_view name,
                                           std::chrono::steady_clock::time_point wait_until = {},
                                           buffer_open_options const& how                   = {});

  /// The write lease of buffer `id` for the standby open `session` holds:
  /// its generation once granted (at once if it holds it already), waiting
  /// until `wait_until` for the grant. DEADLINE_EXCEEDED when the wait ends
  /// first (naming the holder; the standby stays in line: nothing changed),
  /// NOT_FOUND (the session does not hold the buffer, or it was deleted
  /// while the standby stood in line), FAILED_PRECONDITION (no standby open
  /// of the session stands in line for it), UNAVAILABLE (draining),
  /// UNAUTHENTICATED (the session ended, meanwhile too).
  absl::StatusOr<std::uint64_t> wait_buffer_lease(session_id session,
                                                  buffer_id id,
                                                  std::chrono::steady_clock::time_point wait_until);

  /// Replaces the manifest of buffer `id` (the daemon's own labels stay).
  /// INVALID_ARGUMENT (buffer_manifest_checks: the first problem, in words),
  /// NOT_FOUND (no such buffer), FAILED_PRECONDITION (not its creating
  /// session, or published or deleted already).
  absl::Status set_buffer_manifest(session_id session, buffer_id id, buffer_manifest manifest);

  /// The manifest of buffer `id`, which `session` holds; null when it has
  /// none. NOT_FOUND when the session does not hold it.
  absl::StatusOr<std::shared_ptr<buffer_manifest const>> buffer_manifest_of(session_id session,
                                                                            buffer_id id) const;

  /// The buffer named `name` with its manifest, where `session` may see it
  /// (as list_buffers); NOT_FOUND otherwise.
  absl::StatusOr<buffer_description> describe_buffer(session_id session,
                                                     std::string_view name) const;

  /// `session` lets go of one open (or its create) of `id`: one of `kind`
  /// where it has such an open, else another. NOT_FOUND when it holds none.
  /// Closing the exclusive open (hold_kind::lease), or the session's last
  /// open, ends its write lease, which goes to the next in line. The last
  /// holder's close frees a buffer that is not persistent, and a creator's
  /// close before publishing frees it always.
  absl::Status close_buffer(session_id session, buffer_id id, hold_kind kind = hold_kind::read);

  /// The fd of buffer `id`'s own allocation (owned by the backend or the
  /// core: send a copy), for a session that holds it. A host buffer's memfd
  /// comes read-only to a session that holds only read opens of it (a
  /// standby's, a writer's and the creator's is read-write). NOT_FOUND when
  /// it holds none, FAILED_PRECONDITION when the buffer has no fd (host
  /// pools: the offset in the pool's memfd is all it needs), INTERNAL when
  /// the read-only memfd cannot be made.
  absl::StatusOr<int> buffer_fd(session_id session, buffer_id id);

  /// Takes the name away; the memory goes after the last holder. Returns how
  /// many sessions hold it still. NOT_FOUND, PERMISSION_DENIED (neither the
  /// creator's uid nor root).
  absl::StatusOr<std::size_t> delete_buffer(session_id session, std::string_view name);

  /// The buffers `session` may see (see ListBuffers in rmmd.proto).
  /// Only those `filter` matches (its name prefix and every label).
  absl::StatusOr<std::vector<buffer_info>> list_buffers(session_id session,
                                                        buffer_filter const& filter = {}) const;

  /// Every buffer, deleted ones still held included (metrics, tests).
  [[nodiscard]] std::vector<buffer_info> all() const;

  /// Opens waiting now for a buffer to appear or be published, or for its
  /// write lease.
  [[nodiscard]] std::size_t waiting_opens() const;

  /// Write leases node-wide: held and waited for now, and what they did
  /// since the start (metrics).
  [[nodiscard]] lease_totals leases() const;

  // Buffers that outlive the daemon (buffer_keeper.hpp).

  /// Who keeps published buffers across a restart; null: nobody. From now
  /// on, every buffer published with an fd of its own is given to it, and
  /// every kept buffer deleted or freed is taken back from it. Call before
  /// serving requests, or with null at shutdown (before the sessions are
  /// closed, so that what their end frees stays kept).
  void set_buffer_keeper(std::shared_ptr<buffer_keeper> keeper);

  /// Serves a buffer the daemon before this one kept: published, held by no
  /// session, charged to its pool and to its creator's uid (not checked
  /// against quotas: the memory exists already). Persistent or not as
  /// recorded; a buffer that is not persistent goes when the last session
  /// that opens it after the restart lets go, or when it is deleted.
  /// INVALID_ARGUMENT (a bad name, an unknown pool, size 0 or above the
  /// allocation), ALREADY_EXISTS (the name is taken); `spec.memory` is not
  /// released then (the caller still owns it). Call before serving requests.
  absl::StatusOr<buffer_id> adopt_buffer(adopted_buffer_spec spec);

  // Peering (docs/operations.md, "Across nodes"): this node's buffers held
  // by other nodes' daemons, and other nodes' buffers held by sessions here.
  // The identity of a peer, its leases and its grants are the peering
  // layer's; the core keeps what a hold keeps alive.

  /// The published buffer named `name`, held for another node's daemon as a
  /// session holds it (it keeps the memory alive, counts in `holders`, a
  /// delete waits for it), charged to no uid, until close_remote_hold().
  /// Only a buffer with an allocation of its own that exports a fabric
  /// handle can be held so. `how` as open_buffer's (its access already
  /// narrowed by the peer's grant). INVALID_ARGUMENT (bad name), NOT_FOUND
  /// (no such buffer, or not published), FAILED_PRECONDITION (no fabric
  /// handle; a label differs), PERMISSION_DENIED (writing where the creator
  /// allowed no writers), UNAVAILABLE (draining).
  absl::StatusOr<remote_buffer_grant> open_remote_buffer(std::string_view name,
                                                         buffer_open_options const& how);

  /// The buffers open_remote_buffer() could hold now that `filter` selects
  /// and `may_list` lets through (a peer's grant, by name): published, with
  /// a fabric handle of their own. Listing another buffer would show a peer
  /// names it could never open. Sorted by name.
  [[nodiscard]] std::vector<buffer_info> list_remote_buffers(
      buffer_filter const& filter,
      std::function<bool(std::string const& name)> const& may_list) const;

  /// Ends remote hold `id` (the last holder's end frees the buffer as a
  /// session's close does). NOT_FOUND when it ended already.
  absl::Status close_remote_hold(remote_hold_id id);

  /// The remote holds alive, with their bytes.
  [[nodiscard]] std::map<remote_hold_id, remote_hold_entry> remote_holds() const;

  /// A buffer of another node that `session` now holds: a new id of this
  /// daemon's buffer ids (never one of its own buffers'). close_buffer() of it
  /// and the session's end let go of it, telling the foreign release
  /// notifier. UNAUTHENTICATED (session gone).
  absl::StatusOr<buffer_id> add_foreign_hold(session_id session);

  /// Who is told of each foreign hold let go of; null: nobody.
  void set_foreign_release_notifier(foreign_release_notifier notify);

 private:
  friend class daemon_core;

  /// A closing session's holds of other nodes' buffers, and who to tell of
  /// them (without the core's lock).
  struct foreign_release {
    std::set<buffer_id> ids;
    foreign_release_notifier notify;

    void tell() const;
  };

  /// A create's pool and session, once check_create_locked() passed.
  struct create_target {
    session_entry* session{};
    pool_entry* pool{};
    std::size_t alignment{};
  };

  answer_or_hold<buffer_grant> create_buffer_with(session_id session,
                                                  std::string_view name,
                                                  pool_id pool,
                                                  std::size_t bytes,
                                                  buffer_options const& options,
                                                  short_of_room when_short);
  /// A create's checks before anything is charged: the name, the drain, the
  /// session, the request, and that the name is free.
  absl::StatusOr<create_target> check_create_locked(session_id session,
                                                    std::string_view name,
                                                    pool_id pool,
                                                    std::size_t bytes,
                                                    buffer_options const& options,
                                                    std::string const& request) const;
  /// A create whose pool is short of room that other sessions' idle slabs
  /// would make: asks them and waits, then starts over (the name may be
  /// taken by then), refusing at once if the pool is still short; or holds,
  /// or refuses with `refused`.
  answer_or_hold<buffer_grant> create_when_short(std::unique_lock<std::mutex>& lock,
                                                 absl::Status refused,
                                                 session_entry const& s,
                                                 std::string_view name,
                                                 pool_id pool,
                                                 std::size_t bytes,
                                                 buffer_options const& options,
                                                 std::size_t charge,
                                                 std::string const& what,
                                                 short_of_room when_short);
  /// The backend's allocation of `b`, which `s` is creating with `charge`
  /// taken: without the lock; then the estimate goes back, and what the
  /// backend reserved is charged if it may stay (the buffer goes otherwise).
  absl::StatusOr<buffer_grant> allocate_created(std::unique_lock<std::mutex>& lock,
                                                buffer_entry& b,
                                                session_entry& s,
                                                pool_entry& p,
                                                std::size_t alignment,
                                                std::string const& what,
                                                std::string const& request);
  /// A buffer `s` is creating: takes its name, and charges `charge` to the
  /// pool, the creator's session and its uid while the backend allocates.
  buffer_entry& take_name_locked(session_entry& s,
                                 std::string_view name,
                                 pool_id pool,
                                 std::size_t bytes,
                                 std::size_t charge,
                                 buffer_options const& options);
  /// Buffer `id` as its creating session may still change it: created by
  /// `session` and neither published nor deleted. Otherwise NOT_FOUND or
  /// FAILED_PRECONDITION, each worded `request: ...` ("only the session that
  /// created it may <what>").
  [[nodiscard]] absl::StatusOr<buffer_entry*> writing_buffer_locked(session_id session,
                                                                    buffer_id id,
                                                                    std::string const& request,
                                                                    char const* what);
  /// Drops one hold of `b` by session `holder`, one of `kind` where it has
  /// one (see close_buffer); grants the write lease to the next in line if
  /// that let it go; frees `b` when nothing keeps it. `since`: when the
  /// close or the session's end began (the takeover's start; {}: now).
  void drop_hold_locked(buffer_entry& b,
                        session_id holder,
                        hold_kind kind                              = hold_kind::read,
                        std::chrono::steady_clock::time_point since = {}) noexcept;
  /// Frees `b` if no session holds it and it is neither persistent and
  /// published, nor still being created. Returns whether it went.
  bool free_buffer_if_unheld_locked(buffer_id id) noexcept;
  /// Drops every hold of closing session `s` (its write leases go to the
  /// next in line) and takes its exclusive opens out of line, and takes its
  /// holds of other nodes' buffers, for the caller to tell of without the
  /// lock. `since`: when the session's end began.
  foreign_release release_all_locked(session_entry& s,
                                     std::chrono::steady_clock::time_point since) noexcept;
  /// Frees every buffer left (the daemon stops; its sessions are closed).
  void free_all() noexcept;
  buffer_info buffer_info_locked(buffer_entry const& b) const;
  buffer_grant buffer_grant_locked(buffer_entry const& b, buffer_access access) const;
  [[nodiscard]] bool may_open_locked(buffer_entry const& b, peer_credentials const& peer) const;
  /// Whether a session of `peer` lists and describes `b` (ListBuffers's rule).
  [[nodiscard]] bool may_see_locked(buffer_entry const& b,
                                    session_id session,
                                    peer_credentials const& peer) const;
  /// Why an open of `b` as `how` is refused (access, the fingerprint guard).
  [[nodiscard]] std::optional<absl::Status> open_refusal_locked(buffer_entry const& b,
                                                                session_id session,
                                                                buffer_open_options const& how,
                                                                std::string_view request) const;
  /// Why session `s` may not open `b` although its uid may: `b` lives inside
  /// another tenant's pool (a pool pointer), if so.
  [[nodiscard]] std::optional<absl::Status> cross_tenant_refusal_locked(
      buffer_entry const& b, session_entry const& s, std::string_view request) const;

  // The write lease (buffer_leases.cpp).

  /// An exclusive open of `b`, which `s` may open (its access and labels
  /// checked): the lease now, or a wait in line until `wait_until`; a
  /// `standby` open stands in line without waiting.
  absl::StatusOr<buffer_grant> open_exclusive_locked(
      std::unique_lock<std::mutex>& lock,
      buffer_entry& b,
      session_entry& s,
      std::chrono::steady_clock::time_point wait_until,
      std::string const& request,
      bool standby);
  /// A standby open of `b` that cannot have the lease now: in line, holding
  /// the buffer.
  buffer_grant stand_in_line_locked(buffer_entry& b, session_entry& s);
  /// Takes `session`'s standby out of b's line; false if none stands there.
  bool leave_standby_locked(buffer_entry& b, session_id session) noexcept;
  /// The wait of an exclusive open, in line as `ticket`: its grant, or why it ended.
  absl::StatusOr<buffer_grant> wait_for_lease_locked(
      std::unique_lock<std::mutex>& lock,
      buffer_id id,
      session_id session,
      std::uint64_t ticket,
      std::chrono::steady_clock::time_point wait_until,
      std::string const& request);
  /// Why a plain read-write open of `b` by `session` is refused: another
  /// session holds or waits for its lease.
  [[nodiscard]] std::optional<absl::Status> plain_writer_refusal_locked(
      buffer_entry const& b, session_id session, std::string_view request) const;
  /// Whether `session` may write `b`: it holds its lease or a plain
  /// read-write open (a create counts), or stands in line as a standby.
  [[nodiscard]] bool may_write_locked(buffer_entry const& b, session_id session) const;
  /// Whether no holder but `session` has a plain read-write open of `b`.
  [[nodiscard]] static bool no_other_writer_locked(buffer_entry const& b, session_id session);
  /// Gives `b`'s lease to `s` (one more hold of it unless `s` holds it as a
  /// standby already; the next generation).
  std::uint64_t grant_lease_locked(buffer_entry& b, session_entry& s, bool add_hold = true);
  /// Gives `b`'s lease to the first in line if nobody holds it and no other
  /// session's plain write open is in the way; wakes the waiting calls.
  void grant_to_next_locked(buffer_entry& b, std::chrono::steady_clock::time_point since) noexcept;
  /// After `holder` dropped a hold of `kind` and has `remaining` left: its
  /// lease and plain-writer count as what is left allows.
  void settle_lease_locked(buffer_entry& b,
                           session_id holder,
                           hold_kind kind,
                           std::size_t remaining) noexcept;
  /// Takes `ticket` out of b's line (and its session's count); false if not there.
  bool leave_line_locked(buffer_entry& b, std::uint64_t ticket) noexcept;
  /// Ends every wait in b's line (b is deleted or freed): they answer NOT_FOUND.
  void end_line_locked(buffer_entry& b) noexcept;
  /// Takes closing session `s`'s exclusive opens out of every line.
  void leave_all_lines_locked(session_entry& s) noexcept;
  /// The next generation of `b`'s lease: restarts * 2^32 + grants.
  [[nodiscard]] std::uint64_t next_generation_locked(buffer_entry& b) const noexcept;
  /// Why an exclusive open cannot have the lease now, in words.
  [[nodiscard]] std::string lease_busy_locked(buffer_entry const& b, session_id session) const;
  [[nodiscard]] std::optional<buffer_lease_info> lease_info_locked(buffer_entry const& b) const;

  core_state& state_;
  buffer_id next_buffer_{1};
  std::uint64_t next_ticket_{1};        // of an exclusive open waiting in line
  std::size_t waiting_opens_{};         // opens waiting on state_.buffers_changed
  remote_hold_id next_remote_hold_{1};  // random at start (first_remote_hold_id)
  std::map<remote_hold_id, remote_hold_entry> remote_holds_;
  foreign_release_notifier foreign_released_;  // called without the core's mutex
  std::shared_ptr<buffer_keeper> keeper_;      // null: buffers are not kept across a restart
};

}  // namespace rmmd::core
