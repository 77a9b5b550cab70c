#pragma once

// The session socket (rmmd-session.sock): kernel-verified identity, the
// session token and the pools' fds by SCM_RIGHTS, and liveness by the open
// connection. See docs/protocol.md for the exchange.
//
// Thread safety: start(), stop_accepting() and stop() are called from one
// thread (main); the listener runs its own epoll thread.

#include "daemon/core/daemon_core.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <thread>

namespace rmmd::session {

struct listener_options {
  std::filesystem::path socket_path;
  /// A client that has not sent its hello by then is disconnected.
  std::chrono::milliseconds hello_deadline{2000};
  /// A larger hello is refused (INVALID_ARGUMENT) and disconnected.
  std::size_t max_hello_bytes{4096};
  /// Connections that have not yet said hello, at most; more are closed at once.
  std::size_t max_pending{64};
  /// Advertised in the welcome: the gRPC server's message size cap.
  std::uint32_t max_message_bytes{};
  /// Mode of the socket file.
  unsigned socket_mode{0660};
};

class session_listener {
 public:
  session_listener(core::daemon_core& core, listener_options options);
  session_listener(session_listener const&)            = delete;
  session_listener& operator=(session_listener const&) = delete;
  /// Calls stop().
  ~session_listener();

  /// Binds and listens (a stale socket file at the path is replaced), then
  /// serves on a thread of its own. Throws std::system_error on failure.
  void start();

  /// Closes the listening socket and removes its file: no new sessions, the
  /// open ones carry on.
  void stop_accepting();

  /// Stops the thread and closes every connection, ending their sessions.
  void stop() noexcept;

  /// Sessions whose connection is open.
  [[nodiscard]] std::size_t open_sessions() const noexcept
  {
    return open_sessions_.load();
  }

 private:
  void run() noexcept;

  core::daemon_core& core_;
  listener_options options_;
  int listen_fd_{-1};
  int wake_fd_{-1};
  std::atomic<bool> stop_accepting_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> open_sessions_{0};
  std::thread thread_;
};

}  // namespace rmmd::session
