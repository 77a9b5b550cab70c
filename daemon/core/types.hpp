#pragma once

// Plain value types shared by the daemon's core and its adapters.
// No gRPC, no protobuf, no CUDA.

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::core {

using pool_id       = std::uint32_t;
using session_id    = std::uint64_t;
using allocation_id = std::uint64_t;
using buffer_id     = std::uint64_t;
/// A hold of one of this node's buffers by another node's daemon (peering).
using remote_hold_id = std::uint64_t;
/// An address-stable allocation (stable_registry.hpp).
using stable_id = std::uint64_t;

/// Alignment used when a request asks for none (RMM's CUDA_ALLOCATION_ALIGNMENT).
inline constexpr std::size_t default_alignment = 256;

/// How long a request that finds its pool short waits, by default, for other
/// sessions to give back idle slabs (core_options::reclaim_timeout).
inline constexpr std::chrono::milliseconds default_reclaim_timeout{200};

/// Packed leases (core_options::pack_up_to): by default a CUDA pool carves a
/// client's direct allocations of up to 64 KiB out of blocks of 2 MiB that it
/// leases to that session alone.
inline constexpr std::size_t default_pack_up_to      = std::size_t{64} << 10;
inline constexpr std::size_t default_pack_block_size = std::size_t{2} << 20;
/// How long a session's one empty packed block per pool stays for its next
/// small allocations before the daemon asks for it back.
inline constexpr std::chrono::milliseconds default_pack_idle{1000};

using block_id = std::uint64_t;

/// Where a pool's memory lives, which says how a client maps it: a memfd
/// at an offset (host), or an exported device allocation (device). The core,
/// the wire and the client go by this, never by which backend serves a pool.
enum class memory_space : std::uint8_t { host, device };

/// What a kind of backend is, as far as the core, the wire and the metrics
/// need to know. Each backend declares its own (pool_backend::traits()), so a
/// new kind of pool adds no case to them (docs/architecture.md's recipe).
struct backend_traits {
  std::string_view name{};  ///< the config's and the metrics' name: "host", "cuda"
  memory_space space{memory_space::host};
  /// Small leases may be carved out of packed blocks that a session imports
  /// once (device memory, where each import costs a driver call).
  bool packs_small_leases{false};
  /// allocate_stable() makes address-stable memory: an allocation of its
  /// own, exported by a POSIX fd, that a client maps where it keeps it.
  bool stable_memory{false};
};

enum class handle_type : std::uint8_t { posix_fd, fabric, host_offset };

/// Who is on the other end of a session socket, as the kernel reports it
/// (SO_PEERCRED, SO_PEERGROUPS): never what the client claims.
struct peer_credentials {
  pid_t pid{};
  uid_t uid{};
  gid_t gid{};
  std::vector<gid_t> supplementary_gids{};
};

/// What an operator configured for a pool.
struct pool_config {
  std::string name{};
  int device{-1};  ///< CUDA device ordinal in the daemon's numbering, -1 for host pools
  /// cuda: the GPU's identity, the same in every process whatever its
  /// CUDA_VISIBLE_DEVICES: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as
  /// nvidia-smi -L prints it, and "0000:3b:00.0". Empty for host pools.
  std::string gpu_uuid{};
  std::string pci_bus_id{};
  std::vector<handle_type> handle_types{};
  std::size_t limit_bytes{};  ///< most bytes the pool may lend; 0: the backend's capacity
  std::size_t max_alignment{std::size_t{1} << 21};  ///< largest alignment accepted
  /// Host pools: clients may page-lock their mapping (cudaHostRegister), so
  /// the backend must never punch holes in it (see host_backend).
  bool pinnable{false};
  /// cuda: why a pool its config asks fabric handles of has none (no IMEX
  /// channel, ...), as the start found; empty otherwise. Peering reports it.
  std::string fabric_problem{};
};

struct pool_description {
  pool_id id{};
  std::string name{};
  int device{-1};          ///< in the daemon's numbering; clients go by gpu_uuid
  std::string gpu_uuid{};  ///< see pool_config
  std::string pci_bus_id{};
  backend_traits backend{};
  std::vector<handle_type> handle_types{};
  std::size_t capacity_bytes{};
  int shareable_fd{-1};                    ///< fd to pass to sessions, owned by the backend
  std::vector<std::byte> fabric_handle{};  ///< empty unless the pool exports one
  std::size_t max_alignment{};             ///< largest alignment accepted
  bool pinnable{false};                    ///< see pool_config::pinnable
  std::string fabric_problem{};            ///< see pool_config::fabric_problem
};

/// One tenant's backend of a pool (tenants.hpp): what it lends and
/// what it holds from the system.
struct tenant_pool_stats {
  std::string tenant{};  ///< "uid 1000", "gid 2000", or "node" (one backend for everyone)
  std::size_t in_use_bytes{};
  std::size_t high_water_bytes{};
  std::optional<std::uint64_t> backend_reserved_bytes{};
  std::optional<std::uint64_t> backend_used_bytes{};
  std::size_t shared_buffers{};  ///< buffers whose memory it holds
};

struct pool_stats {
  pool_description pool{};
  /// Its backends, one per tenant (or one for everyone); the pool's
  /// backend_* figures are their sums.
  std::vector<tenant_pool_stats> tenants{};
  std::size_t in_use_bytes{};
  std::size_t high_water_bytes{};
  std::size_t allocation_count{};  ///< live allocations
  std::uint64_t total_allocations{};
  std::optional<std::uint64_t>
      backend_reserved_bytes{};                       ///< e.g. cudaMemPoolAttrReservedMemCurrent
  std::optional<std::uint64_t> backend_used_bytes{};  ///< e.g. cudaMemPoolAttrUsedMemCurrent
  std::size_t carved_bytes{};  ///< reported by fast-path sessions, part of in_use_bytes
  std::size_t carved_allocations{};
  /// Fast-path sessions' slab bytes not carved (part of in_use_bytes), as
  /// they last reported them; of those, the bytes of slabs with nothing
  /// carved, which a session gives back when asked (reclaimable).
  std::size_t idle_bytes{};
  std::size_t reclaimable_bytes{};
  /// Requests that found the pool short and waited for other sessions to give
  /// idle slabs back (see core_options::reclaim_timeout): all of them, those
  /// the returned slabs served, and those refused after it (at the deadline, or once the idle slabs
  /// no longer sufficed).
  std::uint64_t reclaim_waits{};
  std::uint64_t reclaim_served{};
  std::uint64_t reclaim_refused{};
  std::optional<std::uint64_t> release_threshold_bytes{};  ///< where the backend has one
  std::size_t shared_buffers{};                            ///< named shared buffers in the pool
  std::size_t shared_bytes{};    ///< their reserved bytes, part of in_use_bytes
  std::size_t shared_holders{};  ///< sessions holding them (once per buffer)
};

/// What a fast-path session carved out of its slabs of one pool.
struct carved_usage {
  pool_id pool{};
  std::size_t bytes{};
  std::size_t allocation_count{};
  /// The bytes of its slabs there (carved or not; 0 from clients that do not
  /// say), and of those the bytes of slabs with nothing carved, which the
  /// session gives back at once when asked (a session reporting any answers
  /// reclaim requests: see lease_allocator::set_reclaim_notifier).
  std::size_t slab_bytes{};
  std::size_t reclaimable_bytes{};
};

/// What trimming one pool gave back.
struct pool_trim {
  pool_id pool{};
  std::string name{};
  std::size_t released_bytes{};
  std::optional<std::uint64_t> backend_reserved_before{};  ///< where the backend reports it
  std::optional<std::uint64_t> backend_reserved_after{};
};

struct session_info {
  session_id id{};
  peer_credentials peer{};
  std::string command{};      ///< the kernel's command name for the peer pid
  std::string client_name{};  ///< what the client called itself
  /// A client reconnecting after its daemon went away: how many times it
  /// has (0: a first connection) and the session it had before.
  std::uint32_t reconnects{};
  session_id previous_session{};
  std::size_t bytes{};
  std::size_t allocation_count{};
  std::chrono::system_clock::time_point started{};
  std::size_t carved_bytes{};  ///< see pool_stats
  std::size_t carved_allocations{};
  std::size_t idle_bytes{};  ///< see pool_stats
  std::size_t reclaimable_bytes{};
  std::size_t shared_bytes{};  ///< buffers it created and holds, charged beside `bytes`
  std::size_t buffers_held{};  ///< shared buffers it holds
};

/// A named shared buffer's life: created and written by one session, then
/// published to every allowed session; deleted while held, it has no name
/// and waits for its holders to let go.
enum class buffer_state : std::uint8_t { writing, published, deleted };

/// What a creator asks of a shared buffer beyond its name, pool and size.
struct buffer_options {
  std::size_t alignment{};  ///< 0: default_alignment
  /// Stays after the last holder is gone, until deleted or the daemon stops.
  bool persistent{false};
  /// Members of this group may open it too (besides the creator's uid and root).
  std::optional<gid_t> gid{};
  /// Other sessions may open it for writing (buffer_access::read_write).
  bool allow_writers{false};
};

/// How a session holds a buffer: its creating session read-write, others
/// as they opened it (read-write only where the creator allowed writers).
enum class buffer_access : std::uint8_t { read, read_write };

/// One named tensor inside a buffer (TensorEntry in rmmd.proto; the checks
/// are in buffer_manifest_checks.hpp).
struct tensor_entry {
  std::string name{};
  std::int32_t dtype{};  ///< rmmd.v1.DType's number, kept raw so the checks see unknown ones
  std::vector<std::uint64_t> shape{};
  std::uint64_t byte_offset{};
  std::vector<std::uint64_t> strides{};  ///< in elements; empty: contiguous, row-major
  std::vector<std::string> aliases{};    ///< other names of the same bytes (tied weights)
};

/// What a buffer holds: its tensors and labels (BufferManifest in rmmd.proto).
struct buffer_manifest {
  std::vector<tensor_entry> tensors{};
  std::map<std::string, std::string> labels{};

  [[nodiscard]] bool empty() const noexcept
  {
    return tensors.empty() && labels.empty();
  }
};

/// What an open asks beyond the name.
struct buffer_open_options {
  buffer_access access{buffer_access::read};
  /// The fingerprint guard: labels the buffer must carry with these values.
  std::map<std::string, std::string> expect_labels{};
  /// Take the buffer's write lease (docs/failover.md); needs read_write.
  bool exclusive{false};
  /// With exclusive: a standby (docs/failover.md, "A standby that is
  /// ready"): the open is answered at once, holding the lease if it is free
  /// and standing in line for it otherwise; wait_buffer_lease() waits.
  bool standby{false};
};

/// Which of its opens of a buffer a session closes (buffer_registry::close_buffer).
enum class hold_kind : std::uint8_t {
  read,        ///< a read open
  read_write,  ///< a plain read-write open, or the creator's create
  lease,       ///< the exclusive open, and with it the write lease
};

/// A session waiting for a buffer's write lease, as an operator sees it.
struct lease_waiter_info {
  session_id session{};
  pid_t pid{};
  uid_t uid{};
  std::chrono::system_clock::time_point since{};
};

/// A buffer's write lease as an operator sees it (docs/failover.md).
struct buffer_lease_info {
  std::uint64_t generation{};  ///< the latest grant's; 0: never granted
  session_id holder{};         ///< 0: nobody holds it
  pid_t holder_pid{};
  uid_t holder_uid{};
  std::chrono::system_clock::time_point granted{};
  std::vector<lease_waiter_info> waiters{};  ///< in the order they are served
  std::size_t plain_writers{};  ///< other sessions' plain read-write opens, which a grant waits for
};

/// Which buffers a listing wants: both filters together; empty: all.
struct buffer_filter {
  std::string name_prefix{};
  std::map<std::string, std::string> labels{};  ///< each must be carried with this value
};

/// A shared buffer as an operator sees it.
struct buffer_info {
  buffer_id id{};
  std::string name{};
  pool_id pool{};
  std::string pool_name{};
  std::size_t size{};            ///< bytes asked for
  std::size_t reserved_bytes{};  ///< bytes the pool reserved, charged to the creator's uid
  uid_t creator_uid{};
  pid_t creator_pid{};
  session_id creator_session{};
  std::optional<gid_t> gid{};
  std::size_t holders{};  ///< sessions holding it
  buffer_state state{};
  bool persistent{false};
  std::chrono::system_clock::time_point created{};
  bool allow_writers{false};
  std::map<std::string, std::string> labels{};  ///< its manifest's
  std::size_t tensor_count{};                   ///< its manifest's tensors
  /// Its write lease; nullopt while nobody ever asked for it.
  std::optional<buffer_lease_info> lease{};
};

/// Some of the live sessions (see session_registry::top_sessions), and what the rest
/// hold together.
struct session_listing {
  std::vector<session_info> sessions{};
  std::size_t session_count{};         ///< live sessions, listed or not
  std::size_t unlisted_bytes{};        ///< `bytes` of the sessions not listed
  std::size_t unlisted_allocations{};  ///< `allocation_count` of those
};

/// What the start found of the last daemon's buffers (stats, /metrics).
struct restart_summary {
  /// Daemons that wrote the state file before this one (0: a first start,
  /// or no state file).
  std::uint64_t restarts{};
  std::size_t adopted_buffers{};
  std::size_t adopted_bytes{};  ///< their allocations' bytes
  /// Stored buffers or fds not served, each said in the log.
  std::size_t dropped{};
  /// Buffers are kept across a restart (a service manager listens).
  bool keeping{false};
  /// Sessions opened since this start by clients reconnecting after a
  /// daemon before this one went away (counted by open_session).
  std::uint64_t reconnected_sessions{};
};

/// Where a session comes from, beside its peer: what its hello said.
struct session_origin {
  std::string client_name{};      ///< what the client called itself
  std::uint32_t reconnects{};     ///< 0: a first connection
  session_id previous_session{};  ///< its session with the daemon before (reconnects > 0)
};

/// One GPU's memory as the driver counts it, beside this daemon's ledger.
struct gpu_memory_use {
  std::string gpu_uuid{};
  int device{-1};
  std::size_t driver_used_bytes{};  ///< total minus free, every process's
  /// The daemon's CUDA pools there: what their backends reserve, and the
  /// bytes of their shared buffers and awake address-stable allocations
  /// (allocations of their own, outside the pools).
  std::size_t ledger_bytes{};
  /// driver_used_bytes - ledger_bytes (0 if below): held from before a
  /// restart, CUDA contexts, other processes.
  std::size_t unaccounted_bytes{};
  /// Address-stable memory given back and kept for its uid's next
  /// allocation (part of ledger_bytes).
  std::size_t spare_bytes{};
};

/// Bytes the driver counts as used on a device (by the daemon's ordinal), or
/// nullopt where it cannot say.
using driver_usage_source = std::function<std::optional<std::size_t>(int device)>;

struct stats_snapshot {
  std::vector<pool_stats> pools{};
  /// Every session (by id), or those holding the most (see
  /// pool_registry::stats).
  std::vector<session_info> sessions{};
  std::size_t session_count{};         ///< live sessions, listed or not
  std::size_t unlisted_bytes{};        ///< `bytes` of the sessions not listed
  std::size_t unlisted_allocations{};  ///< `allocation_count` of those
  /// Bytes of the shared buffers each uid created and that are not freed yet
  /// (charged to that uid's quota beside its sessions' leases, even after
  /// the creating session ended). Uids without any are absent.
  std::map<uid_t, std::size_t> uid_shared_bytes{};
  /// What the start took back from the daemon before it.
  restart_summary restart{};
  /// Per GPU of a CUDA pool, where a driver_usage_source is set.
  std::vector<gpu_memory_use> gpu_memory{};
};

/// An address-stable allocation as its session sees it (stable_registry.hpp).
struct stable_grant {
  stable_id id{};
  pool_id pool{};
  std::string tag{};
  std::size_t size{};   ///< bytes asked for
  std::size_t bytes{};  ///< its allocation's bytes: what the client maps, what is charged
  bool awake{false};    ///< its physical memory exists
  bool has_backup{false};
  /// Which backup it has (0: none): each backup the daemon makes or adopts
  /// has a number of its own, so a client that kept a mapping of the last
  /// one knows whether this is still it.
  std::uint64_t backup_serial{};
  /// Its memory's pieces' bytes, in the order they are mapped, when it is
  /// more than one (awake only): memory its uid gave back serves it.
  std::vector<std::size_t> pieces{};
};

/// One sleeper as an operator sees it: a session's sleeping allocations, or
/// those kept under a backup name after their session ended (session 0).
struct sleeper_info {
  session_id session{};
  uid_t uid{};
  pid_t pid{};
  std::string command{};
  std::string backup_name{};
  std::vector<std::string> tags{};  ///< of its sleeping allocations, sorted
  std::size_t sleeping_allocations{};
  std::size_t sleeping_bytes{};  ///< device bytes given back while they sleep
  std::size_t backup_bytes{};    ///< host bytes their backups hold
  std::size_t awake_bytes{};     ///< the same session's stable bytes awake
  std::chrono::system_clock::time_point asleep_since{};  ///< its earliest sleeper's
};

/// Sleep and wake, node-wide (metrics).
struct stable_totals {
  std::size_t awake_bytes{};
  std::size_t sleeping_bytes{};
  std::size_t backup_bytes{};
  std::size_t sleeping_allocations{};
  std::size_t kept_backup_names{};  ///< names whose session ended while they slept
  std::uint64_t wake_waits{};       ///< wakes that waited for room
  std::uint64_t wake_failures{};    ///< wakes refused for want of room
};

/// The upper bounds (seconds) of the takeover histogram's buckets; one more
/// bucket counts what is above the last.
inline constexpr std::array<double, 12> takeover_bounds_seconds{
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0};

/// Write leases, node-wide (metrics; docs/failover.md).
struct lease_totals {
  std::size_t held{};             ///< buffers whose lease a session holds now
  std::size_t waiters{};          ///< exclusive opens waiting now
  std::uint64_t grants{};         ///< leases granted, at once or after a wait
  std::uint64_t waits{};          ///< exclusive opens that waited in line
  std::uint64_t wait_timeouts{};  ///< waits that ended at their deadline (nothing changed)
  /// Takeovers: a holder's end (its close, or its session's end as the
  /// daemon handles it) to the grant to the waiter first in line, by
  /// takeover_bounds_seconds (the last bucket: above them).
  std::array<std::uint64_t, takeover_bounds_seconds.size() + 1> takeover_buckets{};
  double takeover_seconds_sum{};
};

}  // namespace rmmd::core
