#pragma once

// Support for rmmd_bench: processes started with posix_spawn (fork+exec: CUDA
// cannot be used in a plain fork() child) that are always killed and reaped,
// the real rmmd started in a runtime directory of its own and ready once it
// sent READY=1 to a notify socket the bench owns, /proc readings, percentiles
// and a small JSON value. Every wait ends at a deadline; nothing sleeps to
// hope that something happened.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace rmmd::bench {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

/// A failure of the bench itself (not a measurement that missed its target).
class bench_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// From a signal handler (async-signal-safe): SIGKILL every process the bench
/// started and has not reaped yet, the daemon last.
void kill_all_children() noexcept;

/// A program started with posix_spawn. stdin and stdout are pipes; stderr
/// goes to `stderr_fd` if given, else it is inherited (`is_daemon`: stdout
/// goes to `stderr_fd` too, and kill_all_children() kills it last). `fds` hands parent fds
/// to the child under the given numbers. The destructor SIGKILLs the child if
/// it still runs and reaps it.
class process {
 public:
  struct fd_map {
    int child_fd;
    int parent_fd;
  };
  explicit process(std::vector<std::string> argv,
                   std::vector<std::string> env = {},
                   std::vector<fd_map> fds      = {},
                   int stderr_fd                = -1,
                   bool is_daemon               = false);
  process(process const&)            = delete;
  process& operator=(process const&) = delete;
  ~process();

  [[nodiscard]] pid_t pid() const noexcept
  {
    return pid_;
  }
  /// The next line of stdout without its newline; nullopt at EOF or deadline.
  std::optional<std::string> read_line(steady::time_point deadline);
  /// Throws bench_error if the child no longer reads (it exited).
  /// REQUIRES: SIGPIPE is ignored in this process (rmmd_bench ignores it).
  void write_line(std::string const& line);
  void kill(int signal) noexcept;
  /// Exit status, or 128 + the signal that ended it; nullopt at the deadline.
  std::optional<int> wait(steady::time_point deadline);
  /// Waits up to `grace`, then SIGKILLs and reaps. Never throws.
  int finish(std::chrono::milliseconds grace) noexcept;

 private:
  pid_t pid_{-1};
  int pidfd_{-1};
  int stdin_fd_{-1};
  int stdout_fd_{-1};
  int slot_{-1};
  std::string buffer_;
  std::optional<int> status_;
};

/// rmmd in a fresh runtime directory (removed again by the destructor, which
/// stops the daemon: SIGTERM, then SIGKILL if it has not exited in 20 s).
class daemon_process {
 public:
  /// Throws bench_error naming the reason and the log's tail if rmmd does
  /// not send READY=1 within `ready_timeout`.
  daemon_process(std::filesystem::path const& rmmd,
                 std::vector<std::string> const& args,
                 std::chrono::seconds ready_timeout);
  daemon_process(daemon_process const&)            = delete;
  daemon_process& operator=(daemon_process const&) = delete;
  ~daemon_process();

  [[nodiscard]] std::filesystem::path const& runtime_dir() const noexcept
  {
    return dir_;
  }
  [[nodiscard]] pid_t pid() const noexcept
  {
    return process_->pid();
  }
  [[nodiscard]] std::vector<std::string> const& argv() const noexcept
  {
    return argv_;
  }
  /// The last `lines` lines rmmd wrote to stderr.
  [[nodiscard]] std::string log_tail(std::size_t lines = 20) const;
  /// False once rmmd has exited.
  [[nodiscard]] bool alive();

 private:
  std::filesystem::path dir_;
  std::vector<std::string> argv_;
  std::unique_ptr<process> process_;
};

/// utime + stime of `pid` (all its threads), in seconds, from /proc/PID/stat.
double cpu_seconds(pid_t pid);
/// VmRSS of `pid` in bytes, from /proc/PID/status.
std::uint64_t rss_bytes(pid_t pid);

/// Nearest-rank percentiles of samples in nanoseconds.
struct summary {
  std::size_t count{};
  double p50_us{};
  double p99_us{};
  double mean_us{};
  double min_us{};
  double max_us{};
};
summary summarize(std::vector<double> samples_ns);

/// A JSON value, enough to write the bench's results.
class json {
 public:
  using array  = std::vector<json>;
  using object = std::vector<std::pair<std::string, json>>;  // keeps insertion order

  json() = default;  // null
  json(std::nullptr_t) {}
  json(bool b) : v_(b) {}
  json(int i) : v_(static_cast<std::int64_t>(i)) {}
  json(long i) : v_(static_cast<std::int64_t>(i)) {}
  json(long long i) : v_(static_cast<std::int64_t>(i)) {}
  json(unsigned i) : v_(static_cast<std::int64_t>(i)) {}
  json(unsigned long i) : v_(static_cast<std::int64_t>(i)) {}
  json(unsigned long long i) : v_(static_cast<std::int64_t>(i)) {}
  json(double d) : v_(d) {}
  json(char const* s) : v_(std::string(s)) {}
  json(std::string s) : v_(std::move(s)) {}
  json(array a) : v_(std::move(a)) {}
  json(object o) : v_(std::move(o)) {}
  template <typename T>
  json(std::optional<T> const& o)
  {
    if (o) { *this = json(*o); }
  }

  /// Appends to an array (a null becomes one).
  void push_back(json v);
  /// Sets a member of an object (a null becomes one); replaces an existing one.
  json& operator[](std::string const& key);

  /// Pretty-printed with two-space indents; NaN and infinities become null.
  [[nodiscard]] std::string dump(int indent = 0) const;

 private:
  std::variant<std::nullptr_t, bool, std::int64_t, double, std::string, array, object> v_{nullptr};
};

}  // namespace rmmd::bench
