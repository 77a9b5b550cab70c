#pragma once

// A stand-in for systemd's service manager, for tests of a service that
// keeps fds in its file-descriptor store: it speaks the documented protocol
// from the manager's side, as systemd does where it is PID 1.
//
//  - The notify socket: an AF_UNIX datagram socket with SO_PASSCRED, whose
//    path the service gets as NOTIFY_SOCKET. Each datagram is newline-
//    separated assignments (READY=1, STATUS=..., FDSTORE=1, FDNAME=...,
//    FDPOLL=0, FDSTOREREMOVE=1), fds by SCM_RIGHTS. As systemd with
//    NotifyAccess=main, a message from any pid but the service's main pid is
//    ignored and its fds closed (a message without credentials too).
//  - The fd store, as systemd keeps it (src/core/service.c): FDSTORE=1 keeps
//    the message's fds under its FDNAME ("stored" if none, or if the name is
//    not valid); an fd already in the store (the same open file) is not
//    kept twice; past `fd_store_max` the fd is closed and a line is logged;
//    fds without FDSTORE=1 are closed. FDSTOREREMOVE=1 with FDNAME closes
//    every stored fd of that name. Stored fds stay stored when they are
//    passed to the next start; they go only by FDSTOREREMOVE or
//    clear_store() (`systemctl clean --what=fdstore`).
//  - Starting the service: fork, then in the child LISTEN_PID=<its pid>,
//    LISTEN_FDS=<n>, LISTEN_FDNAMES=<names joined by ':'> and the fds at
//    3, 4, ... (the sockets given in the options first, then the store in
//    the order stored), then exec. (posix_spawn cannot set LISTEN_PID to the
//    child's own pid; this process never starts CUDA, so a fork is safe.)
//    The LISTEN_ variables are set only when there is at least one fd.
//
// The manager's log() holds what systemd would write to its journal about
// the service (a refused message, a full store, an invalid name).
//
// Thread safety: a thread of its own receives the notify messages; every
// public function may be called from any thread, but start() and
// kill_service() from one thread at a time.

#include "harness/child_process.hpp"

#include <sys/types.h>

#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace rmmd::harness {

struct service_manager_options {
  /// Where the notify socket is bound (it must not exist).
  std::filesystem::path notify_socket;
  /// FileDescriptorStoreMax=.
  std::size_t fd_store_max{4096};
  /// Fds passed before the store's at every start, as a .socket unit's
  /// (name, fd): the manager keeps a dup of each.
  std::vector<std::pair<std::string, int>> sockets{};
};

/// A message the manager received.
struct notify_message {
  pid_t sender{-1};
  std::string text;
  std::size_t fds{0};
};

class service_manager {
 public:
  /// Binds the notify socket and starts receiving. Throws std::system_error.
  explicit service_manager(service_manager_options options);
  service_manager(service_manager const&)            = delete;
  service_manager& operator=(service_manager const&) = delete;
  /// SIGKILLs the service if it runs, stops receiving, closes every fd and
  /// removes the socket file.
  ~service_manager();

  /// Starts `argv` (argv[0] a path) with this process's environment plus
  /// `env` ("NAME=value"), NOTIFY_SOCKET and the LISTEN_ variables (above).
  /// Throws std::system_error if it cannot fork; a failed exec ends the child
  /// with status 127. REQUIRES: no service runs.
  void start(std::vector<std::string> argv, std::vector<std::string> env = {});

  /// Sends `signal` to the service (SIGKILL: a crash) and reaps it; the
  /// store stays. Nothing if none runs. Returns its wait status.
  std::optional<int> kill_service(int signal = SIGKILL);

  /// The service's wait status once it exited by itself; nullopt at the
  /// deadline (it still runs) or if none was started.
  std::optional<int> wait_exit(steady::time_point deadline);

  /// The main pid, -1 if none runs.
  [[nodiscard]] pid_t main_pid() const;

  /// The first message of the current service (since its start) holding
  /// `text`; nullopt at the deadline or once the service exited without it.
  std::optional<std::string> wait_for(std::string_view text, steady::time_point deadline);

  /// Waits until `done(stored_names())` holds; false at the deadline.
  bool wait_for_store(std::function<bool(std::vector<std::string> const&)> const& done,
                      steady::time_point deadline);

  /// Waits until a line of log() holds `text`; false at the deadline.
  bool wait_for_log(std::string_view text, steady::time_point deadline);

  /// The names of the stored fds, in store order.
  [[nodiscard]] std::vector<std::string> stored_names() const;

  /// Closes every stored fd.
  void clear_store();

  /// Every message received, accepted or not, in order.
  [[nodiscard]] std::vector<notify_message> messages() const;

  /// What systemd would log about the service, in order.
  [[nodiscard]] std::vector<std::string> log() const;

 private:
  struct stored_fd {
    std::string name;
    int fd;
  };
  void receive_loop();
  void handle(notify_message message, std::vector<int> fds);
  void add_to_store(int fd, std::string const& name);

  service_manager_options options_;
  int socket_fd_{-1};
  int stop_fd_{-1};  // an eventfd that ends receive_loop
  std::thread receiver_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  pid_t main_pid_{-1};
  int pidfd_{-1};
  std::size_t first_message_of_service_{0};
  std::vector<stored_fd> store_;
  std::vector<notify_message> messages_;
  std::vector<std::string> log_;
};

}  // namespace rmmd::harness
