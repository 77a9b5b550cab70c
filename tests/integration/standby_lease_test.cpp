// A standby between real processes, on the host pool of a real daemon
// (docs/failover.md, "A standby that is ready"): a standby opened while
// another process holds the write lease is mapped at once and stands in
// line (rmmctl shows it as a waiter); when the holder is SIGKILLed it is
// granted without mapping again (the same data()), reads the dead holder's
// bytes and then writes; before its grant its mapping is read-only (a
// write is SIGSEGV, in a child process); a standby whose process dies
// leaves the line; a standby of a free lease holds it at once.

#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/shared_buffer.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

class StandbyProcesses : public ::testing::Test {
 protected:
  void SetUp() override
  {
    env_    = {"RMMD_RUNTIME_DIR=" + daemon_.runtime_dir().string()};
    auto kv = rmmd::shared_buffer::create(
        session_,
        "kv/rank0",
        1 << 20,
        {.pool = session_.host_pool().name, .persistent = true, .allow_writers = true});
    kv.publish();
  }

  /// rmmd_share_client MODE kv/rank0 with `args`, and `env` beside the test's.
  std::unique_ptr<child_process> client(std::string const& mode,
                                        std::vector<std::string> args = {},
                                        std::vector<std::string> env  = {})
  {
    std::vector<std::string> argv{program_path("rmmd_share_client").string(), mode, "kv/rank0"};
    argv.insert(argv.end(), args.begin(), args.end());
    env.insert(env.begin(), env_.begin(), env_.end());
    return std::make_unique<child_process>(argv, env);
  }

  v1::BufferLease lease_now() const
  {
    auto r = run({program_path("rmmctl").string(),
                  "--runtime-dir",
                  daemon_.runtime_dir().string(),
                  "buffers",
                  "show",
                  "kv/rank0",
                  "--json"});
    EXPECT_EQ(r.status, 0) << r.out;
    return parse_json<v1::DescribeBufferResponse>(r.out).info().lease();
  }

  bool waiters(int n) const
  {
    return eventually([&] { return lease_now().waiters_size() == n; });
  }

  daemon_process daemon_{{"--backend", "host", "--host-pool-bytes", "64MiB"}};
  rmmd::session session_ = daemon_.open_session("observer");
  std::vector<std::string> env_;
};

TEST_F(StandbyProcesses, AStandbyMappedBeforeTheHoldersSigkillTakesOverAtTheSameAddress)
{
  auto holder = client("standby");  // the lease is free: it holds it at once
  ASSERT_EQ(holder->read_line(), "standby 1");
  ASSERT_EQ(holder->read_line(), "leased 1 0 same kv-intact");
  auto standby = client("standby");
  ASSERT_EQ(standby->read_line(), "standby 0");  // answered at once, in line
  ASSERT_TRUE(waiters(1));
  EXPECT_EQ(lease_now().waiters(0).pid(), standby->pid());

  holder->kill(SIGKILL);
  EXPECT_EQ(holder->wait(), 128 + SIGKILL);
  // The next generation, at the address it mapped before the grant, with
  // the dead holder's stamp and its bytes; then it writes its own.
  EXPECT_EQ(standby->read_line(), "leased 2 1 same kv-intact");
  auto l = lease_now();
  EXPECT_EQ(l.generation(), 2u);
  EXPECT_EQ(l.holder_pid(), standby->pid());
  EXPECT_EQ(l.waiters_size(), 0);

  // What it wrote is what a reader sees.
  auto kv = rmmd::shared_buffer::open(session_, "kv/rank0");
  EXPECT_EQ(*static_cast<std::uint64_t const*>(kv.data()), 2u);
  standby->close_stdin();
  EXPECT_EQ(standby->read_line(), "closed");
  EXPECT_EQ(standby->wait(), 0);
}

TEST_F(StandbyProcesses, AStandbyCannotWriteBeforeItsGrantAndItsDeathLeavesTheLine)
{
  auto holder = client("standby");
  ASSERT_EQ(holder->read_line(), "standby 1");
  ASSERT_EQ(holder->read_line(), "leased 1 0 same kv-intact");
  // The fault is the point: the sanitizers must let it be a plain SIGSEGV
  // (their handlers would report it, and exit otherwise).
  std::vector<std::string> no_segv_handler;
  for (char const* name : {"ASAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS"}) {
    char const* set = std::getenv(name);
    no_segv_handler.push_back(std::string(name) + "=" +
                              (set != nullptr ? std::string(set) + ":" : "") + "handle_segv=0");
  }
  auto early = client("standby", {"--write-early"}, no_segv_handler);
  ASSERT_EQ(early->read_line(), "standby 0");
  // Its host mapping is PROT_READ until the grant: the write faults.
  EXPECT_EQ(early->wait(), 128 + SIGSEGV);
  EXPECT_TRUE(waiters(0));  // its session's end took it out of line
  auto kv = rmmd::shared_buffer::open(session_, "kv/rank0");
  EXPECT_EQ(*static_cast<std::uint64_t const*>(kv.data()), 1u);  // the holder's stamp, untouched

  auto next = client("standby");
  ASSERT_EQ(next->read_line(), "standby 0");
  holder->close_stdin();
  EXPECT_EQ(holder->read_line(), "closed");
  EXPECT_EQ(next->read_line(), "leased 2 1 same kv-intact");
  next->close_stdin();
  EXPECT_EQ(next->wait(), 0);
}

TEST_F(StandbyProcesses, AStandbysWaitThatEndsFirstKeepsItsPlaceInLine)
{
  auto holder = client("lease");
  ASSERT_EQ(holder->read_line(), "leased 1 0");
  auto late = client("standby", {"--lease-wait-ms", "200"});
  ASSERT_EQ(late->read_line(), "standby 0");
  auto line = late->read_line();
  ASSERT_TRUE(line);
  EXPECT_THAT(*line, HasSubstr("error deadline: "));
  EXPECT_THAT(*line, HasSubstr("the standby stays in line"));
  EXPECT_THAT(*line, HasSubstr("(pid " + std::to_string(holder->pid())));
  EXPECT_EQ(late->wait(), 2);
  EXPECT_TRUE(waiters(0));  // the process ended: so did its place
  holder->close_stdin();
  EXPECT_EQ(holder->wait(), 0);
}

}  // namespace
}  // namespace rmmd::test
