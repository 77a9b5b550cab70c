#pragma once

// The session's line to the daemon: one call() for every request, which
// chooses the transport (a datagram on the session socket, or gRPC) and
// makes the reconnect decision (session::options::reconnect) in one place;
// what the daemon sends unasked, handed to the parts that act on it; and
// the reconnect to a restarted daemon. Its state lives in parts that own it:
//
// - session_socket (session_socket.hpp): the datagram transport, the fds;
// - session_ids (session_ids.hpp): the daemon of now (generation, token,
//   stubs) and the translation of ids between the session and it;
// - session_reader (session_reader.hpp): the thread that hears the daemon
//   while no call does;
// - release_queue (release_queue.hpp): the calls CUDA host functions leave;
// - the hello (session_hello.hpp); a status's meaning (call_status.hpp).
// The reconnect lives in session_reconnect.cpp.
//
// Owns, besides those parts: the leases granted to calls that had given up
// waiting (to free), what calls heard unasked (to hand on), the reconnect
// count and whether the session is over.
//
// Locks:
// - call_mutex_: one call at a time on the socket (session_socket's
//   functions run under it); guards orphans_, reclaims_heard_,
//   retired_heard_, gone_. Held across a round trip.
// - release_queue::mutex: a holder of call_mutex_ may wait for it; a holder
//   of it only tries call_mutex_ (try_send_now), so a host function never
//   waits for a round trip.
// - session_ids' mutex and the reader's start mutex: leaves.
// - tell_mutex_: one thread at a time tells on_reconnect (held with no
//   other lock, tried, never waited for).
// A reconnect holds call_mutex_ throughout (calls wait for it; host
// functions queue theirs) and calls the parts' hooks under it (the pool
// mappings' lock and the packed imports' locks are taken after call_mutex_,
// never before). on_reconnect runs after call_mutex_ is let go. What the
// daemon sends unasked goes to the packed block imports (retired blocks)
// and the usage reports (reclaim requests) after call_mutex_ is let go:
// neither is called with it held.

#include <rmmd/session.hpp>

#include "client/detail/call_status.hpp"
#include "client/detail/release_queue.hpp"
#include "client/detail/session_ids.hpp"
#include "client/detail/session_reader.hpp"
#include "client/detail/session_socket.hpp"
#include "rmmd/v1/rmmd.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace rmmd::detail {

class packed_block_imports;
class usage_reports;

/// What the hello brought: the welcome, checked, and by pool id the fd that
/// came for it (-1 where none; the receiver owns them).
struct session_welcome {
  v1::SessionWelcome welcome;
  std::vector<int> pool_fds;
};

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

class session_channel final : private release_sender {
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
    return ids_.session_id();
  }
  [[nodiscard]] std::uint32_t reconnects() const noexcept
  {
    return reconnects_.load(std::memory_order_acquire);
  }
  /// The generation of the daemon the session talks to now (session_ids.hpp).
  [[nodiscard]] std::uint32_t generation() const noexcept
  {
    return ids_.generation();
  }
  /// Id translation (session_ids.hpp).
  [[nodiscard]] std::optional<std::uint32_t> daemon_pool(std::uint32_t pool_id) const
  {
    return ids_.daemon_pool(pool_id);
  }
  [[nodiscard]] std::optional<std::uint32_t> session_pool(std::uint32_t daemon_pool_id) const
  {
    return ids_.session_pool(daemon_pool_id);
  }
  [[nodiscard]] std::optional<std::uint64_t> daemon_buffer(std::uint64_t id) const
  {
    return ids_.daemon_buffer(id);
  }

  /// Sends `call` and waits for its reply, within call_timeout, on whichever
  /// transport this session's calls take: a datagram on the session socket
  /// (the default, where the daemon takes them), else the gRPC method of the
  /// same name, whose response fills `reply`'s field of that call. Rules the
  /// callers need not know: an OpenBuffer that may wait (wait_ms > 0) is
  /// tried on the socket and, when the buffer is missing or unpublished
  /// (or, exclusive, its write lease is held), asked again over gRPC, where
  /// the daemon waits; a BufferFd goes on the
  /// socket whatever the options say (only it carries fds); a Ping on a
  /// gRPC session is FAILED_PRECONDITION; an OpenBuffer of another node's
  /// buffer (`peer` set) goes by gRPC. `fds`: where fds attached to the
  /// answer go (the caller's to close); null: any are closed. A call that
  /// cannot reach the daemon ends UNAVAILABLE or DEADLINE_EXCEEDED.
  ///
  /// Reconnecting (options.reconnect > 0), for both calls, is decided in
  /// one place (reconnecting()): a gRPC call that finds the session socket
  /// closed (the daemon went away while the session was idle) reconnects
  /// first; a try that fails because its daemon is gone (UNAVAILABLE with
  /// the socket closed, or UNAUTHENTICATED from a new daemon that does not
  /// know the old token) reconnects and tries again at the new daemon. A
  /// Free or a close that finds its daemon gone is done.
  grpc::Status call(v1::SessionCall& call,
                    v1::SessionReply* reply,
                    std::vector<int>* fds = nullptr);
  /// A call of the kind only gRPC carries (stats, listings, deletes,
  /// manifests, reports, admin): `rpc(stub, context, generation)` makes it
  /// with the stub and a context of the daemon of that generation.
  using unary_rpc =
      std::function<grpc::Status(v1::Rmmd::Stub&, grpc::ClientContext*, std::uint32_t generation)>;
  grpc::Status call(unary_rpc const& rpc);

  /// The calls CUDA host functions leave (release_queue.hpp).
  using queued_call   = detail::queued_call;
  using release_queue = detail::release_queue;
  [[nodiscard]] std::shared_ptr<release_queue> const& releases() const noexcept
  {
    return releases_;
  }
  /// From a CUDA host function (so: no CUDA calls, and no waiting for a lock
  /// that is held across a daemon round trip): sends `call` at once when no
  /// call is in progress (on the session socket without waiting for a reply:
  /// a failure is printed when a later call reads it); else the caller in
  /// progress sends it before it lets the socket go.
  static void send_when_reached(release_queue& queue, queued_call call) noexcept
  {
    queue.send_when_reached(call);
  }

  /// Stops the reader thread, waits (up to call_timeout, not while the
  /// process exits) for the host functions of shared buffers, and detaches
  /// the release queue: calls queued from now on are dropped.
  void close() noexcept;

  /// Starts the reader thread once: a session that holds packed blocks or
  /// watches reclaims must hear the daemon while no call reads the socket.
  void start_reader()
  {
    reader_.start();
  }
  /// True on a session's reader thread (which keeps whichever device it
  /// made current).
  [[nodiscard]] static bool on_reader_thread() noexcept
  {
    return session_reader::on_reader_thread();
  }

  /// A gRPC client context carrying the token and the call deadline, for a
  /// caller that makes its call on stub() itself (rmmd's tools): a session
  /// whose daemon went away reconnects first, as call() does; a failure of
  /// the call itself is the caller's (call(unary_rpc) tries again).
  [[nodiscard]] std::unique_ptr<grpc::ClientContext> context();
  /// The stub of the gRPC channel of now (those of earlier daemons stay
  /// valid, for calls under way, until the session ends).
  [[nodiscard]] v1::Rmmd::Stub& stub() const noexcept
  {
    return ids_.stub();
  }
  /// The session's credential, as sent in `rmmd-token` metadata.
  [[nodiscard]] std::string token_hex() const
  {
    return ids_.token_hex();
  }
  /// Whether the session's calls travel on the session socket.
  [[nodiscard]] bool uses_session_calls() const noexcept
  {
    return ids_.session_calls();
  }
  /// Whether the daemon takes session-socket calls at all (whatever the
  /// options chose): BufferFd needs it.
  [[nodiscard]] bool daemon_takes_calls() const noexcept
  {
    return ids_.daemon_takes_calls();
  }

 private:
  /// Holds call_mutex_; on release, tells reconnects not yet told and sends
  /// the calls that host functions queued meanwhile.
  class call_lock;

  // Transports (session_channel.cpp).
  /// call() on one daemon (generation `generation`): on the socket or gRPC.
  /// ABORTED when the generation is past (a reconnect came between).
  grpc::Status route(v1::SessionCall& call,
                     v1::SessionReply* reply,
                     std::vector<int>* fds,
                     std::uint32_t generation);
  /// The gRPC method of `call`'s kind; its response fills `reply`.
  grpc::Status grpc_call(v1::SessionCall const& call,
                         v1::SessionReply* reply,
                         std::uint32_t generation) const;
  /// A datagram round trip: sends the queued calls first, then `call`.
  grpc::Status socket_call(v1::SessionCall& call,
                           v1::SessionReply* reply,
                           std::vector<int>* fds,
                           std::uint32_t generation);
  /// A round trip on the socket. Holds call_mutex_.
  grpc::Status round_trip_locked(v1::SessionCall& call,
                                 v1::SessionReply* reply,
                                 std::vector<int>* fds);

  // What the daemon sends unasked (session_channel.cpp).
  /// A datagram that answers no call in progress: a ReclaimRequest (its pool
  /// goes to reclaims_heard_), a RetireBlocks (to retired_heard_), or a late
  /// reply (an error is printed, a lease granted is an orphan to free).
  /// Holds call_mutex_.
  void take_unasked_locked(v1::SessionReply const& reply);
  /// Frees the leases granted to calls that had given up waiting. Holds call_mutex_.
  void free_orphans_locked();
  /// Hands what was heard unasked to the parts that act on it. Holds no lock.
  void act_on_unasked(std::vector<std::uint64_t> const& retired,
                      std::vector<std::uint32_t> const& reclaims) noexcept;
  /// The reader thread found datagrams waiting: takes them and acts.
  void read_unasked() noexcept;

  // Queued calls (session_channel.cpp).
  bool try_send_now(std::vector<queued_call>& calls) noexcept override;
  /// Sends the queued calls. Holds call_mutex_.
  void send_releases_locked(std::vector<queued_call>& calls) noexcept;
  /// Sends queued calls while there are any and the socket is free.
  void drain_releases() noexcept;

  // Reconnecting (session_reconnect.cpp).
  /// One try of a call (see reconnecting()): a reference to the caller's
  /// callable `grpc::Status(std::uint32_t generation)`, valid while the
  /// call lasts. Unlike std::function it never allocates (every call makes
  /// one).
  class attempt_ref {
   public:
    template <class F>
    requires(!std::is_same_v<std::decay_t<F>, attempt_ref>) attempt_ref(F&& f)
    noexcept  // NOLINT(google-explicit-constructor): a callable's view
        : object_(&f), try_([](void const* object, std::uint32_t generation) {
            return (*static_cast<std::remove_reference_t<F>*>(const_cast<void*>(object)))(
                generation);
          })
    {
    }
    grpc::Status operator()(std::uint32_t generation) const
    {
      return try_(object_, generation);
    }

   private:
    void const* object_;
    grpc::Status (*try_)(void const*, std::uint32_t);
  };
  /// The reconnect decision of every call (see call()): `attempt(generation)`
  /// makes one try at the daemon of that generation; tries again while the
  /// one before was meant for a daemon that is gone and a new one is there.
  /// `look_first`: reconnect first when the session socket is closed.
  grpc::Status reconnecting(bool look_first, attempt_ref attempt);
  /// Reconnects when the session socket is closed (the daemon went away).
  void reconnect_if_gone();
  /// ABORTED: the daemon a try was meant for was replaced while it waited
  /// (reconnecting() tries again).
  [[nodiscard]] static grpc::Status reconnected_meanwhile();
  [[nodiscard]] static bool is_reconnected_meanwhile(grpc::Status const& s);
  /// A call to generation `generation` failed with `code`: whether its
  /// daemon is gone and the session reconnected to a new one now.
  bool daemon_replaced(grpc::StatusCode code, std::uint32_t generation);
  /// After a call to (or the reader's watch of) generation `generation`
  /// found its daemon gone: reconnects unless another call did. False when
  /// the daemon is there, reconnecting is off, or none came back in time.
  bool reconnect_after(std::uint32_t generation);
  /// Connects to the daemon serving the runtime directory now, says hello,
  /// and makes it the session's: the parts' hooks, the held buffers opened
  /// again. Holds call_mutex_. False (and gone_) when none came in time.
  bool reconnect_locked();
  /// Says hello to a daemon until one answers, within the reconnect bound:
  /// the socket, or -1 (and gone_) when none came.
  int connect_again_locked(session_welcome& welcome, std::uint32_t count);
  /// Opens the held buffers again at the new daemon. Holds call_mutex_.
  void hold_again_locked(reconnect_info& info, std::string& unknown);
  /// Runs on_reconnect for the reconnects not yet told. Holds no lock.
  void tell_reconnects() noexcept;

  session::options const& options_;
  packed_block_imports* packed_{};
  usage_reports* reports_{};
  reconnect_hooks hooks_;

  session_socket socket_;
  session_ids ids_;
  std::atomic<std::uint32_t> reconnects_{0};  // written under call_mutex_
  std::atomic<bool> closing_{false};
  std::mutex tell_mutex_;

  std::mutex call_mutex_;
  bool gone_{false};                           // no daemon came back: no more tries
  std::vector<std::uint64_t> orphans_;         // allocations granted after their call timed out
  std::vector<std::uint32_t> reclaims_heard_;  // pools whose reclaim a call read
  std::vector<std::uint64_t> retired_heard_;   // blocks whose retirement a call read
  std::shared_ptr<release_queue> releases_ = std::make_shared<release_queue>();

  session_reader reader_;  // last: its thread stops before the rest goes
};

class session_channel::call_lock {
 public:
  explicit call_lock(session_channel& c) : c_(c)
  {
    c_.call_mutex_.lock();
  }
  call_lock(call_lock const&)            = delete;
  call_lock& operator=(call_lock const&) = delete;
  ~call_lock()
  {
    c_.call_mutex_.unlock();
    c_.tell_reconnects();
    c_.drain_releases();
  }

 private:
  session_channel& c_;
};

}  // namespace rmmd::detail
