#pragma once

// Support for rmmd_bench: the rmmd it starts, /proc readings, percentiles and
// its results as JSON (bench_results.proto, written by protobuf). Processes
// (always killed and reaped, every wait ending at a deadline) come from
// harness/, shared with the tests.

#include "bench/bench_results.pb.h"
#include "harness/child_process.hpp"
#include "harness/daemon_process.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace rmmd::bench {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

/// A failure of the bench itself (not a measurement that missed its target).
class bench_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One target as measured; print_targets shows it pass or MISS and records
/// it in the run.
struct target_row {
  std::string what;
  double measured{};
  bool at_most{true};  ///< else: at least
  double limit{};
  std::string unit;
  [[nodiscard]] bool pass() const
  {
    return at_most ? measured <= limit : measured >= limit;
  }
};

/// Prints `title` and a line per target (pass or MISS beside the figure) and
/// adds each to `run`'s targets.
void print_targets(std::string const& title,
                   std::vector<target_row> const& targets,
                   results::Run& run);

// Processes and the daemon come from harness/, shared with the tests.
using harness::child_process;
using harness::daemon_process;
using harness::kill_all_children;

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

}  // namespace rmmd::bench
