#pragma once

#include <rmmd/error.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd {

namespace detail {
class session_impl;
struct session_access;  // client/detail/session_access.hpp: the library's own way in
}  // namespace detail

enum class backend_kind { host, cuda };

/// A pool the daemon serves, as described in the session's welcome.
struct pool_info {
  std::uint32_t id{};
  std::string name;
  /// This process's CUDA ordinal for the pool's GPU (found by its UUID, so
  /// CUDA_VISIBLE_DEVICES may renumber freely); -1 for host pools and for a
  /// GPU this process cannot see.
  int device{-1};
  backend_kind backend{};
  std::size_t capacity_bytes{};
  bool has_fabric_handle{false};  ///< CUDA pools: importable by fabric handle too
  std::size_t max_alignment{};    ///< largest alignment the pool accepts
  bool pinnable{false};           ///< host pools: usable by pinned_host_memory_resource
  /// CUDA pools: the GPU as every process names it, "GPU-5f3c2b1a-..." as
  /// nvidia-smi -L prints it, and its PCI bus id "0000:3b:00.0" (empty from a
  /// daemon older than 0.2, which `device` then numbers as the daemon does).
  std::string gpu_uuid{};
  std::string pci_bus_id{};
};

/// What a slab-mode resource carved out of its slabs of one pool.
struct carved_usage {
  std::uint32_t pool_id{};
  std::size_t bytes{};
  std::size_t allocation_count{};
  /// Its slabs of that pool, carved or not (0: not said; idle = slab_bytes -
  /// bytes), and of those the bytes of slabs with nothing carved, which the
  /// session gives back when the daemon asks: a session that reports any must
  /// watch for those requests (watch_reclaims).
  std::size_t slab_bytes{};
  std::size_t reclaimable_bytes{};
};

/// How a session sends its Allocate and Free calls.
enum class call_transport {
  /// On the session socket, one datagram each way (when the daemon offers it;
  /// else as gRPC calls): about a sixth of a gRPC call's round trip.
  session_socket,
  /// As gRPC calls on the daemon's gRPC socket.
  grpc,
};

/// What a session that reconnected to a restarted daemon passes to
/// session::options::on_reconnect.
struct reconnect_info {
  std::uint64_t previous_session_id{};  ///< the session id the daemon that went away gave
  std::uint64_t session_id{};           ///< the new daemon's session id (session::id() now)
  std::uint32_t reconnects{};           ///< this session's reconnects so far, this one included
  std::size_t buffers_held_again{};     ///< open shared buffers the new daemon holds for it again
  std::size_t buffers_unknown{};        ///< open shared buffers the new daemon does not know
};

/// One allocation the daemon granted to this session.
struct lease {
  /// The daemon's allocation id; once the session has reconnected (see
  /// session::options::reconnect), bits 48 to 62 hold the reconnect count
  /// (modulo 2^15) of the daemon that granted it.
  std::uint64_t id{};
  std::size_t bytes{};          ///< bytes reserved, >= bytes asked for
  std::uint64_t host_offset{};  ///< host pools: offset into the pool's mapping
  /// CUDA pools: the pointer's cudaMemPoolPtrExportData.
  std::array<std::byte, sizeof(cudaMemPoolPtrExportData)> cuda_export{};
};

/// A connection to the node's rmmd: the session socket (kept open for the
/// life of the session; its close is how the daemon learns this process is
/// gone and reclaims what it held; Allocate and Free travel on it too) and the
/// gRPC channel for the other requests.
///
/// A copyable handle: copies share one session, which closes when the last
/// copy (and every resource made from it) is destroyed.
///
/// Thread safety: every member may be called from any thread.
class session {
 public:
  struct options {
    /// Where the daemon's sockets are: $RMMD_RUNTIME_DIR, else /run/rmmd.
    std::filesystem::path runtime_dir = default_runtime_dir();
    /// Shown in `rmmctl stats` beside the kernel's command name.
    std::string client_name{};
    /// Longest a request may take before it fails with session_error.
    std::chrono::milliseconds call_timeout{std::chrono::seconds(30)};
    /// Import CUDA pools by their fabric handle instead of the posix fd
    /// (what a process on another node of an NVLink domain must do).
    bool import_by_fabric{false};
    /// How allocate() and free() reach the daemon.
    call_transport lease_calls{call_transport::session_socket};
    /// How long a session whose daemon went away (its session socket
    /// closed) waits for a daemon to serve the runtime directory again, and
    /// then reconnects to it: tries with a backoff from 50 ms doubling up to
    /// 2 s, a new hello and welcome, the pools imported again (the new
    /// daemon's pools, matched by name and GPU). Memory held from the old
    /// daemon stays valid and is freed locally (no request: the new daemon
    /// never lent it); slab-mode resources carve from their old slabs until
    /// they give them back; new allocations come from the new daemon; open
    /// shared buffers stay mapped and are held again by name where the new
    /// daemon has them. Calls made meanwhile wait for the reconnect. Each
    /// reconnect prints one line on stderr and runs on_reconnect. A daemon
    /// that does not come back within this bound: the call fails with
    /// session_error as with zero. Zero: no reconnect (every later call
    /// fails with session_error "the daemon is gone").
    std::chrono::milliseconds reconnect{std::chrono::seconds(60)};
    /// Runs after each reconnect, on the thread that reconnected (a caller's,
    /// or the session's reader), with no lock of the session held: it may
    /// call the session. It must not throw (what it throws is printed and
    /// dropped).
    std::function<void(reconnect_info const&)> on_reconnect{};
  };

  static std::filesystem::path default_runtime_dir();

  /// Connects and says hello. Throws session_error when no daemon answers,
  /// permission_error when this uid may not use it.
  session();
  explicit session(options opts);

  /// The daemon's id for this session (a new one after each reconnect).
  [[nodiscard]] std::uint64_t id() const noexcept;
  /// How many times this session has reconnected to a restarted daemon.
  [[nodiscard]] std::uint32_t reconnects() const noexcept;
  [[nodiscard]] std::vector<pool_info> const& pools() const noexcept;
  /// Throws rmmd::logic_error naming the pools there are.
  [[nodiscard]] pool_info const& pool(std::string_view name) const;
  /// The first host pool. Throws rmmd::logic_error if there is none.
  [[nodiscard]] pool_info const& host_pool() const;

  /// Low-level requests (the memory resources are built on these).
  /// Throws as error.hpp says. Calls from several threads on the session
  /// socket take turns (one call at a time per session).
  [[nodiscard]] lease allocate(std::uint32_t pool_id,
                               std::size_t bytes,
                               std::size_t alignment) const;
  /// A lease of a daemon this session has reconnected away from (or whose
  /// daemon is gone, while the session may reconnect) is freed without a
  /// request: the daemon that lent it took it along.
  void free(std::uint64_t allocation_id) const;

  /// Tells the daemon what slab-mode resources carved (replacing the last
  /// report for those pools). Returns the ids of the pools under pressure,
  /// whose idle slabs should go back now.
  std::vector<std::uint32_t> report_usage(std::vector<carved_usage> const& usage) const;

  /// For whatever keeps idle memory leased (a slab-mode resource): runs
  /// `on_request(pool_id)` each time the daemon asks this session to give
  /// back, now, its slabs of `pool_id` with nothing carved, because another
  /// session's request waits for the room. It runs on a thread of the
  /// session's (started by the first watch; it reads the session socket while
  /// no call does) or on the thread of a call that read the request, so it
  /// must not block: wake the thread that gives the slabs back (as Frees) and
  /// reports its usage again. Which device is current when it runs is not
  /// said (the session's thread makes current whichever it needs). Returns
  /// the watch's id for unwatch_reclaims().
  std::uint64_t watch_reclaims(std::uint32_t pool_id,
                               std::function<void(std::uint32_t)> on_request) const;
  /// Ends a watch; once it returns, its on_request is not running and will not run.
  void unwatch_reclaims(std::uint64_t watch_id) const noexcept;

  /// This process's mapping of a host pool, made once per session.
  /// REQUIRES: pool_id names a host pool.
  [[nodiscard]] std::byte* host_pool_base(std::uint32_t pool_id) const;

  /// The same mapping, page-locked for CUDA (cudaHostRegister) once per
  /// session, so kernels and copies use it directly. Throws rmmd::logic_error
  /// when the pool is not pinnable, rmm::bad_alloc when registration fails.
  [[nodiscard]] std::byte* pinned_host_pool_base(std::uint32_t pool_id) const;

  /// This process's import of a CUDA pool, made once per session.
  /// REQUIRES: pool_id names a CUDA pool. Throws rmm::bad_alloc naming the
  /// CUDA error if the import fails.
  [[nodiscard]] cudaMemPool_t cuda_pool(std::uint32_t pool_id) const;

  /// The pool on this process's CUDA device `device` (the first CUDA pool on
  /// that GPU, matched by UUID). Throws rmmd::logic_error naming the GPUs the
  /// daemon serves when none is on it.
  [[nodiscard]] pool_info const& device_pool(int device) const;

  /// Frees `allocation_id` without waiting for the daemon, as the memory
  /// resources' stream-ordered free does from its CUDA host function: sent at
  /// once when no call is in progress (on the session socket, answered only
  /// if it fails: a failure is printed when a later call reads it), else by
  /// the call in progress before it lets the socket go. For callers that time
  /// that path (rmmd_host_pairs); others call free().
  void free_without_reply(std::uint64_t allocation_id) const noexcept;

  friend bool operator==(session const& a, session const& b) noexcept
  {
    return a.impl_ == b.impl_;
  }

 private:
  friend struct detail::session_access;
  std::shared_ptr<detail::session_impl> impl_;
};

}  // namespace rmmd
