#pragma once

// The accepting side of the session socket, run on a thread of its own: takes
// connections, reads each peer's kernel-verified credentials, admits it
// (admission), answers its hello with a welcome or a refusal, and hands each
// welcomed connection on. Owns the listening socket (until stop_accepting)
// and the connections that have not said hello yet.
//
// Thread safety: run() and every step it takes run on one thread; the state
// it shares with others is admission's (locked) and the open-session count
// (atomic).

#include "daemon/core/daemon_core.hpp"
#include "daemon/session/admission.hpp"
#include "daemon/session/listener_options.hpp"
#include "daemon/session/session_protocol.hpp"

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>

namespace rmmd::session_socket {

class hello_loop {
 public:
  /// Takes a welcomed connection (its fd now theirs) with its session.
  using welcomed_function =
      std::function<void(int fd, core::session_id session, core::peer_credentials const& peer)>;

  /// Counts each session it opens in `open_sessions` (the one who ends the
  /// session takes it off).
  hello_loop(core::daemon_core& core,
             listener_options const& options,
             admission& admission,
             std::atomic<std::size_t>& open_sessions,
             welcomed_function welcomed);
  hello_loop(hello_loop const&)            = delete;
  hello_loop& operator=(hello_loop const&) = delete;

  /// Serves `listen_fd` (which it closes, removing the socket file, once
  /// `stop_accepting` is set) until `stopping` is set; `wake_fd` (an eventfd,
  /// not its own) is written to make it look at both flags.
  void run(int listen_fd,
           int wake_fd,
           std::atomic<bool> const& stop_accepting,
           std::atomic<bool> const& stopping) noexcept;

 private:
  using clock = std::chrono::steady_clock;

  /// A connection that has not said hello yet; it counts in admission_.
  struct connection {
    int fd{-1};
    core::peer_credentials peer;
    clock::time_point deadline;
    core::session_id session{};  // set once the welcome is sent
  };

  /// What reading a hello led to.
  enum class hello_outcome : std::uint8_t { wait, refused, welcomed };

  void watch(int fd, std::uint32_t events) noexcept;
  /// The epoll timeout that wakes the loop at the earliest hello deadline.
  [[nodiscard]] int next_deadline_ms() const;
  void on_event(epoll_event const& event);
  /// Takes what the backlog holds, a bounded number per turn; true when it
  /// stopped at the bound (more may wait).
  bool accept_some();
  /// Reads a connection's hello and answers it.
  hello_outcome on_readable(connection& c);
  /// Answers a connection with an error welcome (the caller closes it).
  hello_outcome refuse(connection const& c, absl::Status const& status);
  /// Sends the refusal handle_hello() wrote, undoing the admission.
  hello_outcome refuse_hello(connection const& c, hello_answer const& answer);
  /// Sends the welcome of the session handle_hello() opened.
  hello_outcome welcome(connection& c, hello_answer const& answer);
  /// Forgets a connection that has not said hello, closing it unless it was
  /// handed on.
  void forget(int fd, bool close) noexcept;
  void drop(int fd) noexcept
  {
    forget(fd, true);
  }
  /// Closes the connections whose hello deadline has passed.
  void close_silent();
  /// A drain's end of accepting: no new connection reaches the socket, and
  /// those that did are answered (refused as draining) rather than reset.
  void stop_listening();
  void close_listener() noexcept;

  core::daemon_core& core_;
  listener_options const& options_;
  admission& admission_;
  std::atomic<std::size_t>& open_sessions_;
  welcomed_function welcomed_;
  int ep_{-1};
  int listen_fd_{-1};
  int wake_fd_{-1};
  std::map<int, connection> conns_;
};

}  // namespace rmmd::session_socket
