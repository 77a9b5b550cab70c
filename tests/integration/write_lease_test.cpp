// A shared buffer's write lease between real processes, on the host pool of
// a real daemon (docs/failover.md): the holder is SIGKILLed (or exits, or
// closes) while another process waits, and the waiter gets the lease with
// the next generation and the bytes the dead holder wrote; a wait that ends
// first leaves the lease as it was; rmmctl (table and --json) and /metrics
// show holder, generation, waiters and takeovers.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/shared_buffer.hpp>

#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class WriteLeaseProcesses : public ::testing::Test {
 protected:
  void SetUp() override
  {
    env_  = {"RMMD_RUNTIME_DIR=" + daemon_.runtime_dir().string()};
    pool_ = session_.host_pool().name;
    // What an engine's KV cache would be: persistent, writable by others,
    // held by nobody once made.
    auto kv = rmmd::shared_buffer::create(
        session_, "kv/rank0", 1 << 20, {.pool = pool_, .persistent = true, .allow_writers = true});
    kv.publish();
  }

  /// rmmd_share_client lease kv/rank0 with `args`.
  std::unique_ptr<child_process> lease(std::vector<std::string> args = {})
  {
    std::vector<std::string> argv{program_path("rmmd_share_client").string(), "lease", "kv/rank0"};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<child_process>(argv, env_);
  }

  /// `rmmctl ARGS --runtime-dir D`'s stdout, checked to exit 0.
  std::string rmmctl(std::vector<std::string> args) const
  {
    args.insert(args.begin(), {"--runtime-dir", daemon_.runtime_dir().string()});
    args.insert(args.begin(), program_path("rmmctl").string());
    auto r = run(args);
    EXPECT_EQ(r.status, 0) << r.out;
    return r.out;
  }

  v1::BufferLease lease_now() const
  {
    return parse_json<v1::DescribeBufferResponse>(rmmctl({"buffers", "show", "kv/rank0", "--json"}))
        .info()
        .lease();
  }

  bool waiters(int n) const
  {
    return eventually([&] { return lease_now().waiters_size() == n; });
  }

  std::string scrape() const
  {
    v1::HealthResponse h;
    auto ctx = rmmd::detail::impl_of(session_).context();
    EXPECT_TRUE(rmmd::detail::impl_of(session_).stub().Health(ctx.get(), {}, &h).ok());
    auto const address = h.metrics_address();
    auto const colon   = address.rfind(':');
    httplib::Client client(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
    auto r = client.Get("/metrics");
    EXPECT_TRUE(r);
    return r ? r->body : std::string();
  }

  daemon_process daemon_{
      {"--backend", "host", "--host-pool-bytes", "64MiB", "--metrics-address", "127.0.0.1:0"}};
  rmmd::session session_ = daemon_.open_session("observer");
  std::vector<std::string> env_;
  std::string pool_;
};

TEST_F(WriteLeaseProcesses, ASigkilledHoldersLeaseGoesToTheWaiterWithTheNextGeneration)
{
  auto holder = lease();
  ASSERT_EQ(holder->read_line(), "leased 1 0");
  auto standby = lease({"--wait-ms", "60000"});
  ASSERT_TRUE(waiters(1));

  // Who holds it, and who waits, as an operator sees it.
  auto l = lease_now();
  EXPECT_EQ(l.generation(), 1u);
  EXPECT_EQ(l.holder_pid(), holder->pid());
  EXPECT_EQ(l.holder_uid(), ::getuid());
  ASSERT_EQ(l.waiters_size(), 1);
  EXPECT_EQ(l.waiters(0).pid(), standby->pid());
  auto shown = rmmctl({"buffers", "show", "kv/rank0"});
  EXPECT_THAT(shown,
              HasSubstr("generation 1, held by session " + std::to_string(l.holder_session_id()) +
                        " (pid " + std::to_string(holder->pid())));
  EXPECT_THAT(shown, HasSubstr("LEASE WAITERS (1, in line)"));
  EXPECT_THAT(shown, HasSubstr(std::to_string(standby->pid())));
  auto table = rmmctl({"buffers"});
  EXPECT_THAT(table, HasSubstr("gen 1 pid " + std::to_string(holder->pid())));

  holder->kill(SIGKILL);
  EXPECT_EQ(holder->wait(), 128 + SIGKILL);
  // The next generation, and the word the dead holder wrote (its generation).
  EXPECT_EQ(standby->read_line(), "leased 2 1");
  l = lease_now();
  EXPECT_EQ(l.generation(), 2u);
  EXPECT_EQ(l.holder_pid(), standby->pid());
  EXPECT_EQ(l.waiters_size(), 0);
  EXPECT_THAT(rmmctl({"buffers"}), HasSubstr("gen 2 pid " + std::to_string(standby->pid())));

  auto const metrics = scrape();
  EXPECT_THAT(metrics, HasSubstr("rmmd_buffer_leases_held 1\n"));
  EXPECT_THAT(metrics, HasSubstr("rmmd_buffer_lease_grants_total 2\n"));
  EXPECT_THAT(metrics, HasSubstr("rmmd_buffer_lease_waits_total 1\n"));
  EXPECT_THAT(metrics, HasSubstr("rmmd_buffer_lease_takeover_seconds_count 1\n"));

  standby->close_stdin();
  EXPECT_EQ(standby->read_line(), "closed");
  EXPECT_EQ(standby->wait(), 0);
  EXPECT_TRUE(eventually([&] { return lease_now().holder_session_id() == 0; }));
}

TEST_F(WriteLeaseProcesses, AHolderThatClosesOrExitsPassesItOnInLine)
{
  auto holder = lease();
  ASSERT_EQ(holder->read_line(), "leased 1 0");
  auto second = lease({"--wait-ms", "60000"});
  ASSERT_TRUE(waiters(1));
  auto third = lease({"--wait-ms", "60000"});
  ASSERT_TRUE(waiters(2));

  holder->close_stdin();  // closes its exclusive open, then exits
  EXPECT_EQ(holder->read_line(), "closed");
  EXPECT_EQ(second->read_line(), "leased 2 1");
  EXPECT_EQ(holder->wait(), 0);
  EXPECT_EQ(third->wait(std::chrono::milliseconds(200)), std::nullopt);  // still in line

  second->kill(SIGTERM);  // exits without closing: its session's end lets go
  second->wait();
  EXPECT_EQ(third->read_line(), "leased 3 2");
  third->close_stdin();
  EXPECT_EQ(third->wait(), 0);
}

TEST_F(WriteLeaseProcesses, AWaitThatEndsFirstIsADeadlineErrorAndChangesNothing)
{
  auto holder = lease();
  ASSERT_EQ(holder->read_line(), "leased 1 0");
  auto const before = lease_now().SerializeAsString();
  for (auto const* how : {"--socket", "--grpc"}) {
    auto late = lease({"--wait-ms", "200", how});
    auto line = late->read_line();
    ASSERT_TRUE(line) << how;
    // (rmm::bad_alloc's what() starts with "std::bad_alloc: ", as every
    // error of the client that derives from it.)
    EXPECT_THAT(*line, StartsWith("error deadline: "));
    EXPECT_THAT(*line, HasSubstr("rmmd: open buffer 'kv/rank0' exclusively: waited"));
    EXPECT_THAT(*line, HasSubstr("held by session"));
    EXPECT_THAT(*line, HasSubstr("(pid " + std::to_string(holder->pid())));
    EXPECT_EQ(late->wait(), 2);
  }
  auto now = lease_now();
  now.clear_granted_unix_ms();
  auto was = v1::BufferLease();
  ASSERT_TRUE(was.ParseFromString(before));
  was.clear_granted_unix_ms();
  EXPECT_EQ(now.SerializeAsString(), was.SerializeAsString());
  EXPECT_THAT(scrape(), HasSubstr("rmmd_buffer_lease_wait_timeouts_total 2\n"));
}

}  // namespace
}  // namespace rmmd::test
