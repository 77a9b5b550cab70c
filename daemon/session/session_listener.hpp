#pragma once

// The session socket (rmmd-session.sock): kernel-verified identity, the
// session token and the pools' fds by SCM_RIGHTS, liveness by the open
// connection, and the calls of the session on that connection. See
// docs/protocol.md for the exchange.
//
// Two parts with their own state: hello_loop (one thread: accepts
// connections, admits them, answers hellos) hands each welcomed connection to
// call_threads (answers its calls, ends its session at its close). This class
// owns the listening socket until hello_loop takes it, and wires the two to
// the core.
//
// Thread safety: start(), stop_accepting() and stop() are called from one
// thread (main); open_sessions() and set_admission_limits() from any.

#include "daemon/core/admission_limits.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/session/admission.hpp"
#include "daemon/session/call_threads.hpp"
#include "daemon/session/hello_loop.hpp"
#include "daemon/session/listener_options.hpp"

#include <atomic>
#include <cstddef>
#include <thread>

namespace rmmd::session_socket {

class session_listener {
 public:
  session_listener(core::daemon_core& core, listener_options options);
  session_listener(session_listener const&)            = delete;
  session_listener& operator=(session_listener const&) = delete;
  /// Calls stop().
  ~session_listener();

  /// Binds and listens (a stale socket file at the path is replaced), then
  /// serves on threads of its own. Throws std::system_error on failure.
  void start();

  /// Closes the listening socket and removes its file: no new sessions, the
  /// open ones carry on.
  void stop_accepting();

  /// Stops the threads and closes every connection, ending their sessions.
  void stop() noexcept;

  /// Sessions whose connection is open.
  [[nodiscard]] std::size_t open_sessions() const noexcept
  {
    return open_sessions_.load();
  }

  /// New admission limits (a reload), from the next connection and hello on;
  /// what is open stays open. Any thread.
  void set_admission_limits(core::admission_limits limits)
  {
    admission_.set_limits(limits);
  }

 private:
  /// Binds, sets the file's mode and listens; returns the socket.
  [[nodiscard]] int listen_on_path() const;

  core::daemon_core& core_;
  listener_options options_;
  admission admission_;
  std::atomic<std::size_t> open_sessions_{0};
  call_threads calls_;
  hello_loop hellos_;
  int wake_fd_{-1};  // wakes hello_loop to look at its flags
  std::atomic<bool> stop_accepting_{false};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace rmmd::session_socket
