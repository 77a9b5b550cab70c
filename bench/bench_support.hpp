#pragma once

// Support for rmmd_bench: the rmmd it starts, /proc readings, percentiles and
// its results as JSON (bench_results.proto, written by protobuf; the
// hand-written json value until the bench moves to it). Processes
// (always killed and reaped, every wait ending at a deadline) are
// tools/process's, shared with the tests.

#include "bench/bench_results.pb.h"
#include "tools/process/child_process.hpp"
#include "tools/process/daemon_process.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
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

// Processes and the daemon come from tools/process, shared with the tests.
using tools::child_process;
using tools::daemon_process;
using tools::kill_all_children;

/// How the bench runs rmmd: `args` after --runtime-dir DIR (a fresh
/// /tmp/rmmd-bench-XXXXXX), its stdout and stderr in DIR/rmmd.log,
/// kill_all_children() kills it last, and the destructor gives it 20 s
/// after SIGTERM before it SIGKILLs.
daemon_process::options bench_daemon(std::filesystem::path const& rmmd,
                                     std::vector<std::string> args,
                                     std::chrono::seconds ready_timeout);

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

/// `run` as JSON, by protobuf's JSON mapping: field names as in
/// bench_results.proto, every plain field written (zeros, false and empty
/// lists too), optional ones only when set, indented. An optional double
/// that is NaN or infinite is left out (JSON has no such number; `run` is
/// unchanged). Throws bench_error if protobuf cannot write it.
std::string results_json(results::Run const& run);

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
