// Tenant isolation on the host pool, tried as a hostile
// user would: the real daemon runs as `rmmd`, a client of uid rmmd-test-a
// keeps what it may still read (a freed allocation's pointer, its whole
// mapping of the pool, every memfd it was handed, a shared buffer it said it
// closed) and looks there for a 16-byte random secret that a client of uid
// rmmd-test-b wrote into memory it holds. Memory lent to different uids comes
// from different memfds, so A never finds it; the same uid, or uids that the
// operator lets share (tenancy.shared_gids), do share one. The same on the
// CUDA backend is tests/gpu/tenant_isolation_test.cpp. The tests skip
// without root (they make the users).

#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/secret.hpp"
#include "tests/tools/tenant_clients.hpp"
#include "tests/tools/test_users.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

namespace fs = std::filesystem;

constexpr std::size_t pool_bytes = std::size_t{16} << 20;
constexpr std::size_t lease      = std::size_t{1} << 20;

class TenantIsolation : public ::testing::Test {
 protected:
  void SetUp() override
  {
    daemon_account_ = ensure_user(daemon_user, daemon_group);
    if (!daemon_account_) { GTEST_SKIP() << users_need_root(); }
    a_ = ensure_user(client_user_a, daemon_group);
    b_ = ensure_user(client_user_b, daemon_group);
    ASSERT_TRUE(a_ && b_);
    for (auto const& user : {*daemon_account_, *a_, *b_}) {
      for (auto const* program : {"rmmd", "rmmd_test_client", "rmmd_share_client"}) {
        if (auto why = unreachable_for(user, program_path(program)); !why.empty()) {
          GTEST_SKIP() << why;
        }
      }
    }
    ::signal(SIGPIPE, SIG_IGN);  // child_process::write_line's requirement
  }

  /// Starts rmmd as `rmmd`, as the shipped unit does, with a 16 MiB host
  /// pool, clients of group `rmmd` (and root, the observer) allowed, and
  /// `config` (text-proto rmmd.conf) when given.
  void start(std::string const& config = {})
  {
    std::vector<std::string> args{"--host-pool-bytes",
                                  std::to_string(pool_bytes),
                                  "--allow-uid",
                                  "0",
                                  "--allow-gid",
                                  std::to_string(daemon_account_->gid)};
    if (!config.empty()) {
      auto path = conf_dir_.write("rmmd.conf", config);
      fs::permissions(conf_dir_.path(),
                      fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                          fs::perms::others_read | fs::perms::others_exec);
      fs::permissions(path,
                      fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                          fs::perms::others_read);
      args.insert(args.end(), {"--config", path.string()});
    }
    daemon_ = std::make_unique<daemon_process>(std::move(args), daemon_user);
    env_    = {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
  }

  /// rmmd_test_client ARGS... as `user`.
  std::unique_ptr<child_process> test_client(std::vector<std::string> args,
                                             std::string const& user) const
  {
    args.insert(args.begin(), program_path("rmmd_test_client").string());
    return std::make_unique<child_process>(std::move(args), env_, spawn_options{.user = user});
  }

  /// rmmd_share_client ARGS... --pool host as `user`.
  std::unique_ptr<child_process> share_client(std::vector<std::string> args,
                                              std::string const& user) const
  {
    args.insert(args.begin(), program_path("rmmd_share_client").string());
    args.insert(args.end(), {"--pool", host_pool_name()});
    return std::make_unique<child_process>(std::move(args), env_, spawn_options{.user = user});
  }

  std::string host_pool_name() const
  {
    return daemon_->stats().pools(0).pool().name();
  }

  /// uid B's client: holds `first` bytes, then as much of the pool as it can
  /// get, all of it the secret over and over. Returns once it holds them.
  std::unique_ptr<child_process> secret_holder(std::string const& user,
                                               std::size_t first = lease) const
  {
    auto b    = test_client({"secret-host", std::to_string(first), secret_}, user);
    auto line = b->read_line();
    EXPECT_THAT(line.value_or("(nothing: it exited)"), StartsWith("holding "));
    return b;
  }

  std::optional<system_user> daemon_account_, a_, b_;
  scratch_dir conf_dir_;
  std::unique_ptr<daemon_process> daemon_;
  std::vector<std::string> env_;
  std::string const secret_ = random_secret_hex();
};

TEST_F(TenantIsolation, AFreedAllocationKeptByOneUidNeverShowsAnotherUidsSecret)
{
  start();
  // A allocates 1 MiB, zeroes it, frees it (the daemon has the Free) and
  // keeps the pointer; B then takes that size first, then the rest of the
  // pool, and writes its secret everywhere.
  auto a = test_client({"snoop-host", std::to_string(lease)}, client_user_a);
  ASSERT_THAT(a->read_line().value_or("(nothing: it exited)"), StartsWith("kept "));
  auto b = secret_holder(client_user_b);

  auto report = scan_for(*a, secret_);
  ASSERT_TRUE(report.complete()) << report.text();
  EXPECT_THAT(report.finds(), IsEmpty())
      << "uid " << a_->uid << " read uid " << b_->uid << "'s secret:\n"
      << report.text();
}

TEST_F(TenantIsolation, StatsAndRmmctlShowEachUidsMemoryOfItsOwn)
{
  start();
  auto a = test_client({"snoop-host", std::to_string(lease)}, client_user_a);
  ASSERT_THAT(a->read_line().value_or("(nothing: it exited)"), StartsWith("kept "));
  auto b           = secret_holder(client_user_b);
  auto const stats = daemon_->stats();
  std::map<std::string, std::uint64_t> in_use;
  for (auto const& t : stats.pools(0).tenants()) { in_use[t.tenant()] = t.in_use_bytes(); }
  auto const uid_a = "uid " + std::to_string(a_->uid);
  auto const uid_b = "uid " + std::to_string(b_->uid);
  ASSERT_TRUE(in_use.contains(uid_a) && in_use.contains(uid_b)) << stats.DebugString();
  EXPECT_EQ(in_use[uid_a], 0u);  // freed what it had
  EXPECT_GT(in_use[uid_b], lease);
  EXPECT_EQ(in_use[uid_a] + in_use[uid_b] + in_use["uid 0"], stats.pools(0).in_use_bytes());
  // rmmctl (as root, the observer) lists them too.
  child_process ctl(
      {program_path("rmmctl").string(), "--runtime-dir", daemon_->runtime_dir().string(), "stats"},
      {},
      {.merge_stderr = true});
  ctl.close_stdin();
  auto const table = ctl.read_all();
  EXPECT_EQ(ctl.wait().value_or(-1), 0) << table;
  EXPECT_THAT(table, HasSubstr("TENANT"));
  EXPECT_THAT(table, HasSubstr(uid_b));
}

TEST_F(TenantIsolation, AClientThatOnlyMapsThePoolNeverReadsAnotherUidsAllocation)
{
  start();
  auto a = test_client({"snoop-host", "0"}, client_user_a);
  ASSERT_EQ(a->read_line().value_or("(nothing: it exited)"), "mapped");
  auto b = secret_holder(client_user_b);

  auto report = scan_for(*a, secret_);
  ASSERT_TRUE(report.complete()) << report.text();
  EXPECT_THAT(report.finds(), IsEmpty())
      << "uid " << a_->uid << " read uid " << b_->uid << "'s secret:\n"
      << report.text();
}

TEST_F(TenantIsolation, TheSameUidSharesItsPoolSoTheScanFindsItsOwnSecret)
{
  // The control: the scan does find a secret where it may (one uid is one
  // tenant), so the tests above pass because the memory is apart, not
  // because the scan is blind.
  start();
  auto a = test_client({"snoop-host", "0"}, client_user_a);
  ASSERT_EQ(a->read_line().value_or("(nothing: it exited)"), "mapped");
  auto same = secret_holder(client_user_a);

  auto report = scan_for(*a, secret_);
  ASSERT_TRUE(report.complete()) << report.text();
  EXPECT_THAT(report.finds(), Not(IsEmpty())) << report.text();
}

TEST_F(TenantIsolation, AHostBufferHolderThatKeepsItsMappingAfterCloseKeepsItsOwnPages)
{
  start();
  // uid A creates and fills a buffer, a holder of uid A opens it, tells the
  // daemon it closed it but keeps its mapping; the creator lets go, so the
  // daemon frees the buffer. uid B then takes the whole pool and writes its
  // secret: the holder's pages must still hold the buffer's bytes.
  auto const bytes = std::to_string(lease);
  auto creator     = share_client({"produce", "tenant/kept", bytes, "71"}, client_user_a);
  ASSERT_THAT(creator->read_line().value_or(""), StartsWith("created"));
  ASSERT_EQ(creator->read_line().value_or(""), "published");
  auto holder = share_client({"hold-past-close", "tenant/kept", bytes, "71"}, client_user_a);
  ASSERT_EQ(holder->read_line().value_or(""), "verified " + bytes);
  ASSERT_EQ(holder->read_line().value_or(""), "closed-kept");
  creator->close_stdin();
  ASSERT_EQ(creator->wait(), 0);
  ASSERT_TRUE(eventually([&] { return daemon_->stats().pools(0).shared_buffers() == 0; }))
      << "the daemon still lists the buffer";

  auto b = secret_holder(client_user_b);
  holder->close_stdin();
  EXPECT_EQ(holder->read_line().value_or("(nothing: it exited)"), "intact");
  EXPECT_EQ(holder->wait(), 0);
}

TEST_F(TenantIsolation, SharedTenancyIsTheSingleTenantOptOutAndIsAccepted)
{
  // tenancy { mode: SHARED }: one pool per GPU and one host memfd, as a
  // single-tenant node wants; every uid's client then maps everyone's bytes,
  // which is what the operator chose. Only that the setting is taken and
  // the daemon serves two uids is asserted, not what they see.
  auto const conf = std::string("tenancy { mode: SHARED }\n");
  auto const path = conf_dir_.write("check.conf", conf);
  auto check      = run({program_path("rmmd").string(), "--check-config", path.string()});
  EXPECT_EQ(check.status, 0) << check.out;
  EXPECT_THAT(check.out, StartsWith(path.string() + ": OK\n"));

  start(conf);
  auto a = test_client({"snoop-host", std::to_string(lease)}, client_user_a);
  ASSERT_THAT(a->read_line().value_or("(nothing: it exited)"), StartsWith("kept "));
  auto b      = secret_holder(client_user_b);
  auto report = scan_for(*a, secret_);
  EXPECT_TRUE(report.complete()) << report.text();
  a->close_stdin();
  b->close_stdin();
  EXPECT_EQ(a->wait(), 0);
  EXPECT_EQ(b->wait(), 0);
}

TEST_F(TenantIsolation, UidsWhosePrimaryGroupIsASharedGidShareOneTenant)
{
  // tenancy { shared_gids: G }: sessions whose peer's primary gid is G share
  // one tenant pool, whatever their uid. A and B run here with the `rmmd`
  // group as their primary group, so B's secret is A's to read.
  auto const gid  = std::to_string(daemon_account_->gid);
  auto const conf = "tenancy { shared_gids: " + gid + " }\n";
  auto const path = conf_dir_.write("check.conf", conf);
  auto check      = run({program_path("rmmd").string(), "--check-config", path.string()});
  EXPECT_EQ(check.status, 0) << check.out;
  auto const by_name = conf_dir_.write("names.conf", "tenancy { shared_groups: \"rmmd\" }\n");
  check              = run({program_path("rmmd").string(), "--check-config", by_name.string()});
  EXPECT_EQ(check.status, 0) << check.out;

  start(conf);
  // setpriv as spawn_options::user does, but with the shared group primary.
  auto as_group = [&](system_user const& user, std::vector<std::string> args) {
    std::vector<std::string> argv{"/usr/bin/setpriv",
                                  "--reuid=" + std::to_string(user.uid),
                                  "--regid=" + gid,
                                  "--init-groups",
                                  "--",
                                  program_path("rmmd_test_client").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<child_process>(std::move(argv), env_);
  };
  auto a = as_group(*a_, {"snoop-host", "0"});
  ASSERT_EQ(a->read_line().value_or("(nothing: it exited)"), "mapped");
  auto b = as_group(*b_, {"secret-host", std::to_string(lease), secret_});
  ASSERT_THAT(b->read_line().value_or("(nothing: it exited)"), StartsWith("holding "));

  auto report = scan_for(*a, secret_);
  ASSERT_TRUE(report.complete()) << report.text();
  EXPECT_THAT(report.finds(), Not(IsEmpty())) << report.text();
}

}  // namespace
}  // namespace rmmd::test
