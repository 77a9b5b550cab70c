#pragma once

// Test support: programs started with posix_spawn (harness/: pipes on
// stdin and stdout, waits that end on an event or a deadline, never on a
// fixed sleep), where our programs are, and eventually().

#include "harness/child_process.hpp"

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace rmmd::test {

using namespace std::chrono_literals;
using harness::child_process;
using harness::spawn_options;

/// Where our programs are: $RMMD_BIN_DIR, else beside this test binary (a
/// bundle), else the build tree this test was built in.
std::filesystem::path program_path(std::string const& name);

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
