#pragma once

// The real rmmd, started as a separate process in a runtime directory of its
// own (/tmp/<prefix>XXXXXX, removed again by the destructor) or in one the
// caller names (left in place, so that a daemon can be started again where a
// killed one ran), ready once it has sent READY=1 to a notify socket the
// starter owns, as systemd would see it; as this process's user, or as
// another one the way the shipped unit runs it (User=rmmd,
// RuntimeDirectoryMode=0750).

#include "harness/child_process.hpp"

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::harness {

class daemon_process {
 public:
  struct options {
    std::filesystem::path program;  // rmmd
    std::vector<std::string> args;  // after --runtime-dir DIR
    std::string dir_prefix{"rmmd-"};
    /// Run in this directory (created if missing; what a killed daemon left
    /// there stays) and leave it in place; empty: a fresh
    /// /tmp/<dir_prefix>XXXXXX, removed by the destructor.
    std::filesystem::path runtime_dir{};
    /// stdout and stderr into DIR/rmmd.log (see log_tail()); else stderr is
    /// inherited and stdout is a pipe (process().read_line()).
    bool log_to_file{false};
    /// kill_all_children() kills the daemon after its clients.
    bool kill_last{false};
    /// Run rmmd as this user (spawn_options::user) instead of this process's:
    /// the runtime directory is then given to that user and its primary group
    /// with mode 0750 (members of the group reach the sockets, as under
    /// systemd's RuntimeDirectory=), and so is the notify socket. REQUIRES:
    /// root, and rmmd's program reachable by that user.
    std::string user{};
    /// Added to the daemon's environment ("NAME=value"), e.g.
    /// CUDA_VISIBLE_DEVICES for a daemon that stands for another node.
    std::vector<std::string> env{};
    std::chrono::milliseconds ready_timeout{30s};
    /// How long the destructor waits after SIGTERM before it SIGKILLs.
    std::chrono::milliseconds stop_timeout{30s};
  };

  /// Throws std::runtime_error naming the reason (and the log's tail, with
  /// `log_to_file`) if rmmd does not send READY=1 within `ready_timeout`, or
  /// if `user` cannot be used; the runtime directory is removed again then.
  explicit daemon_process(options opts);
  daemon_process(daemon_process const&)            = delete;
  daemon_process& operator=(daemon_process const&) = delete;
  /// SIGTERM, SIGKILL after `stop_timeout`, then removes the runtime directory
  /// (unless it was given in `options::runtime_dir`).
  ~daemon_process();

  [[nodiscard]] std::filesystem::path const& runtime_dir() const noexcept
  {
    return dir_;
  }
  /// The full command line, rmmd's path first.
  [[nodiscard]] std::vector<std::string> const& argv() const noexcept
  {
    return argv_;
  }
  [[nodiscard]] child_process& process() noexcept
  {
    return *daemon_;
  }
  [[nodiscard]] pid_t pid() const noexcept
  {
    return daemon_->pid();
  }
  /// False once rmmd has exited.
  [[nodiscard]] bool alive();
  /// SIGTERM (unless it has exited), then its exit status; nullopt if it did
  /// not stop within `timeout`.
  std::optional<int> stop(std::chrono::milliseconds timeout = 30s);
  /// The last `lines` lines of DIR/rmmd.log, each indented; "(empty)" without
  /// `log_to_file`.
  [[nodiscard]] std::string log_tail(std::size_t lines = 20) const;

 private:
  std::filesystem::path dir_;
  bool owns_dir_{true};
  std::vector<std::string> argv_;
  std::chrono::milliseconds stop_timeout_;
  std::unique_ptr<child_process> daemon_;
};

}  // namespace rmmd::harness
