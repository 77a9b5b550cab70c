#pragma once

// The session's line to the daemon: the session socket (the hello, then one
// datagram call at a time), the gRPC channel and its stub, the token, the
// calls' tags, the queue of calls that CUDA host functions leave to be sent,
// and the reader thread that hears what the daemon sends unasked; and the
// reconnect to a restarted daemon (session::options::reconnect).
//
// Generations: each daemon the session has connected to is a generation
// (0 the first, then one more per reconnect). The ids the parts hold
// (allocations, packed blocks, shared buffers) are *client ids*: the
// daemon's id with the generation in bits 48 to 62 (generation 0: the
// daemon's id itself). Pool ids are those of the first welcome, matched to
// each later daemon's pools by name and GPU. The channel translates both
// ways, in one place (to_daemon / from_daemon): a call about an older
// generation's id is answered here (a Free or a close: done, nothing to ask;
// the new daemon never lent it), unless it is a shared buffer the new daemon
// holds for this session again, whose new id it takes. The reconnect and
// the translation live in session_reconnect.cpp, the hello in
// session_hello.hpp.
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
// - ids_mutex_: the token, the gRPC stubs, the pool id tables, the held
//   buffers and their new ids, the reconnects not yet told (a leaf).
// A reconnect holds call_mutex_ throughout (calls wait for it; host
// functions queue theirs) and calls the parts' hooks under it (the pool
// mappings' lock and the packed imports' locks are taken after call_mutex_,
// never before). on_reconnect runs after call_mutex_ is let go.
// What the daemon sends unasked goes to the packed block imports (retired
// blocks) and the usage reports (reclaim requests) after call_mutex_ is let
// go: neither is called with it held.

#include <rmmd/session.hpp>

#include "rmmd/v1/rmmd.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rmmd::detail {

class packed_block_imports;
class usage_reports;

/// Throws the exception DESIGN.md's error table gives for `status`, with
/// `what` (the request) in front of the daemon's message.
[[noreturn]] void throw_status(grpc::Status const& status, std::string_view what);

/// The node that the daemon answered it cannot reach (v1::ErrorDetails in
/// `status`'s details; set on UNAVAILABLE and DEADLINE_EXCEEDED only); ""
/// where the status carries none, as one that gRPC made itself never does.
[[nodiscard]] std::string unreachable_node(grpc::Status const& status);

/// What the hello brought: the welcome, checked, and by pool id the fd that
/// came for it (-1 where none; the receiver owns them).
struct session_welcome {
  v1::SessionWelcome welcome;
  std::vector<int> pool_fds;
};

/// Client ids (see above): the daemon's id with the generation in bits 48-62.
inline constexpr unsigned generation_shift      = 48;
inline constexpr std::uint32_t generation_count = 1u << 15;
inline constexpr std::uint64_t daemon_id_mask   = (std::uint64_t{1} << generation_shift) - 1;
[[nodiscard]] constexpr std::uint32_t generation_of(std::uint64_t client_id) noexcept
{
  return static_cast<std::uint32_t>(client_id >> generation_shift) & (generation_count - 1);
}
[[nodiscard]] constexpr std::uint64_t client_id(std::uint64_t daemon_id,
                                                std::uint32_t generation) noexcept
{
  return daemon_id | (std::uint64_t{generation} << generation_shift);
}

/// What the session's parts do when the channel has reconnected, called
/// with call_mutex_ held (they must not call the channel).
struct reconnect_hooks {
  /// Takes the new daemon's welcome (its pool fds too) as generation
  /// `generation`; `daemon_pool`: by pool id of the first welcome, the new
  /// daemon's id of that pool, -1 where it serves none such.
  std::function<void(std::uint32_t generation,
                     session_welcome&& welcome,
                     std::vector<std::int64_t> const& daemon_pool)>
      adopt_pools;
  /// The daemon of generation `old` is gone: its packed blocks go where
  /// nothing lives in them.
  std::function<void(std::uint32_t old)> forget_generation;
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

  /// Where unasked messages go (retired blocks, reclaim requests), and what
  /// the parts do on a reconnect. All outlive the reader thread (close()
  /// stops it).
  void connect_parts(packed_block_imports& packed,
                     usage_reports& reports,
                     reconnect_hooks hooks) noexcept
  {
    packed_  = &packed;
    reports_ = &reports;
    hooks_   = std::move(hooks);
  }

  /// The session's id at the daemon now, and its reconnects so far.
  [[nodiscard]] std::uint64_t session_id() const noexcept
  {
    return session_id_.load(std::memory_order_acquire);
  }
  [[nodiscard]] std::uint32_t reconnects() const noexcept
  {
    return reconnects_.load(std::memory_order_acquire);
  }
  /// The generation of the daemon the session talks to now (see above).
  [[nodiscard]] std::uint32_t generation() const noexcept
  {
    return generation_.load(std::memory_order_acquire);
  }
  /// The first welcome's pool `pool_id` at the daemon of now; nullopt when
  /// that daemon serves no such pool (an id no welcome described: itself).
  [[nodiscard]] std::optional<std::uint32_t> daemon_pool(std::uint32_t pool_id) const;
  /// The first welcome's id of the daemon of now's pool `daemon_pool_id`.
  [[nodiscard]] std::optional<std::uint32_t> session_pool(std::uint32_t daemon_pool_id) const;
  /// The daemon's id of shared buffer `id` (a client id) now: its own, or the
  /// new one of a buffer held again after a reconnect; nullopt when the
  /// daemon of now does not know it.
  [[nodiscard]] std::optional<std::uint64_t> daemon_buffer(std::uint64_t id) const;

  /// A call of the kind only gRPC carries (stats, listings, deletes,
  /// manifests, reports, admin): `rpc(stub, context, generation)` makes it
  /// with the stub and a context of the daemon of that generation. Reconnects
  /// as every call does (below).
  using unary_rpc =
      std::function<grpc::Status(v1::Rmmd::Stub&, grpc::ClientContext*, std::uint32_t generation)>;
  grpc::Status call(unary_rpc const& rpc);
  /// Sends `call` and waits for its reply, within call_timeout, on whichever
  /// transport this session's calls take: a datagram on the session socket
  /// (the default, where the daemon takes them), else the gRPC method of the
  /// same name, whose response fills `reply`'s field of that call. Rules the
  /// callers need not know: an OpenBuffer that may wait (wait_ms > 0) is
  /// tried on the socket and, when the buffer is missing or unpublished,
  /// asked again over gRPC, where the daemon waits; a BufferFd goes on the
  /// socket whatever the options say (only it carries fds); a Ping on a
  /// gRPC session is FAILED_PRECONDITION; an OpenBuffer of another node's
  /// buffer (`peer` set) goes by gRPC. `fds`: where fds attached to the
  /// answer go (the caller's to close); null: any are closed. A call that
  /// cannot reach the daemon ends UNAVAILABLE or DEADLINE_EXCEEDED.
  ///
  /// Reconnecting (options.reconnect > 0), for both calls, decided in one
  /// place (reconnecting()): a gRPC call that finds the session socket
  /// closed (the daemon went away while the session was idle) reconnects
  /// first; a try that fails because its daemon is gone
  /// (UNAVAILABLE with the socket closed, or UNAUTHENTICATED from a new
  /// daemon that does not know the old token) reconnects and tries again at
  /// the new daemon. A Free or a close that finds its daemon gone is done.
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

  /// A gRPC client context carrying the token and the call deadline, for a
  /// caller that makes its call on stub() itself (rmmd's tools): a session
  /// whose daemon went away reconnects first, as call() does; a failure of
  /// the call itself is the caller's (call(unary_rpc) tries again).
  [[nodiscard]] std::unique_ptr<grpc::ClientContext> context();
  /// The stub of the gRPC channel of now (those of earlier daemons stay
  /// valid, for calls under way, until the session ends).
  [[nodiscard]] v1::Rmmd::Stub& stub() const noexcept
  {
    return *stub_.load(std::memory_order_acquire);
  }
  /// The session's credential, as sent in `rmmd-token` metadata.
  [[nodiscard]] std::string token_hex() const;
  /// Whether the session's calls travel on the session socket.
  [[nodiscard]] bool uses_session_calls() const noexcept
  {
    return session_calls_.load(std::memory_order_relaxed);
  }
  /// Whether the daemon takes session-socket calls at all (whatever the
  /// options chose): BufferFd needs it.
  [[nodiscard]] bool daemon_takes_calls() const noexcept
  {
    return daemon_takes_calls_.load(std::memory_order_relaxed);
  }

 private:
  /// Holds call_mutex_; on release, sends the calls that host functions
  /// queued meanwhile (they could not take the socket while it was held).
  class call_lock;
  /// The gRPC method of `call`'s kind; its response fills `reply`.
  grpc::Status grpc_call(v1::SessionCall const& call,
                         v1::SessionReply* reply,
                         std::uint32_t generation) const;
  /// call() on one daemon (generation `generation`): on the socket or gRPC.
  /// ABORTED when the generation is past (a reconnect came between).
  grpc::Status route(v1::SessionCall& call,
                     v1::SessionReply* reply,
                     std::vector<int>* fds,
                     std::uint32_t generation);
  /// A datagram round trip: sends the queued calls first, then `call`.
  grpc::Status socket_call(v1::SessionCall& call,
                           v1::SessionReply* reply,
                           std::vector<int>* fds,
                           std::uint32_t generation);
  /// `call`'s ids as the daemon of `generation` knows them; an answer when
  /// the call is about what only an earlier daemon knew (see above).
  std::optional<grpc::Status> to_daemon(v1::SessionCall& call, std::uint32_t generation) const;
  /// `reply`'s ids as client ids (and pool ids of the first welcome).
  grpc::Status from_daemon(v1::SessionReply& reply, std::uint32_t generation) const;
  /// Notes the buffers a successful `call` opened or closed (held_).
  void note_holds(v1::SessionCall const& call, v1::SessionReply const& reply);
  /// After a call to generation `generation` failed for want of a daemon:
  /// reconnects unless another call did. False when the daemon is there (it
  /// answered UNAVAILABLE itself), reconnecting is off, or no daemon came
  /// back within the bound.
  /// A call failed with `code`: whether the daemon that answered (or none) is
  /// a new one, reconnected to now (reconnect_after).
  bool daemon_replaced(grpc::StatusCode code, std::uint32_t generation);
  bool reconnect_after(std::uint32_t generation);
  /// Connects to the daemon serving the runtime directory now, says hello,
  /// and makes it the session's: the parts' hooks, the held buffers opened
  /// again. Holds call_mutex_. False (and gone_) when none came in time.
  bool reconnect_locked();
  /// Takes a welcome: token, transport, gRPC channel. Holds call_mutex_
  /// (or is the constructor).
  void adopt_welcome_locked(v1::SessionWelcome const& welcome, std::uint32_t generation);
  /// Waits `wait` before the next try to reconnect (less when the channel closes).
  void wait_to_retry(std::chrono::steady_clock::duration wait) const noexcept;
  /// Opens the held buffers again at the new daemon. Holds call_mutex_.
  void hold_again_locked(reconnect_info& info, std::string& unknown);
  /// Runs on_reconnect for the reconnects not yet told. Holds no lock.
  void tell_reconnects() noexcept;
  /// Whether the session socket of now is closed at the daemon's end.
  [[nodiscard]] bool socket_closed() const noexcept;
  /// A context for generation `generation`, null when it is past.
  [[nodiscard]] std::unique_ptr<grpc::ClientContext> context_for(std::uint32_t generation) const;
  /// The same, holding ids_mutex_.
  [[nodiscard]] std::unique_ptr<grpc::ClientContext> context_for_locked(
      std::uint32_t generation) const;
  /// The reconnect decision of every call (see call()): `attempt(generation)`
  /// makes one try at the daemon of that generation; tries again while the
  /// one before was meant for a daemon that is gone and a new one is there.
  /// `look_first`: reconnect first when the session socket is closed.
  grpc::Status reconnecting(bool look_first,
                            std::function<grpc::Status(std::uint32_t generation)> const& attempt);
  /// Reconnects when the session socket is closed (the daemon went away).
  void reconnect_if_gone();
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
  std::atomic<int> socket_fd_{-1};  // written under call_mutex_
  std::atomic<bool> session_calls_{false};
  std::atomic<bool> daemon_takes_calls_{false};
  packed_block_imports* packed_{};
  usage_reports* reports_{};
  reconnect_hooks hooks_;

  // Reconnects. Written under call_mutex_.
  std::atomic<std::uint32_t> generation_{0};  // modulo generation_count
  std::atomic<std::uint32_t> reconnects_{0};
  std::atomic<std::uint64_t> session_id_{0};
  bool gone_{false};          // no daemon came back: no more tries
  std::vector<int> old_fds_;  // earlier daemons' sockets, closed with the channel
  std::atomic<bool> closing_{false};

  mutable std::mutex ids_mutex_;
  std::string token_hex_;
  std::vector<std::shared_ptr<grpc::Channel>> grpc_channels_;  // every daemon's
  std::vector<std::unique_ptr<v1::Rmmd::Stub>> stubs_;
  std::atomic<v1::Rmmd::Stub*> stub_{nullptr};  // the last of stubs_
  std::vector<std::string> first_pool_keys_;    // by pool id: name and GPU
  std::vector<std::int64_t> to_daemon_pool_;    // by pool id: the daemon's, -1 none
  std::vector<std::int64_t> from_daemon_pool_;  // by the daemon's pool id: ours, -1 none
  struct held_buffer {
    std::string name;
    std::string peer;  ///< the node of a buffer of another node
    std::size_t opens{};
  };
  std::unordered_map<std::uint64_t, held_buffer> held_;       // by client id of now
  std::unordered_map<std::uint64_t, std::uint64_t> renamed_;  // earlier id -> id of now
  /// Reconnects not yet told (on_reconnect), with the generation each ended.
  std::vector<std::pair<reconnect_info, std::uint32_t>> untold_;
  std::mutex tell_mutex_;  // one teller at a time

  std::mutex call_mutex_;
  std::uint64_t last_tag_{};
  std::vector<std::uint64_t> orphans_;         // allocations granted after their call timed out
  std::vector<std::uint32_t> reclaims_heard_;  // pools whose reclaim a call read
  std::vector<std::uint64_t> retired_heard_;   // blocks whose retirement a call read
  std::shared_ptr<release_queue> releases_ = std::make_shared<release_queue>();

  std::mutex reader_mutex_;
  std::atomic<int> reader_wake_fd_{-1};  // eventfd: stops read_unasked (and a reconnect's wait)
  std::jthread reader_;
};

}  // namespace rmmd::detail
