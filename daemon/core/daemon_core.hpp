#pragma once

// The daemon's logic: pools, sessions, the lease ledger, quotas and stats.
// It knows nothing of gRPC, protobuf or sockets; adapters translate.
//
// The core keeps the sessions, the pools, the ledger, quotas, shared buffers
// and the drain; its parts own the rest, each under the core's mutex:
// packed_blocks (packed_blocks.hpp), reclaim_coordinator
// (reclaim_coordinator.hpp) and core_stats (core_stats.hpp).
//
// Thread safety: every public member may be called from any thread; one mutex
// serialises them and every backend call but a few: allocate() and
// create_buffer() let go of it while the backend allocates (tens of us for a
// CUDA pool), having counted the bytes against the pool and quotas first, and
// take those back (and free the block) if the call fails in the end, so a
// rejected request never leaves partial state behind; free() lets go of it
// while the backend frees, having taken the lease out of the ledger, and
// uncharges the bytes once the backend has them back; trim() calls the
// backends without it.
//
// Errors are absl::Status with the codes of DESIGN.md's error table.

#include "daemon/core/buffer_keeper.hpp"
#include "daemon/core/core_entries.hpp"
#include "daemon/core/core_stats.hpp"
#include "daemon/core/lease_ledger.hpp"
#include "daemon/core/packed_blocks.hpp"
#include "daemon/core/pool_backend.hpp"
#include "daemon/core/reclaim_coordinator.hpp"
#include "daemon/core/tenants.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace rmmd::core {

/// Who may open a session: a peer whose uid is listed, or whose primary or
/// supplementary gid is listed.
struct access_policy {
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;

  [[nodiscard]] bool allows(peer_credentials const& peer) const;
};

/// Byte quotas; 0 means unlimited.
struct quota_limits {
  std::size_t per_session_bytes{};
  std::size_t per_uid_bytes{};                     ///< default for every uid
  std::map<uid_t, std::size_t> per_uid_overrides;  ///< uid -> bytes, wins over per_uid_bytes

  [[nodiscard]] std::size_t limit_for_uid(uid_t uid) const;
};

struct core_options {
  access_policy access;
  quota_limits quotas;
  /// Besides root, the one uid whose sessions may make admin requests (trim):
  /// by default the daemon's own.
  uid_t admin_uid{::geteuid()};
  /// How long a request that finds its pool short waits for other sessions to
  /// give back idle slabs that could serve it (see allocate()); 0: it is
  /// refused at once. A reload may change it (core_reload).
  std::chrono::milliseconds reclaim_timeout{default_reclaim_timeout};
  /// Packed leases. A CUDA pool's direct allocation of at most this many
  /// bytes, asked for with may_pack, is carved out of a block of
  /// pack_block_size bytes that the daemon leases to that session alone
  /// (exported and imported once), instead of being an allocation of its own:
  /// no driver call per allocation, and no driver memory per lease. 0: never.
  /// pack_up_to is at most pack_block_size (the constructor lowers it); a
  /// reload may change it (core_reload), the block size and pack_idle not.
  std::size_t pack_up_to{default_pack_up_to};
  std::size_t pack_block_size{default_pack_block_size};
  /// A session keeps one empty packed block per pool this long, then it is
  /// retired too.
  std::chrono::milliseconds pack_idle{default_pack_idle};
  /// Which sessions share a backend (tenants.hpp): by default every uid has
  /// backends of its own, in the pools added with a backend_maker. Fixed
  /// while the daemon runs.
  tenancy_policy tenancy{};
};

/// What the configuration file can change while the daemon runs (SIGHUP):
/// see daemon_core::reconfigure.
struct core_reload {
  access_policy access;
  quota_limits quotas;
  std::chrono::milliseconds reclaim_timeout{default_reclaim_timeout};
  std::size_t pack_up_to{default_pack_up_to};
};

/// What a request that finds its pool short does when other sessions hold
/// idle slabs there that could serve it (see daemon_core::allocate).
enum class reclaim_policy : std::uint8_t {
  /// Asks them to give those back and waits (up to reclaim_timeout) for the
  /// room: for callers whose thread may block.
  wait,
  /// Refuses at once, as if no session held idle slabs.
  refuse,
};

/// The answer of allocate_or_hold() or create_buffer_or_hold() where the
/// request would wait for idle slabs to come back: nothing changed, and the
/// caller makes the request again with reclaim_policy::wait from a thread
/// that may block. Never sent to a client.
struct reclaim_hold {};

/// A request's answer, or a hold (see reclaim_hold).
template <class T>
using answer_or_hold = std::variant<absl::StatusOr<T>, reclaim_hold>;

/// 128 random bits, the session's bearer credential on the gRPC socket.
using session_token = std::array<std::byte, 16>;

struct session_grant {
  session_id id{};
  session_token token{};
};

struct lease_grant {
  allocation_id id{};
  /// The lease's memory; for a packed lease, the whole block (its export data
  /// names the block), with the lease `block_offset` bytes into it.
  backend_allocation block;
  block_id packed_block{};  ///< 0: a lease of its own
  std::uint64_t block_offset{};
  std::size_t bytes{};  ///< bytes reserved for the lease
};

/// A shared buffer a session now holds (by create or open), and its memory.
struct buffer_grant {
  buffer_id id{};
  pool_id pool{};
  std::string name;
  std::size_t size{};  ///< bytes the creator asked for
  shared_allocation block;
  buffer_state state{};
  bool persistent{false};
  buffer_access access{buffer_access::read};
  /// Its manifest (shared, never changed in place); null: it has none.
  std::shared_ptr<buffer_manifest const> manifest;
};

/// One of this node's buffers as another node's daemon holds it (peering).
struct remote_buffer_grant {
  remote_hold_id hold{};
  buffer_grant grant{};    ///< its block carries the fabric handle
  std::string gpu_uuid{};  ///< the GPU of its pool
};

/// Told, without the core's lock, that a session let go of a buffer of
/// another node (close_buffer or its end): see add_foreign_hold.
using foreign_release_notifier = std::function<void(buffer_id)>;

/// One buffer as a session that may see it sees it, with its manifest.
struct buffer_description {
  buffer_info info;
  std::shared_ptr<buffer_manifest const> manifest;  ///< null: it has none
};

class daemon_core {
 public:
  explicit daemon_core(core_options options);
  daemon_core(daemon_core const&)            = delete;
  daemon_core& operator=(daemon_core const&) = delete;
  ~daemon_core();

  /// Who carries reclaim requests to sessions (the session listener). Call
  /// before serving requests; without one, a short pool refuses at once.
  void set_reclaim_notifier(reclaim_notifier notify);

  /// Who carries RetireBlocks to sessions (the session listener). Without
  /// one, a session's empty packed blocks stay with it until it ends.
  void set_retire_notifier(retire_notifier notify);

  /// Adds a pool served by `backend`, one backend for every session whatever
  /// its tenant. Call before serving requests.
  pool_id add_pool(pool_config config, std::unique_ptr<pool_backend> backend);

  /// Adds a pool of `kind` lending at most `capacity` bytes, served to each
  /// tenant (options.tenancy) by a backend of its own that `make` makes on
  /// the tenant's first session; with tenancy off, by one backend made now.
  /// Throws what `make` throws. Call before serving requests.
  pool_id add_pool(pool_config config, backend_kind kind, std::size_t capacity, backend_maker make);

  /// The pools; a pool with a backend per tenant without any tenant's
  /// handles (shareable_fd -1, no fabric handle): pools_for() gives a
  /// session its own.
  [[nodiscard]] std::vector<pool_description> pools() const;

  /// The pools as `session` imports them: with its tenant's fd and fabric
  /// handle (owned by the backend, alive while the session is).
  /// UNAUTHENTICATED when the session is gone.
  [[nodiscard]] absl::StatusOr<std::vector<pool_description>> pools_for(session_id session) const;

  /// PERMISSION_DENIED if the policy does not allow `peer`; UNAVAILABLE while
  /// draining. A session whose origin says it reconnects counts in
  /// stats().restart.reconnected_sessions.
  absl::StatusOr<session_grant> open_session(peer_credentials peer,
                                             std::string command,
                                             session_origin origin);
  absl::StatusOr<session_grant> open_session(peer_credentials peer,
                                             std::string command,
                                             std::string client_name)
  {
    return open_session(
        std::move(peer), std::move(command), session_origin{.client_name = std::move(client_name)});
  }

  /// Ends a session and frees every lease it still holds. Unknown ids are
  /// ignored (the session socket and shutdown may both close one).
  void close_session(session_id id) noexcept;

  /// The session a token (lowercase hex, as sent in metadata) belongs to, or
  /// UNAUTHENTICATED.
  [[nodiscard]] absl::StatusOr<session_id> authenticate(std::string_view token_hex) const;

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

  /// Gives unused memory of `pools` (every pool when empty) back to the
  /// system: see pool_backend::trim(). PERMISSION_DENIED unless the session's
  /// uid is root or options.admin_uid; INVALID_ARGUMENT for an unknown pool
  /// id (nothing is trimmed then); INTERNAL when a backend fails (pools before
  /// it in the list have been trimmed: trimming changes no ledger state).
  /// The backends trim without the core's lock: other calls go on meanwhile.
  absl::StatusOr<std::vector<pool_trim>> trim(session_id session,
                                              std::vector<pool_id> const& pools);

  /// Pools and sessions. With `top_sessions`, only that many sessions, those
  /// holding the most (see top_sessions()); otherwise every session, by id.
  [[nodiscard]] stats_snapshot stats(std::optional<std::size_t> top_sessions = {}) const;
  /// Every session, by id.
  [[nodiscard]] std::vector<session_info> sessions() const;
  /// At most `n` sessions: those holding the most bytes first, then the most
  /// allocations, then the oldest (lowest id), so that the same sessions show
  /// from one call to the next; and what the others hold together. A
  /// thousand sessions take a fraction of a millisecond under the lock.
  [[nodiscard]] session_listing top_sessions(std::size_t n) const;
  [[nodiscard]] std::size_t session_count() const;

  /// Applies a configuration reload: who may open sessions, the quotas, the
  /// reclaim timeout and which requests are packed (pack_up_to, lowered to
  /// the block size as the constructor does). Open sessions stay open and
  /// keep what they hold, even above a lowered quota, and their packed blocks
  /// stay; the new values apply to the next open_session, allocate and
  /// create_buffer.
  void reconfigure(core_reload reload);

  /// Drain, first phase (SIGTERM): open_session answers UNAVAILABLE; the live
  /// sessions keep allocating and freeing until they leave or the deadline.
  void stop_new_sessions();

  /// Drain, second phase (the deadline): allocate answers UNAVAILABLE too;
  /// free still works.
  void begin_drain();

  /// True once either phase has begun.
  [[nodiscard]] bool draining() const;

  /// Frees every lease of every session and forgets the sessions.
  void close_all_sessions() noexcept;

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
  /// allocate() (`policy`), with the name not yet taken.
  absl::StatusOr<buffer_grant> create_buffer(session_id session,
                                             std::string_view name,
                                             pool_id pool,
                                             std::size_t bytes,
                                             buffer_options const& options,
                                             reclaim_policy policy = reclaim_policy::wait);

  /// create_buffer() for a caller whose thread must not block: see
  /// allocate_or_hold().
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
  absl::StatusOr<buffer_grant> open_buffer(session_id session,
                                           std::string_view name,
                                           std::chrono::steady_clock::time_point wait_until = {},
                                           buffer_open_options const& how                   = {});

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

  /// `session` lets go of one open (or its create) of `id`. NOT_FOUND when it
  /// holds none. The last holder's close frees a buffer that is not
  /// persistent, and a creator's close before publishing frees it always.
  absl::Status close_buffer(session_id session, buffer_id id);

  /// The fd of buffer `id`'s own allocation (owned by the backend: send a
  /// copy), for a session that holds it. NOT_FOUND when it holds none,
  /// FAILED_PRECONDITION when the buffer has no fd (host pools: the offset
  /// in the pool's memfd is all it needs).
  absl::StatusOr<int> buffer_fd(session_id session, buffer_id id) const;

  /// Takes the name away; the memory goes after the last holder. Returns how
  /// many sessions hold it still. NOT_FOUND, PERMISSION_DENIED (neither the
  /// creator's uid nor root).
  absl::StatusOr<std::size_t> delete_buffer(session_id session, std::string_view name);

  /// The buffers `session` may see (see ListBuffers in rmmd.proto).
  /// Only those `filter` matches (its name prefix and every label).
  absl::StatusOr<std::vector<buffer_info>> list_buffers(session_id session,
                                                        buffer_filter const& filter = {}) const;

  /// Every buffer, deleted ones still held included (metrics, tests).
  [[nodiscard]] std::vector<buffer_info> buffers() const;

  /// Opens waiting now for a buffer to appear or be published.
  [[nodiscard]] std::size_t waiting_opens() const;

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

  /// Who is on the other end of `session` (for the peering layer's
  /// ledger); UNAUTHENTICATED when it is gone.
  [[nodiscard]] absl::StatusOr<peer_credentials> session_peer(session_id session) const;

  /// What the start took back (stats and /metrics show it).
  void set_restart_summary(restart_summary summary);

  /// Where stats() reads each GPU's used bytes (stats_snapshot::gpu_memory);
  /// called without the core's lock. Call before serving requests.
  void set_driver_usage_source(driver_usage_source source);

 private:
  /// How a request that finds its pool short goes on (reclaim_policy, plus
  /// the hold of allocate_or_hold and create_buffer_or_hold).
  enum class short_of_room : std::uint8_t { wait, hold, refuse };

  struct allocation_request {
    session_id session{};
    pool_id pool{};
    std::size_t bytes{};
    std::size_t alignment{};
    short_of_room when_short{};
    bool may_pack{};
  };

  /// A request's pool and alignment, once check_request_locked() passed.
  struct checked_request {
    pool_entry* pool{};
    std::size_t alignment{};
  };

  /// The session `id`, or nullptr (never opened, or closed).
  [[nodiscard]] session_entry* find_session_locked(session_id id) const;
  /// The session `id`, or UNAUTHENTICATED saying that `request` came from a
  /// closed session.
  /// Buffer `id` as its creating session may still change it: created by
  /// `session` and neither published nor deleted. Otherwise NOT_FOUND or
  /// FAILED_PRECONDITION, each worded `request: ...` ("only the session that
  /// created it may <what>").
  [[nodiscard]] absl::StatusOr<buffer_entry*> writing_buffer_locked(session_id session,
                                                                    buffer_id id,
                                                                    std::string const& request,
                                                                    char const* what);
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
                                                        std::string const& what,
                                                        bool& waited);
  /// Short of room that other sessions' idle slabs would make: holds, or
  /// asks them and waits. Returns the refusal or hold that ends the request,
  /// or nullopt when it goes on (with `s` found again).
  std::optional<answer_or_hold<lease_grant>> wait_for_room_locked(
      std::unique_lock<std::mutex>& lock,
      session_entry*& s,
      allocation_request const& r,
      std::size_t charge,
      std::string const& what,
      bool& waited);

  void release_lease_locked(session_id session, allocation_id id) noexcept;
  /// Frees every lease and packed block `s` holds, in one batch per pool (a
  /// closing session).
  void release_all_leases_locked(session_entry& s) noexcept;
  /// Adds (sign +1) or takes back (-1) `bytes` on the pool and the tenant's
  /// backend, the session (if still open) and the uid.
  void charge_locked(pool_entry& p,
                     session_entry* s,
                     uid_t uid,
                     tenant_key const& tenant,
                     pool_id pool,
                     std::size_t bytes,
                     int sign) noexcept;
  void signal_pressure_locked(pool_entry& pool);
  /// Why the session's or its uid's quota cannot take `charge` more, if so.
  std::optional<absl::Status> quota_refusal_locked(session_entry const& s,
                                                   std::size_t charge,
                                                   std::string const& what) const;
  /// Why `charge` more bytes for session `s` in pool `p` would break a quota
  /// or overrun the pool (`what`: the request, for the message), if it would.
  std::optional<absl::Status> refusal_locked(pool_entry& p,
                                             session_entry const& s,
                                             std::size_t charge,
                                             std::string const& what);
  [[nodiscard]] bool reclaim_could_serve_locked(pool_id pool,
                                                session_id requester,
                                                std::size_t charge) const;
  /// Waits for idle slabs as reclaim_coordinator::wait_for_room does.
  bool wait_for_reclaim_locked(std::unique_lock<std::mutex>& lock,
                               pool_id pool,
                               session_id requester,
                               std::size_t charge,
                               std::size_t ask_for = 0);

  answer_or_hold<buffer_grant> create_buffer_with(session_id session,
                                                  std::string_view name,
                                                  pool_id pool,
                                                  std::size_t bytes,
                                                  buffer_options const& options,
                                                  short_of_room when_short);
  /// A buffer `s` is creating: takes its name, and charges `charge` to the
  /// pool, the creator's session and its uid while the backend allocates.
  buffer_entry& take_name_locked(session_entry& s,
                                 std::string_view name,
                                 pool_id pool,
                                 std::size_t bytes,
                                 std::size_t charge,
                                 buffer_options const& options);
  /// Drops one hold of `b` by session `holder`; frees it when nothing keeps it.
  void drop_hold_locked(buffer_entry& b, session_id holder) noexcept;
  /// Frees `b` if no session holds it and it is neither persistent and
  /// published, nor still being created. Returns whether it went.
  bool free_buffer_if_unheld_locked(buffer_id id) noexcept;
  /// Drops every hold of a closing session.
  void release_buffers_of_locked(session_entry& s) noexcept;
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
  /// The pools; with `tenant`, its fds and fabric handles.
  [[nodiscard]] std::vector<pool_description> pools_locked(
      tenant_key const* tenant = nullptr) const;

  /// Makes the backends `tenant` lacks (a session of it is opening), without
  /// the core's lock. INTERNAL (or what the backend said) when one cannot be
  /// made; nothing is kept then.
  absl::Status make_tenant_backends(tenant_key const& tenant);
  /// Whether every pool has a backend for `tenant`.
  [[nodiscard]] bool tenant_ready_locked(tenant_key const& tenant) const;
  /// Takes out the backends of `tenant` that nothing needs any more (its
  /// last session closed), for the caller to destroy without the lock.
  std::vector<std::shared_ptr<pool_backend>> retire_tenant_locked(tenant_key const& tenant);

  mutable std::mutex mutex_;
  std::mutex trim_mutex_;     // one trim at a time; never held with mutex_
  std::mutex tenants_mutex_;  // one tenant's backends made at a time; taken before mutex_
  /// Access, quotas and the admin uid; reclaim_timeout, pack_up_to and the
  /// other packing settings as given at construction (reclaim_ and packed_
  /// keep the ones in force).
  core_options options_;
  bool draining_{false};
  bool sessions_closed_{false};                     // stop_new_sessions() was called
  std::vector<std::unique_ptr<pool_entry>> pools_;  // index == pool id
  session_id next_session_{1};
  session_map sessions_;
  std::unordered_map<std::string, session_id> by_token_;  // key: hex token
  std::unordered_map<uid_t, std::size_t> uid_bytes_;
  std::map<tenant_key, std::size_t> tenant_sessions_;  // open sessions per tenant
  lease_ledger ledger_;
  buffer_id next_buffer_{1};
  std::map<buffer_id, std::unique_ptr<buffer_entry>> buffers_;
  std::unordered_map<std::string, buffer_id> buffer_names_;  // named buffers only (not deleted)
  std::condition_variable_any buffers_changed_;              // a publish, a session's end, a drain
  std::size_t waiting_opens_{};                              // opens waiting on buffers_changed_
  core_stats stats_;
  remote_hold_id next_remote_hold_{1};  // random at start (first_remote_hold_id)
  std::map<remote_hold_id, remote_hold_entry> remote_holds_;
  foreign_release_notifier foreign_released_;  // called without mutex_
  std::shared_ptr<buffer_keeper> keeper_;      // null: buffers are not kept across a restart
  restart_summary restart_;
  driver_usage_source driver_usage_;  // set before serving, then only read
  reclaim_coordinator reclaim_;
  packed_blocks packed_;  // last: its sweeper stops (and joins) before the rest is destroyed
};

}  // namespace rmmd::core
