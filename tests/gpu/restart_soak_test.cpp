// The restart soak: rmmd under harness::service_manager (the stand-in for
// systemd's fd store) with a CUDA pool and a 4 GiB persistent buffer of a
// known pattern, and one long-running client process per client mode (direct,
// packed, slab, host pool, and a holder of the buffer that re-checks every
// byte), each in a session that reconnects. Each round SIGKILLs rmmd at a
// random moment (0 to 300 ms after the last round's checks, seeded), starts
// it again and waits for READY=1; then a fresh process opens the buffer by
// name and checks every word on the GPU, the daemon says it served the
// buffer again and dropped nothing, and every client has reconnected once
// more and finished an iteration on the new daemon. At the end every client
// exits 0 having reported no error, the buffer is deleted, the daemon stops,
// and the GPU's used memory is back to what it was before the daemon
// started.
//
//   RMMD_SOAK_ROUNDS  rounds (default 100; about a second each)
//   RMMD_SOAK_SEED    the seed of the kill moments (default: random, printed)
//   RMMD_SOAK_SHARED_GPU=1  other processes use the GPUs meanwhile (gpu-check
//                     runs it beside the other suites): the device-wide used
//                     memory is printed, not compared (the daemon's own
//                     figures, every pool at 0 and the fd store empty, still are)
//
// Skips, saying why, where CUDA sees no GPU.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/kept_buffer_clients.hpp"
#include "tests/tools/managed_rmmd.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

namespace rmmd::test {
namespace {

constexpr std::size_t buffer_bytes   = std::size_t{4} << 30;
constexpr std::uint64_t pattern_seed = 4127;
constexpr char const* buffer_name    = "soak/weights";

/// What the GPU's used memory may exceed its value before the daemon started
/// by, at the end. Both are measured the same way, by a fresh process whose
/// own context is in both figures, with no other process on the GPU; what
/// differs is only what the driver keeps for itself between processes (a
/// few MiB), far under what any leak the soak can make would leave: the
/// buffer (4 GiB), one pool's allocations (>= 2 MiB blocks, 8 MiB slabs).
constexpr std::size_t memory_slack_bytes = std::size_t{64} << 20;

std::uint64_t env_or(char const* name, std::uint64_t fallback)
{
  char const* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::stoull(text) : fallback;
}

std::unique_ptr<child_process> soak_client(std::filesystem::path const& runtime_dir,
                                           std::vector<std::string> args)
{
  args.insert(args.begin(), program_path("rmmd_restart_soak_client").string());
  // stderr too: a reconnect's line, and whatever goes wrong, in order.
  return std::make_unique<child_process>(
      args,
      std::vector<std::string>{"RMMD_RUNTIME_DIR=" + runtime_dir.string()},
      spawn_options{.merge_stderr = true});
}

/// Runs the soak client to its end as a client of the daemon at `runtime_dir`.
run_result soak_run(std::filesystem::path const& runtime_dir,
                    std::vector<std::string> args,
                    std::chrono::milliseconds timeout)
{
  args.insert(args.begin(), program_path("rmmd_restart_soak_client").string());
  args.insert(args.begin(), "RMMD_RUNTIME_DIR=" + runtime_dir.string());
  args.insert(args.begin(), "/usr/bin/env");
  return run(std::move(args), timeout);
}

/// The GPU's used bytes as a fresh process sees them.
std::optional<std::size_t> gpu_used_bytes()
{
  auto r                  = run({program_path("rmmd_restart_soak_client").string(), "memory"});
  unsigned long long used = 0, total = 0;
  if (r.status != 0 || std::sscanf(r.out.c_str(), "memory %llu %llu", &used, &total) != 2) {
    ADD_FAILURE() << "rmmd_restart_soak_client memory said: " << r.out;
    return std::nullopt;
  }
  return static_cast<std::size_t>(used);
}

/// A long-running client and what it reported last.
struct soak_loop {
  std::string mode;
  std::unique_ptr<child_process> process;
  std::uint64_t iterations{};
  std::uint32_t reconnects{};
  std::uint64_t errors{};
  std::vector<std::string> said{};  // its lines other than progress reports

  /// Asks for a report and reads it; false if none came.
  bool report()
  {
    process->write_line("report");
    while (auto line = process->read_line(60s)) {
      unsigned long long i = 0, e = 0;
      unsigned r = 0;
      // Found anywhere in the line: the client's stderr shares the pipe.
      auto const at = line->find("progress ");
      if (at != std::string::npos &&
          std::sscanf(line->c_str() + at, "progress %llu %u %llu", &i, &r, &e) == 3) {
        iterations = i;
        reconnects = r;
        errors     = e;
        return true;
      }
      said.push_back(*line);
    }
    std::cout << "soak client '" << mode << "' (pid " << process->pid()
              << ") did not report within 60 s; it said:\n";
    for (auto const& l : said) { std::cout << "  " << l << "\n"; }
    std::cout << threads_of(process->pid()) << std::flush;
    return false;
  }

  /// Each thread of `pid`: its state, the kernel function it waits in and
  /// its syscall, for a client that stopped answering.
  static std::string threads_of(pid_t pid)
  {
    std::string out;
    std::error_code ec;
    auto const dir = std::filesystem::path("/proc") / std::to_string(pid) / "task";
    for (auto const& task : std::filesystem::directory_iterator(dir, ec)) {
      auto read = [&](char const* what) {
        std::ifstream in(task.path() / what);
        std::string text;
        std::getline(in, text);
        return text;
      };
      out += "  thread " + task.path().filename().string() + ": " + read("comm") + " state " +
             read("stat").substr(0, 60) + " wchan " + read("wchan") + " syscall " +
             read("syscall") + "\n";
    }
    return out.empty() ? "  (no /proc entry: it exited)\n" : out;
  }
};

TEST(RestartSoak, ABufferAndEveryClientModeRideThroughSigkilledRestarts)
{
  REQUIRE_GPUS(1);
  auto const rounds = env_or("RMMD_SOAK_ROUNDS", 100);
  auto const seed   = env_or("RMMD_SOAK_SEED", std::random_device{}());
  std::cout << "restart soak: " << rounds << " rounds, seed " << seed << " (RMMD_SOAK_SEED=" << seed
            << " repeats the kill moments)\n"
            << std::flush;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> kill_after_ms(0, 300);

  auto const used_before = gpu_used_bytes();
  ASSERT_TRUE(used_before);
  managed_rmmd daemon(
      {"--cuda-pool-bytes", "8GiB", "--host-pool-bytes", "256MiB", "--drain-timeout-ms", "0"});
  ASSERT_TRUE(daemon.start());
  auto const stats = stats_of(daemon);
  auto pool        = std::find_if(stats.pools().begin(), stats.pools().end(), [](auto& p) {
    return p.pool().backend() == v1::BACKEND_CUDA;
  });
  ASSERT_NE(pool, stats.pools().end()) << "no CUDA pool; the log:\n" << daemon.log();
  auto const dir   = daemon.runtime_dir();
  auto const bytes = std::to_string(buffer_bytes);
  auto const seeds = std::to_string(pattern_seed);
  {
    auto r = soak_run(dir, {"publish", buffer_name, bytes, seeds, pool->pool().name()}, 120s);
    ASSERT_EQ(r.status, 0) << r.out << daemon.log();
  }
  ASSERT_TRUE(daemon.wait_for_stored(1)) << daemon.log();

  std::vector<soak_loop> loops;
  for (std::string mode : {"direct", "packed", "slab", "host", "buffer"}) {
    std::vector<std::string> args{"loop", mode};
    if (mode == "buffer") { args.insert(args.end(), {buffer_name, bytes, seeds}); }
    loops.push_back({.mode = mode, .process = soak_client(dir, args)});
    auto line = loops.back().process->read_line(60s);
    while (line && !line->starts_with("ready") && !line->starts_with("error")) {
      line = loops.back().process->read_line(60s);
    }
    ASSERT_EQ(line.value_or("(nothing)"), "ready") << mode;
  }

  std::uint64_t bytes_checked = 0;
  std::uint64_t restarts      = 0;
  for (std::uint64_t round = 1; round <= rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round) + " of seed " + std::to_string(seed));
    std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms(rng)));  // the moment
    auto killed = daemon.manager().kill_service(SIGKILL);
    ASSERT_TRUE(killed && WIFSIGNALED(*killed) && WTERMSIG(*killed) == SIGKILL);
    ASSERT_TRUE(daemon.start());
    ++restarts;

    auto r = soak_run(dir, {"check", buffer_name, bytes, seeds}, 120s);
    ASSERT_EQ(r.status, 0) << r.out << daemon.log();
    ASSERT_TRUE(r.out.starts_with("intact " + bytes)) << r.out;
    if (round == 1) { std::cout << "the check says: " << r.out << std::flush; }
    bytes_checked += buffer_bytes;

    auto const now = stats_of(daemon);
    EXPECT_EQ(now.restart().restarts(), round);
    EXPECT_EQ(now.restart().readopted_buffers(), 1u);
    EXPECT_EQ(now.restart().dropped_at_start(), 0u) << daemon.log();

    // Every client meets the new daemon, then finishes an iteration that
    // started after that (so it allocated, or listed the buffer, through it).
    for (auto& loop : loops) {
      SCOPED_TRACE(loop.mode);
      ASSERT_TRUE(loop.report()) << ::testing::PrintToString(loop.said);
      auto const deadline = harness::steady::now() + 60s;
      while (loop.reconnects < round && harness::steady::now() < deadline) {
        ASSERT_TRUE(loop.report());
      }
      ASSERT_EQ(loop.reconnects, round) << ::testing::PrintToString(loop.said);
      auto const from = loop.iterations;
      while (loop.iterations < from + 2 && harness::steady::now() < deadline) {
        ASSERT_TRUE(loop.report());
      }
      ASSERT_GE(loop.iterations, from + 2) << "no progress after restart " << round;
      ASSERT_EQ(loop.errors, 0u) << ::testing::PrintToString(loop.said);
    }
  }

  std::uint64_t iterations = 0;
  for (auto& loop : loops) {
    SCOPED_TRACE(loop.mode);
    loop.process->close_stdin();
    auto rest = loop.process->read_all(120s);
    EXPECT_EQ(loop.process->wait(120s), 0) << rest;
    unsigned long long i = 0, e = 0;
    unsigned r    = 0;
    auto const at = rest.rfind("done ");
    ASSERT_NE(at, std::string::npos) << rest;
    ASSERT_EQ(std::sscanf(rest.c_str() + at, "done %llu %u %llu", &i, &r, &e), 3) << rest;
    EXPECT_EQ(r, rounds);
    EXPECT_EQ(e, 0u) << rest;
    iterations += i;
    std::cout << "client " << loop.mode << ": " << i << " iterations, " << r << " reconnects\n";
  }
  loops.clear();

  auto deleted = run({program_path("rmmctl").string(),
                      "--runtime-dir",
                      dir.string(),
                      "buffers",
                      "delete",
                      buffer_name});
  EXPECT_EQ(deleted.status, 0) << deleted.out;
  EXPECT_TRUE(daemon.wait_for_stored(0)) << daemon.log();
  // Every client gone and the buffer deleted: every pool back to 0.
  auto const final_stats = stats_of(daemon);
  for (auto const& p : final_stats.pools()) {
    EXPECT_EQ(p.in_use_bytes(), 0u) << "pool " << p.pool().name() << "; the log:\n" << daemon.log();
  }
  auto stopped = daemon.manager().kill_service(SIGTERM);
  ASSERT_TRUE(stopped);
  EXPECT_TRUE(WIFEXITED(*stopped) && WEXITSTATUS(*stopped) == 0) << daemon.log();

  auto const used_after = gpu_used_bytes();
  ASSERT_TRUE(used_after);
  auto const grown = *used_after > *used_before ? *used_after - *used_before : 0;
  if (env_or("RMMD_SOAK_SHARED_GPU", 0) == 0) {
    EXPECT_LE(grown, memory_slack_bytes)
        << "GPU memory used: " << *used_before << " bytes before the daemon started, "
        << *used_after << " after the soak";
  } else {
    std::printf(
        "restart soak: the GPU is shared (RMMD_SOAK_SHARED_GPU): its used memory is not "
        "compared\n");
  }
  std::printf("restart soak: %" PRIu64 " rounds, seed %" PRIu64 ", %" PRIu64 " restarts, %" PRIu64
              " bytes checked, %" PRIu64 " client iterations, GPU used %zu -> %zu bytes\n",
              rounds,
              seed,
              restarts,
              bytes_checked,
              iterations,
              *used_before,
              *used_after);
}

}  // namespace
}  // namespace rmmd::test
