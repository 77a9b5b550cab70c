#pragma once

// The session's line to the daemon: the session socket (the hello, then one
// datagram call at a time), the gRPC channel and its stub, the token, the
// calls' tags, the queue of calls that CUDA host functions leave to be sent,
// and the reader thread that hears what the daemon sends unasked.
//
// Owns: the socket fd (closed by the destructor: that ends the session in
// the daemon), the gRPC channel, the reader thread and its eventfd, the
// release queue (shared with host functions that may outlive the channel).
//
// Locks:
// - call_mutex_: one call at a time on the socket; guards last_tag_,
//   orphans_, reclaims_heard_, retired_heard_. Held across a round trip.
// - release_queue::mutex: the queued calls and the queue's back-pointer.
//   A holder of call_mutex_ may wait for it; a holder of it only tries
//   call_mutex_ (try_lock), so a host function never waits for a round trip.
// - reader_mutex_: starting the reader thread (a leaf).
// What the daemon sends unasked goes to the packed block imports (retired
// blocks) and the usage reports (reclaim requests) after call_mutex_ is let
// go: neither is called with it held.

#include <rmmd/session.hpp>

#include "rmmd/v1/rmmd.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace rmmd::detail {

class packed_block_imports;
class usage_reports;

/// Throws the exception DESIGN.md's error table gives for `status`, with
/// `what` (the request) in front of the daemon's message.
[[noreturn]] void throw_status(grpc::Status const& status, std::string_view what);

/// What the hello brought: the welcome, checked, and by pool id the fd that
/// came for it (-1 where none; the receiver owns them).
struct session_welcome {
  v1::SessionWelcome welcome;
  std::vector<int> pool_fds;
};

class session_channel {
 public:
  /// Connects to the session socket, says hello and fills `welcome`; then
  /// opens the gRPC channel. `options` outlives the channel. Throws
  /// session_error when no daemon answers, permission_error when this uid
  /// may not use it.
  session_channel(session::options const& options, session_welcome& welcome);
  session_channel(session_channel const&)            = delete;
  session_channel& operator=(session_channel const&) = delete;
  /// Closes the socket: the daemon frees whatever the session still holds.
  /// REQUIRES: close() ran.
  ~session_channel();

  /// Where unasked messages go (retired blocks, reclaim requests). Both
  /// outlive the reader thread (close() stops it).
  void connect_parts(packed_block_imports& packed, usage_reports& reports) noexcept
  {
    packed_  = &packed;
    reports_ = &reports;
  }

  /// Sends `call` and waits for its reply, within call_timeout, on whichever
  /// transport this session's calls take: a datagram on the session socket
  /// (the default, where the daemon takes them), else the gRPC method of the
  /// same name, whose response fills `reply`'s field of that call. Rules the
  /// callers need not know: an OpenBuffer that may wait (wait_ms > 0) is
  /// tried on the socket and, when the buffer is missing or unpublished,
  /// asked again over gRPC, where the daemon waits; a BufferFd goes on the
  /// socket whatever the options say (only it carries fds); a Ping on a
  /// gRPC session is FAILED_PRECONDITION. `fds`: where fds attached to the
  /// answer go (the caller's to close); null: any are closed. A call that
  /// cannot reach the daemon ends UNAVAILABLE or DEADLINE_EXCEEDED.
  grpc::Status call(v1::SessionCall& call,
                    v1::SessionReply* reply,
                    std::vector<int>* fds = nullptr);

  /// A call a CUDA host function sends once its stream reached it: the Free
  /// of an allocation whose import the stream freed, the publication of a
  /// shared buffer whose writes the stream did, the close of a buffer whose
  /// import it freed, the drop of a packed block.
  struct queued_call {
    enum class kind : std::uint8_t { free, publish_buffer, close_buffer, drop_block };
    kind what{kind::free};
    std::uint64_t id{};  ///< the allocation, buffer or packed block
  };
  /// Where those calls wait to be sent. Shared with the host functions that
  /// fill it, which may run after the session is gone (while the process
  /// exits): they find `channel` null then and drop the call (the daemon
  /// reclaims what a closed session held).
  struct release_queue {
    std::mutex mutex;
    session_channel* channel{};  // guarded by mutex; null once the session is gone
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
  /// that is held across a daemon round trip): sends `call` at once when no
  /// call is in progress (on the session socket without waiting for a reply:
  /// a failure is printed when a later call reads it); else the caller in
  /// progress sends it before it lets the socket go.
  static void send_when_reached(release_queue& queue, queued_call call) noexcept;

  /// Stops the reader thread, waits (up to call_timeout, not while the
  /// process exits) for the host functions of shared buffers, and detaches
  /// the release queue: calls queued from now on are dropped.
  void close() noexcept;

  /// Starts the reader thread once: a session that holds packed blocks or
  /// watches reclaims must hear the daemon while no call reads the socket.
  void start_reader();
  /// True on a session's reader thread (which keeps whichever device it
  /// made current).
  [[nodiscard]] static bool on_reader_thread() noexcept;

  /// A gRPC client context carrying the token and the call deadline, for the
  /// calls only gRPC carries (stats, usage reports, deletes, admin).
  [[nodiscard]] std::unique_ptr<grpc::ClientContext> context() const;
  [[nodiscard]] v1::Rmmd::Stub& stub() const noexcept
  {
    return *stub_;
  }
  /// The session's credential, as sent in `rmmd-token` metadata.
  [[nodiscard]] std::string const& token_hex() const noexcept
  {
    return token_hex_;
  }
  /// Whether the session's calls travel on the session socket.
  [[nodiscard]] bool uses_session_calls() const noexcept
  {
    return session_calls_;
  }
  /// Whether the daemon takes session-socket calls at all (whatever the
  /// options chose): BufferFd needs it.
  [[nodiscard]] bool daemon_takes_calls() const noexcept
  {
    return daemon_takes_calls_;
  }

 private:
  /// Holds call_mutex_; on release, sends the calls that host functions
  /// queued meanwhile (they could not take the socket while it was held).
  class call_lock;
  /// The gRPC method of `call`'s kind; its response fills `reply`.
  grpc::Status grpc_call(v1::SessionCall const& call, v1::SessionReply* reply) const;
  /// A datagram round trip: sends the queued calls first, then `call`.
  grpc::Status socket_call(v1::SessionCall& call, v1::SessionReply* reply, std::vector<int>* fds);
  /// Sends the queued calls. Holds call_mutex_.
  void send_releases_locked(std::vector<queued_call>& calls) noexcept;
  /// Sends queued calls while there are any and the socket is free.
  void drain_releases() noexcept;
  grpc::Status call_locked(v1::SessionCall& call, v1::SessionReply* reply, std::vector<int>* fds);
  grpc::Status send_locked(v1::SessionCall& call, std::chrono::steady_clock::time_point deadline);
  /// Frees the leases granted to calls that had given up waiting. Holds call_mutex_.
  void free_orphans_locked();
  /// A datagram that answers no call in progress: a ReclaimRequest (its pool
  /// goes to reclaims_heard_), a RetireBlocks (to retired_heard_), or a late
  /// reply (an error is printed, a lease granted is an orphan to free).
  /// Holds call_mutex_.
  void take_unasked_locked(v1::SessionReply const& reply);
  /// Hands what was heard unasked to the parts that act on it. Holds no lock.
  void act_on_unasked(std::vector<std::uint64_t> const& retired,
                      std::vector<std::uint32_t> const& reclaims) noexcept;
  /// The thread that reads the session socket while no call does, so that a
  /// ReclaimRequest or RetireBlocks is heard at once: it polls the socket and
  /// reader_wake_fd_.
  void read_unasked(std::stop_token stop) noexcept;
  /// Takes every datagram waiting on the socket. Holds call_mutex_.
  void read_waiting_locked();
  /// Waits for `events` on the session socket: false once the deadline passed.
  [[nodiscard]] bool wait_socket(short events,
                                 std::chrono::steady_clock::time_point deadline) const;
  [[nodiscard]] grpc::Status timed_out() const;

  session::options const& options_;
  int socket_fd_{-1};
  bool session_calls_{false};
  bool daemon_takes_calls_{false};
  std::string token_hex_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rmmd::Stub> stub_;
  packed_block_imports* packed_{};
  usage_reports* reports_{};

  std::mutex call_mutex_;
  std::uint64_t last_tag_{};
  std::vector<std::uint64_t> orphans_;         // allocations granted after their call timed out
  std::vector<std::uint32_t> reclaims_heard_;  // pools whose reclaim a call read
  std::vector<std::uint64_t> retired_heard_;   // blocks whose retirement a call read
  std::shared_ptr<release_queue> releases_ = std::make_shared<release_queue>();

  std::mutex reader_mutex_;
  int reader_wake_fd_{-1};  // eventfd: stops read_unasked
  std::jthread reader_;
};

}  // namespace rmmd::detail
