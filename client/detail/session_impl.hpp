#pragma once

// Private to librmmd_client and rmmd's own tools: the session's socket, token
// and gRPC stub. Public headers never include this (no gRPC outside).

#include <rmmd/session.hpp>

#include "client/detail/process_exit.hpp"

#include "rmmd/v1/rmmd.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rmmd::detail {

/// Throws the exception DESIGN.md's error table gives for `status`, with
/// `what` (the request) in front of the daemon's message.
[[noreturn]] void throw_status(grpc::Status const& status, std::string_view what);

class session_impl {
 public:
  explicit session_impl(session::options opts);
  session_impl(session_impl const&)            = delete;
  session_impl& operator=(session_impl const&) = delete;
  ~session_impl();

  /// A client context carrying the token and the call deadline.
  [[nodiscard]] std::unique_ptr<grpc::ClientContext> context() const;
  [[nodiscard]] v1::Rmmd::Stub& stub() const noexcept
  {
    return *stub_;
  }
  /// Allocate and Free over the transport the options chose (gRPC where the
  /// daemon answers no session calls). A call that cannot reach the daemon
  /// ends UNAVAILABLE or DEADLINE_EXCEEDED, as a gRPC call would.
  [[nodiscard]] grpc::Status allocate(v1::AllocateRequest const& request,
                                      v1::AllocateResponse* response);
  [[nodiscard]] grpc::Status free(v1::FreeRequest const& request);

  /// A lease, and where it lies when it is packed.
  struct granted_lease {
    lease granted;
    std::uint64_t block_id{};  ///< 0: an allocation of its own
    std::uint64_t block_offset{};
  };
  /// Allocate, checked (session::allocate). With `may_pack` (and the session
  /// socket), the daemon may carve a small CUDA allocation out of a packed
  /// block (AllocateRequest.may_pack): the caller finds it with
  /// packed_block_base(). Throws as error.hpp says.
  granted_lease lease_memory(std::uint32_t pool_id,
                             std::size_t bytes,
                             std::size_t alignment,
                             bool may_pack);
  /// The address of packed block `block` of CUDA pool `pool_id` in this
  /// process: imported from `export_data` (cudaMemPoolPtrExportData) the
  /// first time, and kept until the daemon retires the block (RetireBlocks)
  /// or the session ends. Each packed lease counts as live in its block from
  /// its grant (call()) until its Free is sent: a RetireBlocks naming a block
  /// with live leases (a daemon's bug) is not obeyed. Throws rmm::bad_alloc
  /// when the import fails.
  void* packed_block_base(std::uint32_t pool_id, std::uint64_t block, void const* export_data);

  /// A call a CUDA host function sends once its stream reached it: the Free
  /// of an allocation whose import the stream freed, the publication of a
  /// shared buffer whose writes the stream did, the close of a buffer whose
  /// import it freed.
  struct queued_call {
    enum class kind : std::uint8_t { free, publish_buffer, close_buffer, drop_block };
    kind what{kind::free};
    std::uint64_t id{};  ///< the allocation, buffer or packed block
  };
  /// Where those calls wait to be sent. Shared with the host functions that
  /// fill it, which may run after the session is gone (while the process
  /// exits): they find `session` null then and drop the call (the daemon
  /// reclaims what a closed session held).
  struct release_queue {
    std::mutex mutex;
    session_impl* session{};  // guarded by mutex; null once the session is gone
    std::vector<queued_call> calls;
    /// Host functions of shared buffers enqueued and not yet run: the
    /// session waits for them before it closes (the daemon would free a
    /// buffer whose import a stream still uses).
    std::size_t buffer_jobs{};
    std::condition_variable buffer_jobs_done;
  };
  [[nodiscard]] std::shared_ptr<release_queue> const& releases() const noexcept
  {
    return releases_;
  }
  /// From a CUDA host function (so: no CUDA calls, and no waiting for a lock
  /// that is held across a daemon round trip): frees allocation `id` now that
  /// the stream freed its import. Sends the Free at once when no call is in
  /// progress (on the session socket without waiting for a reply: a failure
  /// is printed when a later call reads it); else the caller in progress
  /// sends it before it lets the socket go.
  static void free_when_reached(release_queue& queue, std::uint64_t id) noexcept;
  /// The same for any queued call.
  static void send_when_reached(release_queue& queue, queued_call call) noexcept;

  /// Shared buffer calls, on the session socket where the daemon takes them
  /// (gRPC otherwise). An open that may wait (`wait` > 0) and finds the
  /// buffer missing or unpublished asks again over gRPC, where the daemon
  /// waits for it. Each returns the call's status; the grant is checked.
  [[nodiscard]] grpc::Status create_buffer(v1::CreateBufferRequest const& request,
                                           v1::BufferGrant* grant);
  [[nodiscard]] grpc::Status open_buffer(std::string const& name,
                                         std::chrono::milliseconds wait,
                                         v1::BufferGrant* grant);
  [[nodiscard]] grpc::Status publish_buffer(std::uint64_t id);
  [[nodiscard]] grpc::Status close_buffer(std::uint64_t id);

  /// This process's view of a buffer the session holds: imported (CUDA) or
  /// mapped (host) once per session however often it is opened; `refs`
  /// counts the opens not closed.
  struct buffer_view {
    void* data{};
    std::uint32_t pool_id{};
    std::size_t refs{};
    /// A CUDA buffer's own allocation, mapped here (0: a pool pointer or
    /// host memory): the driver's handle and the mapped bytes.
    std::uint64_t vmm_handle{};
    std::size_t mapped_bytes{};
  };
  /// The view of `grant`'s buffer: the existing one (one more ref), or a new
  /// import. Throws as error.hpp says (the caller closes the open then).
  void* attach_buffer(v1::BufferGrant const& grant);
  /// Drops one ref; returns the view when it was the last (the caller then
  /// lets go of a CUDA import, in stream order, before the close goes out).
  std::optional<buffer_view> detach_buffer(std::uint64_t id) noexcept;
  /// Unmaps and releases a view of a buffer's own allocation (vmm_handle set).
  /// REQUIRES: the work of every stream that used it is done.
  static void unmap_allocation(buffer_view const& view) noexcept;
  /// The fd of a buffer's own allocation (BufferFd on the session socket,
  /// whatever transport the other calls take: only it carries fds). The
  /// caller owns it. Throws as error.hpp says.
  int buffer_fd(std::uint64_t id);

  /// One round trip on the session socket that changes nothing.
  /// FAILED_PRECONDITION when the daemon answers no session calls.
  [[nodiscard]] grpc::Status ping();
  /// Whether allocate() and free() use the session socket.
  [[nodiscard]] bool uses_session_calls() const noexcept
  {
    return session_calls_;
  }

  /// ReportUsage: replaces the daemon's figures for those pools.
  std::vector<std::uint32_t> send_usage(std::vector<carved_usage> const& usage);
  /// What one slab-mode resource (`reporter`) has carved from a pool now.
  /// The daemon keeps one figure per session and pool, so the session sends
  /// the sum over its resources of that pool. Returns the pools under pressure.
  std::vector<std::uint32_t> report_carved(void const* reporter, carved_usage const& usage);
  /// `reporter` is gone: the others' sum goes to the daemon (best effort).
  void forget_reporter(void const* reporter, std::uint32_t pool_id) noexcept;
  /// Sends the sum of what the resources of `pool_id` carved. Holds carved_mutex_.
  std::vector<std::uint32_t> send_carved_locked(std::uint32_t pool_id);

  /// See session::watch_reclaims.
  std::uint64_t watch_reclaims(std::uint32_t pool_id,
                               std::function<void(std::uint32_t)> on_request);
  void unwatch_reclaims(std::uint64_t watch_id) noexcept;

  /// Registers the process-exit watch (process_exit.hpp) once per session,
  /// not once per buffer: each registration is an atexit entry.
  void watch_exit_once() noexcept
  {
    std::call_once(exit_watched_, watch_process_exit);
  }

  /// The session's credential, as sent in `rmmd-token` metadata.
  [[nodiscard]] std::string const& token_hex() const noexcept
  {
    return token_hex_;
  }

  std::uint64_t id{};
  session::options options;
  /// The pools, their `device` mapped to this process's CUDA ordinals by GPU
  /// UUID (once, at first use: a session that uses no CUDA pool never
  /// initialises CUDA).
  [[nodiscard]] std::vector<pool_info> const& pools() noexcept;
  /// The pools as the welcome described them (device: the daemon's ordinal).
  [[nodiscard]] std::vector<pool_info> const& pools_unmapped() const noexcept
  {
    return pools_;
  }

  [[nodiscard]] std::byte* host_pool_base(std::uint32_t pool_id);
  [[nodiscard]] std::byte* pinned_host_pool_base(std::uint32_t pool_id);
  [[nodiscard]] cudaMemPool_t cuda_pool(std::uint32_t pool_id);

 private:
  /// Sends `call` (with a fresh tag) and waits for its reply, both within
  /// call_timeout; then frees any orphans.
  grpc::Status call(v1::SessionCall& call,
                    v1::SessionReply* reply,
                    std::vector<int>* fds = nullptr);
  /// Holds call_mutex_; on release, sends the frees that host functions
  /// queued meanwhile (they could not take the socket while it was held).
  class call_lock;
  /// Sends the queued calls. Holds call_mutex_ and releases_->mutex.
  void send_releases_locked(std::vector<queued_call>& calls) noexcept;
  /// Sends queued frees while there are any and the socket is free.
  void drain_releases() noexcept;
  /// `fds`: where the fds attached to the answer go (the caller's to close);
  /// null: any are closed.
  grpc::Status call_locked(v1::SessionCall& call,
                           v1::SessionReply* reply,
                           std::vector<int>* fds = nullptr);
  grpc::Status send_locked(v1::SessionCall& call, std::chrono::steady_clock::time_point deadline);
  /// A datagram that answers no call in progress: a ReclaimRequest (its pool
  /// is put in `reclaims`), or a late reply (an error is printed, a lease
  /// granted is an orphan to free). Holds call_mutex_.
  void take_unasked_locked(v1::SessionReply const& reply, std::vector<std::uint32_t>& reclaims);
  /// Frees this process's imports of packed blocks the daemon retired, then
  /// tells it (BlocksDropped, queued like a Free). Holds no call_mutex_.
  void drop_blocks(std::vector<std::uint64_t> const& blocks) noexcept;
  /// Frees every packed block's import (the session is closing). Waits for it.
  void drop_all_blocks() noexcept;
  /// Starts read_unasked(). Holds watches_mutex_.
  void start_reader_locked();
  /// Runs the watches of each pool in `reclaims`. Holds no call_mutex_.
  void run_reclaim_watches(std::vector<std::uint32_t> const& reclaims) noexcept;
  /// The thread that reads the session socket while no call does, so that a
  /// ReclaimRequest is heard at once: it polls the socket and wake_fd_.
  void read_unasked(std::stop_token stop) noexcept;
  /// Waits for `events` on the session socket: false once the deadline passed.
  [[nodiscard]] bool wait_socket(short events,
                                 std::chrono::steady_clock::time_point deadline) const;
  [[nodiscard]] grpc::Status timed_out() const;

  int socket_fd_{-1};
  bool session_calls_{false};
  bool daemon_takes_calls_{false};  // the welcome said session_calls (whatever options chose)
  std::mutex call_mutex_;           // one call at a time on the socket
  std::uint64_t last_tag_{};
  std::vector<std::uint64_t> orphans_;  // allocations granted after their call timed out
  std::shared_ptr<release_queue> releases_ = std::make_shared<release_queue>();
  std::vector<pool_info> pools_;
  std::once_flag devices_mapped_;
  std::once_flag exit_watched_;
  std::string token_hex_;
  std::vector<int> pool_fds_;                // by pool id, -1 where the pool has no fd
  std::vector<std::string> fabric_handles_;  // by pool id, empty where none
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rmmd::Stub> stub_;
  std::mutex carved_mutex_;  // held across a report, so reports go out in order
  std::unordered_map<std::uint32_t, std::unordered_map<void const*, carved_usage>> carved_;
  std::mutex map_mutex_;
  std::unordered_map<std::uint32_t, std::pair<std::byte*, std::size_t>> mappings_;
  std::unordered_map<std::uint32_t, cudaMemPool_t> cuda_pools_;
  std::unordered_set<std::uint32_t> pinned_;  // host pools registered with CUDA
  /// attach_buffer() for a buffer's own allocation. Holds buffers_mutex_.
  void* attach_allocation(v1::BufferGrant const& grant, pool_info const& pool);
  std::mutex buffers_mutex_;
  std::unordered_map<std::uint64_t, buffer_view> buffers_;  // by buffer id
  struct reclaim_watch {
    std::uint32_t pool_id{};
    std::function<void(std::uint32_t)> on_request;
  };
  std::mutex watches_mutex_;  // held while a watch runs, so unwatch waits for it
  std::uint64_t next_watch_{1};
  std::unordered_map<std::uint64_t, reclaim_watch> watches_;
  std::vector<std::uint32_t> reclaims_heard_;  // guarded by call_mutex_: read by a call, to run
  std::vector<std::uint64_t> retired_heard_;   // guarded by call_mutex_: blocks to drop
  struct packed_import {
    void* base{};
    std::uint32_t pool_id{};
  };
  std::mutex packed_mutex_;
  std::unordered_map<std::uint64_t, packed_import> packed_;  // by block id
  /// The packed leases whose Free is not sent yet, and how many each block
  /// holds. A leaf lock: held for nothing else (Frees are sent under
  /// call_mutex_, and drop_blocks holds packed_mutex_).
  std::mutex packed_live_mutex_;
  std::unordered_map<std::uint64_t, std::uint64_t> packed_lease_block_;  // lease -> block
  std::unordered_map<std::uint64_t, std::size_t> packed_block_live_;     // block -> leases
  /// Lease `lease` is live in packed block `block` (once, however often said;
  /// not at all when memory runs out).
  void count_packed_lease(std::uint64_t lease, std::uint64_t block) noexcept;
  /// Lease `lease` is no longer live in its packed block (if it is in one):
  /// its Free is about to be sent. Returns that block, or 0.
  std::uint64_t forget_packed_lease(std::uint64_t lease) noexcept;
  std::unordered_map<int, cudaStream_t> drop_streams_;  // by device; non-blocking
  int reader_wake_fd_{-1};                              // eventfd: stops read_unasked
  std::jthread reader_;                                 // started by the first watch
};

}  // namespace rmmd::detail
