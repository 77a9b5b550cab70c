#pragma once

// Test support: programs started with posix_spawn (fork+exec: CUDA cannot be
// used in a plain fork() child), with pipes on stdin and stdout, and waits
// that end on an event or a deadline, never on a fixed sleep.

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::test {

using namespace std::chrono_literals;

/// Where our programs are: $RMMD_BIN_DIR, else beside this test binary (a
/// bundle), else the build tree this test was built in.
std::filesystem::path program_path(std::string const& name);

class child_process {
 public:
  /// Starts argv[0] (a path) with stdin and stdout piped; stderr is inherited,
  /// or sent into the stdout pipe with `merge_stderr`. `env` entries
  /// ("NAME=value") are added to this process's environment.
  explicit child_process(std::vector<std::string> argv,
                         std::vector<std::string> env = {},
                         bool merge_stderr            = false);
  child_process(child_process&& other) noexcept;
  child_process(child_process const&)            = delete;
  child_process& operator=(child_process const&) = delete;
  child_process& operator=(child_process&&)      = delete;
  /// Kills (SIGKILL) and reaps the child if it still runs.
  ~child_process();

  [[nodiscard]] pid_t pid() const noexcept
  {
    return pid_;
  }

  /// The next line of the child's stdout, without the newline; nullopt at EOF
  /// or when `timeout` passes first.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = 20s);
  /// Everything until EOF (or the timeout).
  std::string read_all(std::chrono::milliseconds timeout = 20s);
  void write_line(std::string const& line);
  void close_stdin();
  void kill(int signal);

  /// Waits for the child to end: its exit status, or 128 + the signal that
  /// ended it; nullopt if it still runs after `timeout`.
  std::optional<int> wait(std::chrono::milliseconds timeout = 20s);

 private:
  pid_t pid_{-1};
  int pidfd_{-1};
  int stdin_fd_{-1};
  int stdout_fd_{-1};
  std::string buffer_;
  std::optional<int> status_;
};

/// Runs a program to its end: exit status and stdout.
struct run_result {
  int status{};
  std::string out;
};
run_result run(std::vector<std::string> argv, std::chrono::milliseconds timeout = 30s);

/// Calls `condition` until it is true or `timeout` has passed; true if it
/// became true. For states no event announces (the daemon's ledger seen
/// through gRPC): between checks it waits 2 ms, well under any deadline.
template <typename Condition>
bool eventually(Condition&& condition, std::chrono::milliseconds timeout = 10s);

}  // namespace rmmd::test

#include "tests/tools/child_process_inl.hpp"
