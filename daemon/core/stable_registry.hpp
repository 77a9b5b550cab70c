#pragma once

// Address-stable allocations and their sleep and wake (docs/sleep.md).
//
// A stable allocation is memory of its own that the backend makes and
// exports by a posix fd (pool_backend::allocate_stable: cuMemCreate on a
// CUDA pool); its client maps it at addresses it reserved and keeps for the
// allocation's life. Each carries a tag. While awake it is charged to its
// pool, its session and its uid as a lease is. Sleep is two steps: begin
// (the allocations are chosen and, with a host backup, each gets a memfd of
// its size in a host pool, charged there, for the client to copy into),
// then finish (the client copied and unmapped; the physical memory goes back
// to the backend and its charge with it). Wake is two steps too: wake (new
// physical memory for each, all or none, waiting up to a deadline for
// room), then finish (the client mapped and restored; the backups go).
// A session that ends while its allocations sleep with a named backup
// leaves them kept under that name (their backups still charged to the
// uid and the host pool), for a session of the same uid to restore. Named
// backups also outlive the daemon where a backup keeper is set
// (backup_keeper.hpp): it is told of each once its allocation sleeps, and
// that it goes once its wake is finished or it is dropped or freed; at
// start the keeper's backups come back through adopt_backup(), kept.
//
// Owns: the next stable id and the backup keeper. The entries themselves,
// and the wake counters, are core_state's (a session's end and stats read
// them).
//
// Lock discipline: every public member takes the core's mutex itself and
// lets go of it only where a comment says so (allocate() and wake() while
// the backend allocates, and while a wake waits for room; finish_sleep()
// while the keeper keeps). The private
// members that end in `_locked` are called with the mutex held
// (daemon_core's among them).

#include "daemon/core/backup_keeper.hpp"
#include "daemon/core/core_entries.hpp"
#include "daemon/core/core_state.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::core {

/// Most fds one StableFds call brings (one datagram's SCM_RIGHTS, less room).
inline constexpr std::size_t max_stable_fds = 250;

/// Longest tag (bytes of printable ASCII).
inline constexpr std::size_t max_stable_tag = 128;

/// Most pieces one allocation's memory comes in, for a client that maps
/// several (its fds fit one StableFds call).
inline constexpr std::size_t max_stable_pieces = 64;

class stable_registry {
 public:
  explicit stable_registry(core_state& state) : state_(state) {}
  stable_registry(stable_registry const&)            = delete;
  stable_registry& operator=(stable_registry const&) = delete;

  // Every call answers UNAUTHENTICATED when the session is gone, and a
  // refused call changes nothing.

  /// An awake allocation of `bytes` in `pool` tagged `tag`, its memory in
  /// at most `max_pieces` pieces (the client maps them one after another;
  /// more than one only where spares of its uid serve it). INVALID_ARGUMENT
  /// (size 0, unknown pool, a tag that is empty, longer than max_stable_tag
  /// or not printable), FAILED_PRECONDITION (a pool that cannot make such
  /// memory), RESOURCE_EXHAUSTED (quota, pool, device), UNAVAILABLE
  /// (draining). The backend allocates without the lock.
  absl::StatusOr<stable_grant> allocate(session_id session,
                                        pool_id pool,
                                        std::size_t bytes,
                                        std::string_view tag,
                                        std::size_t max_pieces = 1);

  /// Frees allocation `id` of `session`, awake or asleep, with its backup.
  /// NOT_FOUND (not the session's).
  absl::Status free(session_id session, stable_id id);

  /// Sleep, first step: the session's awake allocations tagged with one of
  /// `tags` (empty: every tag), each given a host backup when `backup` (in
  /// the first host pool, from the session's tenant's backend). Returns them
  /// (none is no error). INVALID_ARGUMENT (a bad tag or backup name; a name
  /// without a backup), FAILED_PRECONDITION (a backup but no host pool;
  /// one of them going to sleep already), ALREADY_EXISTS (the name is kept
  /// or used by another session of the uid), RESOURCE_EXHAUSTED (the host
  /// pool or the quota cannot take the backups). With `ids`, exactly those
  /// (NOT_FOUND for one not the session's, FAILED_PRECONDITION for one not
  /// awake), whatever their tags.
  absl::StatusOr<std::vector<stable_grant>> begin_sleep(session_id session,
                                                        std::span<std::string const> tags,
                                                        bool backup,
                                                        std::string_view backup_name,
                                                        std::span<stable_id const> ids = {});

  /// Sleep, second step: the physical memory of `ids` goes back to the
  /// backend and their charge with it; they sleep (their backups kept). With
  /// `cancel`, a begun sleep is called off instead: backups dropped, memory
  /// kept. Returns the device bytes released, once the backup keeper (if
  /// any) keeps their named backups. NOT_FOUND (an id not the session's),
  /// FAILED_PRECONDITION (asleep already; with cancel, one not going to
  /// sleep). All or none.
  absl::StatusOr<std::size_t> finish_sleep(session_id session,
                                           std::span<stable_id const> ids,
                                           bool cancel);

  /// Wake: new physical memory for the session's sleeping allocations
  /// tagged with one of `tags`, or `ids` when given (empty both: all), all
  /// or none. A pool short of room waits, until `deadline`, for memory to
  /// come back (asking sessions with idle slabs for them); then
  /// RESOURCE_EXHAUSTED names who holds the pool. NOT_FOUND (an id not the
  /// session's), FAILED_PRECONDITION (an id awake), INVALID_ARGUMENT (a bad
  /// tag). Their backups stay until finish_wake(). Each one's memory comes
  /// in at most `max_pieces` pieces, as allocate()'s.
  absl::StatusOr<std::vector<stable_grant>> wake(session_id session,
                                                 std::span<std::string const> tags,
                                                 std::span<stable_id const> ids,
                                                 std::chrono::steady_clock::time_point deadline,
                                                 std::size_t max_pieces = 1);

  /// Wake, second step: the backups of `ids` (awake) go, or, with
  /// `keep_backups`, stay (still charged) as the room the next sleep with a
  /// backup copies into: its client keeps them mapped and page-locked, so
  /// that later sleeps and wakes are the copies alone. A kept backup is no
  /// longer one to restore (the keeper forgets it); a sleep without a
  /// backup, a cancelled sleep and a free drop it. Returns the bytes
  /// dropped. NOT_FOUND, FAILED_PRECONDITION (one not awake).
  absl::StatusOr<std::size_t> finish_wake(session_id session,
                                          std::span<stable_id const> ids,
                                          bool keep_backups = false);

  /// The allocations kept under `name` for the session's uid: the caller's
  /// now, asleep. NOT_FOUND (none kept under it), FAILED_PRECONDITION (a
  /// live session sleeps under it: it must end first).
  absl::StatusOr<std::vector<stable_grant>> restore(session_id session, std::string_view name);

  /// Frees what is kept under `name` (the session's uid's, or any uid's for
  /// root). Returns the backup bytes freed. NOT_FOUND.
  absl::StatusOr<std::size_t> drop_backups(session_id session, std::string_view name);

  /// Who keeps named backups across a restart (null: nobody). Set before
  /// serving; the daemon's stop sets null, so that closing the sessions
  /// then forgets nothing.
  void set_backup_keeper(std::shared_ptr<backup_keeper> keeper);

  /// A backup the last daemon kept: an allocation asleep under
  /// `spec.backup_name`, kept (no session), charged to its uid and to the
  /// host pool again, freed through spec.release. The keeper has it
  /// already. Returns its id. INVALID_ARGUMENT (a bad name or tag, an
  /// unknown pool or one that cannot make address-stable memory, a host
  /// pool that is not one, sizes that do not fit), ALREADY_EXISTS (a live
  /// session of the uid sleeps under the name); nothing is adopted then and
  /// the memory stays the caller's.
  absl::StatusOr<stable_id> adopt_backup(adopted_backup_spec spec);

  /// The fds (owned by the backends: send copies) of `ids`' physical memory
  /// (awake; each piece's, in order), or of their backups. INVALID_ARGUMENT
  /// (none, or more than max_stable_fds), NOT_FOUND, FAILED_PRECONDITION
  /// (asleep; no backup).
  absl::StatusOr<std::vector<int>> fds(session_id session,
                                       std::span<stable_id const> ids,
                                       bool backup) const;

  /// Every sleeper: per session with sleeping allocations, and per kept name.
  [[nodiscard]] std::vector<sleeper_info> sleepers() const;
  [[nodiscard]] stable_totals totals() const;
  /// The session's allocations (tests, tools).
  [[nodiscard]] std::vector<stable_grant> held_by(session_id session) const;

 private:
  friend class daemon_core;

  /// A closing session's allocations: awake ones freed, sleeping ones with
  /// a named backup kept, the rest freed.
  void release_session_locked(session_entry& s) noexcept;
  /// Frees every entry (the daemon stops).
  void free_all() noexcept;

  /// The session's entry `id`, or NOT_FOUND worded `request: ...`.
  absl::StatusOr<stable_entry*> owned_locked(session_id session,
                                             stable_id id,
                                             std::string const& request) const;
  /// The session's entries `ids`, each awake; else NOT_FOUND, or
  /// FAILED_PRECONDITION ending in `hint` (what the caller should do).
  absl::StatusOr<std::vector<stable_entry*>> awake_owned_locked(session_id session,
                                                                std::span<stable_id const> ids,
                                                                std::string const& request,
                                                                std::string_view hint) const;
  /// Frees `e`'s memory (if any) and backup, uncharging them (`s`: its
  /// session, null when ended), and forgets it. `how`: whether its client
  /// unmapped the memory (a free) or may still map it (a session's end).
  void erase_locked(stable_entry& e,
                    session_entry* s,
                    stable_return how = stable_return::to_driver) noexcept;
  /// Frees `e`'s backup, uncharging it, and tells the keeper it went.
  void drop_backup_locked(stable_entry& e, session_entry* s) noexcept;
  /// Lets go of `lock` and waits (up to 10 s) until the keeper applied what
  /// it was told, where anything was forgotten since `forgets_before`
  /// (forgets_): a call that dropped a kept backup answers once the fd store
  /// lost it, so that an rmmd SIGKILLed just after does not bring it back.
  void settle_forgets(std::unique_lock<std::mutex>& lock, std::uint64_t forgets_before) noexcept;
  /// Tells the keeper of `e`'s named backup (asleep); false when there is
  /// no keeper or nothing to keep.
  bool keep_backup_locked(stable_entry& e) noexcept;
  void release_memory_locked(stable_entry& e, session_entry* s, stable_return how) noexcept;
  /// The backups `chosen` need, made and charged all or none.
  absl::Status make_backups_locked(session_entry& s,
                                   std::vector<stable_entry*> const& chosen,
                                   std::string const& request);
  /// Waits (letting go of the lock) until `pool` could take `charge` for
  /// session `session` or `deadline`; returns the refusal left, if any.
  std::optional<absl::Status> room_for_wake_locked(std::unique_lock<std::mutex>& lock,
                                                   session_id session,
                                                   pool_id pool,
                                                   std::size_t charge,
                                                   std::chrono::steady_clock::time_point deadline,
                                                   std::string const& what);
  /// New memory for each of `ids` (charged already), without the lock;
  /// all or none.
  absl::Status allocate_for_wake(std::unique_lock<std::mutex>& lock,
                                 session_id session,
                                 std::vector<stable_id> const& ids,
                                 std::chrono::steady_clock::time_point deadline,
                                 std::size_t max_pieces);
  /// "uid 1000 holds N bytes, uid 1001 ...": who holds `pool`.
  [[nodiscard]] std::string holders_text_locked(pool_id pool) const;
  [[nodiscard]] static stable_grant grant_of(stable_entry const& e);
  [[nodiscard]] static std::vector<std::size_t> pieces_of(stable_entry const& e);

  core_state& state_;
  stable_id next_id_{1};
  std::uint64_t next_backup_serial_{1};    // guarded by state_.mutex
  std::shared_ptr<backup_keeper> keeper_;  // guarded by state_.mutex
  std::uint64_t forgets_{0};  // backups the keeper was told to forget; guarded by state_.mutex
};

/// Why `tag` is no stable allocation's tag, if it is not.
[[nodiscard]] std::optional<std::string> stable_tag_problem(std::string_view tag);

}  // namespace rmmd::core
