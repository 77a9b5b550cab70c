#pragma once

// A program started with posix_spawn (fork+exec: CUDA cannot be used in a
// plain fork() child), with pipes on its stdin and stdout, and waits that end
// on an event or at a deadline, never on a fixed sleep. Shared by the test
// support (tests/tools) and rmmd_bench.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::harness {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

/// From a signal handler (async-signal-safe): SIGKILLs every child_process
/// started and not reaped yet, those started with `kill_last` after the rest.
void kill_all_children() noexcept;

/// A parent fd handed to the child under another number.
struct fd_map {
  int child_fd;
  int parent_fd;
};

/// How a child_process is started, beyond its argv and environment.
struct spawn_options {
  /// Parent fds the child gets under the given numbers; applied after the
  /// pipes, so a mapping of 1 or 2 replaces stdout or stderr.
  std::vector<fd_map> fds{};
  /// stderr into the stdout pipe; else it is inherited.
  bool merge_stderr{false};
  /// kill_all_children() kills it after the others (a daemon they talk to).
  bool kill_last{false};
  /// Run the child as this user (a name), with its primary and supplementary
  /// groups, through `setpriv` (see system_user.hpp); empty: as this process.
  /// The program and every directory above it must be reachable by that user.
  std::string user{};
};

class child_process {
 public:
  /// Starts argv[0] (a path) with stdin and stdout piped. `env` entries
  /// ("NAME=value") are added to this process's environment, each in place
  /// of this process's variable of that name. Throws
  /// std::system_error if it cannot be started, std::runtime_error if
  /// `opts.user` cannot be used (saying why).
  explicit child_process(std::vector<std::string> argv,
                         std::vector<std::string> env = {},
                         spawn_options opts           = {});
  child_process(child_process&& other) noexcept;
  child_process(child_process const&)            = delete;
  child_process& operator=(child_process const&) = delete;
  child_process& operator=(child_process&&)      = delete;
  /// SIGKILLs the child if it still runs, and reaps it.
  ~child_process();

  [[nodiscard]] pid_t pid() const noexcept
  {
    return pid_;
  }

  /// The next line of the child's stdout, without the newline; nullopt at EOF
  /// or at the deadline.
  std::optional<std::string> read_line(steady::time_point deadline);
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = 20s)
  {
    return read_line(steady::now() + timeout);
  }
  /// Everything until EOF (or the timeout), with what read_line() left.
  std::string read_all(std::chrono::milliseconds timeout = 20s);
  /// Throws std::system_error if the child no longer reads (it exited).
  /// REQUIRES: SIGPIPE is ignored in this process, or a closed pipe kills it.
  void write_line(std::string const& line);
  void close_stdin();
  /// Sends `signal` unless the child has been reaped (its pid may be reused).
  void kill(int signal) noexcept;

  /// Waits for the child to end: its exit status, or 128 + the signal that
  /// ended it; nullopt if it still runs at the deadline.
  std::optional<int> wait(steady::time_point deadline);
  std::optional<int> wait(std::chrono::milliseconds timeout = 20s)
  {
    return wait(steady::now() + timeout);
  }
  /// Waits up to `grace`, then SIGKILLs and reaps; the status, -1 if none
  /// could be had. Never throws.
  int finish(std::chrono::milliseconds grace) noexcept;

 private:
  pid_t pid_{-1};
  int pidfd_{-1};
  int stdin_fd_{-1};
  int stdout_fd_{-1};
  int slot_{-1};  // in kill_all_children()'s table
  std::string buffer_;
  std::optional<int> status_;
};

}  // namespace rmmd::harness
