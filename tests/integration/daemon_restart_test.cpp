// The daemon killed with SIGKILL while clients hold host-pool memory, with
// reconnecting off (session::options::reconnect = 0; reconnect_test.cpp has
// the default): the clients keep their data, their next call fails with
// session_error saying the daemon is gone, a resource whose frees can no longer reach a daemon
// says so once and its process exits cleanly, and a client that wants to go
// on opens a new session to a daemon started again on the same runtime
// directory (which replaces the socket files the killed one left) and
// allocates again. tests/gpu/daemon_restart_test.cpp does the same for CUDA
// pools.

#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/pattern.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/host_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t buffer_bytes = 65536;

/// rmmd with a 64 MiB host pool; in `dir` if one is given (left in place).
std::unique_ptr<harness::daemon_process> start_rmmd(std::filesystem::path const& dir = {})
{
  return std::make_unique<harness::daemon_process>(
      harness::daemon_process::options{.program = program_path("rmmd"),
                                       .args = {"--backend", "host", "--host-pool-bytes", "64MiB"},
                                       .dir_prefix  = "rmmd-restart-",
                                       .runtime_dir = dir,
                                       .log_to_file = true});
}

rmmd::session open_session(std::filesystem::path const& dir,
                           std::string name,
                           call_transport calls = call_transport::session_socket)
{
  return rmmd::session(rmmd::session::options{.runtime_dir = dir,
                                              .client_name = std::move(name),
                                              .lease_calls = calls,
                                              .reconnect   = std::chrono::milliseconds(0)});
}

struct held_buffer {
  void* ptr;
  std::uint64_t seed;
};

TEST(DaemonRestart, HostPoolClientsKeepTheirDataAndGoOnWithANewSession)
{
  // The first daemon owns the directory (removed when `first` goes, last);
  // the second starts in it after the first was killed.
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  auto const env = std::vector<std::string>{"RMMD_RUNTIME_DIR=" + dir.string()};

  // A client process holding 3 buffers, and this process holding 4.
  child_process holder({program_path("rmmd_test_client").string(), "hold", "65536", "31", "3"},
                       env,
                       spawn_options{.merge_stderr = true});
  std::string holder_out;
  while (auto line = holder.read_line()) {
    holder_out += *line + "\n";
    if (*line == "ready") { break; }
  }
  ASSERT_THAT(holder_out, HasSubstr("ready"));
  auto session = std::make_unique<rmmd::session>(open_session(dir, "survivor"));
  auto grpc_calls =
      std::make_unique<rmmd::session>(open_session(dir, "grpc-survivor", call_transport::grpc));
  auto mr = std::make_unique<rmmd::host_memory_resource>(*session);
  std::vector<held_buffer> held;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    held.push_back({mr->allocate_sync(buffer_bytes, 256), seed});
    fill(held.back().ptr, buffer_bytes, seed);
  }

  first->process().kill(SIGKILL);
  ASSERT_EQ(first->process().wait(), 128 + SIGKILL);
  // What the killed daemon leaves behind, and the next one must replace.
  EXPECT_TRUE(std::filesystem::is_socket(dir / "rmmd-session.sock"));
  EXPECT_TRUE(std::filesystem::is_socket(dir / "rmmd.sock"));

  // The mapping stays valid, and writable.
  for (auto const& b : held) {
    EXPECT_EQ(first_mismatch(b.ptr, buffer_bytes, b.seed), -1) << "buffer " << b.seed;
    fill(b.ptr, buffer_bytes, b.seed + 100);
    EXPECT_EQ(first_mismatch(b.ptr, buffer_bytes, b.seed + 100), -1) << "buffer " << b.seed;
  }
  // The next call says what happened, on either transport.
  try {
    (void)mr->allocate_sync(4096, 256);
    ADD_FAILURE() << "allocate succeeded with the daemon killed";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("daemon is gone"));
  }
  try {
    (void)grpc_calls->allocate(grpc_calls->host_pool().id, 4096, 256);
    ADD_FAILURE() << "a gRPC allocate succeeded with the daemon killed";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("daemon is gone"));
  }
  // Frees neither throw (they are noexcept: a throw would end the process)
  // nor print a line each: one line for the resource, then silence.
  testing::internal::CaptureStderr();
  mr->deallocate_sync(held[0].ptr, buffer_bytes, 256);
  mr->deallocate_sync(held[1].ptr, buffer_bytes, 256);
  auto const said = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(said.size(), 1u) << ::testing::PrintToString(said);
  EXPECT_THAT(said[0], HasSubstr("daemon is gone"));

  // The holder process finds its buffers intact, frees them and exits 0.
  holder.close_stdin();
  auto const rest = holder.read_all(30s);
  EXPECT_EQ(holder.wait(30s), 0) << rest;
  EXPECT_THAT(rest, HasSubstr("freed"));
  EXPECT_THAT(rest, ::testing::Not(HasSubstr("corrupted")));
  EXPECT_LE(lines_of(rest).size(), 2u) << "one line for the lost daemon, then \"freed\":\n" << rest;

  // Started again on the same directory, the daemon serves new sessions.
  auto second = start_rmmd(dir);
  {
    auto fresh = open_session(dir, "starts-over");
    rmmd::host_memory_resource fresh_mr(fresh);
    std::vector<void*> again;
    for (std::uint64_t seed = 50; seed < 53; ++seed) {
      again.push_back(fresh_mr.allocate_sync(buffer_bytes, 256));
      fill(again.back(), buffer_bytes, seed);
    }
    for (std::uint64_t seed = 50; seed < 53; ++seed) {
      EXPECT_EQ(first_mismatch(again[seed - 50], buffer_bytes, seed), -1);
    }
    // Its ledger knows only the new session: nothing of the killed daemon's.
    auto const stats = stats_of(fresh);
    EXPECT_EQ(in_use(stats, fresh.host_pool().id), 3 * buffer_bytes);
    EXPECT_EQ(stats.sessions_size(), 1);
    for (auto* p : again) { fresh_mr.deallocate_sync(p, buffer_bytes, 256); }

    // The old sessions stay over: the new daemon does not take them up.
    EXPECT_THROW((void)mr->allocate_sync(4096, 256), rmmd::session_error);
    EXPECT_THROW((void)grpc_calls->allocate(grpc_calls->host_pool().id, 4096, 256),
                 rmmd::session_error);
  }
  // The old buffers are still this process's; the old resource goes without a word.
  EXPECT_EQ(first_mismatch(held[3].ptr, buffer_bytes, held[3].seed + 100), -1);
  testing::internal::CaptureStderr();
  mr.reset();
  session.reset();
  grpc_calls.reset();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(DaemonRestart, ADaemonStartedWhereALiveOneRunsRefusesAndLeavesItServing)
{
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  auto client    = open_session(dir, "first's client");
  try {
    auto second = start_rmmd(dir);
    ADD_FAILURE() << "a second rmmd became ready in a live daemon's runtime directory";
  } catch (std::runtime_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("another rmmd is running with the runtime directory"));
  }
  // The first one still serves its sessions and new ones, on the same sockets.
  ASSERT_TRUE(first->alive());
  EXPECT_NO_THROW(client.free(client.allocate(client.host_pool().id, 4096, 256).id));
  auto newcomer = open_session(dir, "newcomer");
  EXPECT_EQ(stats_of(newcomer).sessions_size(), 2);
}

}  // namespace
}  // namespace rmmd::test
