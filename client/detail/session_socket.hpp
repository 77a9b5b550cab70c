#pragma once

// The session socket as the transport of datagram calls (SessionCall /
// SessionReply): the connection to the daemon the session talks to now,
// the calls' tags, one round trip at a time. What the daemon sends that
// answers no call in progress (a ReclaimRequest, a RetireBlocks, a late
// reply) is handed to the caller's `unasked` function as it is read.
//
// Owns: the fd of now, and those of earlier daemons (a reconnect replaces
// the fd; the old one stays open, and unused, until the session ends); all
// are closed by the destructor, which ends the session in the daemon.
//
// Locks: none of its own. Its owner (session_channel) holds its call mutex
// around send(), round_trip(), read_waiting() and replace(): one call at a
// time on the socket. fd() and closed() may be called from any thread (the
// fd is atomic; a poll of a replaced fd is harmless until the destructor).

#include "rmmd/v1/rmmd.pb.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <vector>

namespace rmmd::detail {

class session_socket {
 public:
  using clock = std::chrono::steady_clock;
  /// What a round trip hands on that answers no call in progress.
  using unasked_fn = std::function<void(v1::SessionReply const&)>;

  /// Takes `fd`, a session socket whose hello is done; replies are awaited
  /// up to `call_timeout`.
  session_socket(int fd, std::chrono::milliseconds call_timeout);
  session_socket(session_socket const&)            = delete;
  session_socket& operator=(session_socket const&) = delete;
  /// Closes every fd: the daemon (if any is there) ends the session.
  ~session_socket();

  [[nodiscard]] int fd() const noexcept
  {
    return fd_.load(std::memory_order_acquire);
  }
  /// Whether the daemon's end of the socket of now is closed (it went away).
  [[nodiscard]] bool closed() const noexcept;
  /// Takes the socket of a new daemon (hello done); the old one stays open.
  void replace(int fd);

  /// Sends `call` with a fresh tag, waiting within `deadline` while the
  /// daemon is behind. UNAVAILABLE when the socket is closed.
  grpc::Status send(v1::SessionCall& call, clock::time_point deadline);
  /// Sends `call` and waits for its reply within call_timeout: `reply`, and
  /// the fds attached to it in `fds` (null: closed). Earlier datagrams go to
  /// `unasked`. UNAVAILABLE when the daemon closed the socket,
  /// DEADLINE_EXCEEDED when no reply came in time.
  grpc::Status round_trip(v1::SessionCall& call,
                          v1::SessionReply& reply,
                          std::vector<int>* fds,
                          unasked_fn const& unasked);
  /// Hands every datagram waiting on the socket to `unasked`, without
  /// blocking (attached fds are closed).
  void read_waiting(unasked_fn const& unasked);

 private:
  /// Waits for `events` on the socket: false once the deadline passed.
  [[nodiscard]] bool wait(short events, clock::time_point deadline) const;
  [[nodiscard]] grpc::Status timed_out() const;

  std::chrono::milliseconds const call_timeout_;
  std::atomic<int> fd_;
  std::vector<int> old_fds_;
  std::uint64_t last_tag_{};
};

}  // namespace rmmd::detail
