// Tenant isolation on the CUDA backend, tried as a
// hostile user would, on a real GPU: the daemon runs as `rmmd`, a client of
// uid rmmd-test-a imports an allocation, sends its Free but keeps the import
// (and reads past it, within what the import maps), and looks there for a
// 16-byte random secret that a client of uid rmmd-test-b wrote into memory
// it was lent afterwards. Memory lent to different uids comes from different
// pools, so A never sees it (a failed read is not seeing it either). A
// shared buffer is a VMM allocation of its own: a holder that keeps its
// mapping after it said it closed keeps those pages, which nobody else is
// given; and the pool-pointer fallback for buffers is refused between uids.
// The host pool's tests are tests/integration/tenant_isolation_test.cpp.
// Skips without a GPU, and without root (they make the users).

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/secret.hpp"
#include "tests/tools/tenant_clients.hpp"
#include "tests/tools/test_users.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

constexpr std::size_t MiB = std::size_t{1} << 20;

class CudaTenantIsolation : public ::testing::Test {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(1);
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

  /// rmmd as `rmmd` with a 4 GiB pool on each GPU (posix fd only), clients
  /// of group `rmmd` and root (the observer) allowed, and `extra` flags.
  void start(std::vector<std::string> extra = {})
  {
    std::vector<std::string> args{"--cuda-pool-bytes",
                                  "4GiB",
                                  "--fabric",
                                  "off",
                                  "--allow-uid",
                                  "0",
                                  "--allow-gid",
                                  std::to_string(daemon_account_->gid)};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_  = std::make_unique<daemon_process>(std::move(args), daemon_user);
    env_     = {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
    pool_id_ = daemon_->open_session().device_pool(0).id;
  }

  std::unique_ptr<child_process> client(char const* program,
                                        std::vector<std::string> args,
                                        std::string const& user) const
  {
    args.insert(args.begin(), program_path(program).string());
    return std::make_unique<child_process>(std::move(args), env_, spawn_options{.user = user});
  }

  /// A's hostile client: BYTES imported, freed, kept; ready to scan.
  std::unique_ptr<child_process> snoop(std::size_t bytes,
                                       std::size_t span,
                                       std::string const& user = client_user_a) const
  {
    auto a = client(
        "rmmd_test_client", {"snoop-device", std::to_string(bytes), std::to_string(span)}, user);
    auto line = a->read_line(60s);
    EXPECT_EQ(line.value_or("(nothing: it exited)"), "kept");
    return a;
  }

  /// B's client: `count` allocations of `bytes` (MODE direct or slab), all
  /// the secret, held.
  std::unique_ptr<child_process> secret_holder(std::string const& mode,
                                               std::size_t bytes,
                                               int count,
                                               std::string const& user = client_user_b) const
  {
    auto b    = client("rmmd_test_client",
                    {"secret-device", mode, std::to_string(bytes), std::to_string(count), secret_},
                    user);
    auto line = b->read_line(120s);
    EXPECT_THAT(line.value_or("(nothing: it exited)"), StartsWith("holding "));
    return b;
  }

  v1::PoolStats gpu_pool() const
  {
    return daemon_->stats().pools(static_cast<int>(pool_id_));
  }

  std::optional<system_user> daemon_account_, a_, b_;
  std::unique_ptr<daemon_process> daemon_;
  std::vector<std::string> env_;
  std::uint32_t pool_id_{};
  std::string const secret_ = random_secret_hex();
};

class CudaTenantIsolationModes : public CudaTenantIsolation,
                                 public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaTenantIsolationModes, AnImportKeptAfterItsFreeNeverShowsAnotherUidsSecret)
{
  start();
  // A: 2 MiB imported, zeroed, freed (the daemon answered the Free), kept.
  // B (direct or slab): 2 MiB first, where A's was, then 62 more.
  auto a      = snoop(2 * MiB, 0);
  auto b      = secret_holder(GetParam(), 2 * MiB, 64);
  auto report = scan_for(*a, secret_);
  ASSERT_TRUE(report.complete()) << report.text();
  EXPECT_THAT(report.finds(), IsEmpty())
      << "uid " << a_->uid << " read uid " << b_->uid << "'s secret:\n"
      << report.text();
}

INSTANTIATE_TEST_SUITE_P(BothModes,
                         CudaTenantIsolationModes,
                         ::testing::Values("direct", "slab"),
                         [](auto const& info) { return info.param; });

TEST_F(CudaTenantIsolation, ReadingPastItsKeptImportNeverShowsAnotherUidsSecret)
{
  start();
  // A reads up to 62 MiB past its 1 MiB import (whatever the import maps
  // there: the pool's chunk), after B took 256 allocations of 1 MiB.
  auto a      = snoop(MiB, 62 * MiB);
  auto b      = secret_holder("direct", MiB, 256);
  auto report = scan_for(*a, secret_);
  ASSERT_TRUE(report.complete()) << report.text();
  EXPECT_THAT(report.finds(), IsEmpty())
      << "uid " << a_->uid << " read uid " << b_->uid << "'s secret:\n"
      << report.text();
}

TEST_F(CudaTenantIsolation, TheSameUidRecyclesItsOwnPoolSoTheScanFindsItsOwnSecret)
{
  // The control: within one uid's pool a freed block is lent again, and the
  // scan sees the next holder's bytes; so the tests above pass because the
  // pools are apart, not because the scan is blind.
  start();
  auto a      = snoop(2 * MiB, 0);
  auto same   = secret_holder("direct", 2 * MiB, 64, client_user_a);
  auto report = scan_for(*a, secret_);
  ASSERT_TRUE(report.complete()) << report.text();
  EXPECT_THAT(report.finds(), Not(IsEmpty())) << report.text();
}

TEST_F(CudaTenantIsolation, ABufferHolderThatKeepsItsMappingAfterCloseKeepsItsOwnPages)
{
  start();  // buffers are their own VMM allocations (the default)
  // uid A creates and writes 64 MiB; a holder of uid A opens it, tells the
  // daemon it closed it but keeps its mapping; the creator lets go, so the
  // daemon frees the buffer. uid B then takes 3 GiB and writes its secret
  // over all of it: the holder still reads the buffer's bytes.
  auto const bytes = std::to_string(64 * MiB);
  auto creator = client("rmmd_share_client", {"produce", "tenant/vmm", bytes, "81"}, client_user_a);
  ASSERT_THAT(creator->read_line(60s).value_or(""), StartsWith("created"));
  ASSERT_EQ(creator->read_line(60s).value_or(""), "published");
  auto holder =
      client("rmmd_share_client", {"hold-past-close", "tenant/vmm", bytes, "81"}, client_user_a);
  ASSERT_EQ(holder->read_line(60s).value_or(""), "verified " + bytes);
  ASSERT_EQ(holder->read_line(60s).value_or(""), "closed-kept");
  creator->close_stdin();
  ASSERT_EQ(creator->wait(60s), 0);
  ASSERT_TRUE(eventually([&] { return gpu_pool().shared_buffers() == 0; }))
      << "the daemon still lists the buffer";

  auto b = secret_holder("direct", 64 * MiB, 48);
  holder->close_stdin();
  EXPECT_EQ(holder->read_line(60s).value_or("(nothing: it exited)"), "intact");
  EXPECT_EQ(holder->wait(60s), 0);
}

TEST_F(CudaTenantIsolation, ThePoolPointerFallbackForBuffersIsRefusedBetweenUids)
{
  // --cuda-shared-buffer-memory pool: a buffer is a pointer of the creator's
  // pool, which another uid may not import. The daemon refuses it either
  // when the buffer is made for a group, or when a uid other than the
  // creator's opens it; the creator's own uid still opens it.
  start({"--cuda-shared-buffer-memory", "pool"});
  auto const gid = std::to_string(daemon_account_->gid);
  auto creator   = client("rmmd_share_client",
                        {"produce", "tenant/pp", std::to_string(MiB), "91", "--gid", gid},
                        client_user_a);
  auto first     = creator->read_line(60s).value_or("(nothing: it exited)");
  if (first.rfind("error ", 0) == 0) { return; }  // refused at creation: nothing to open
  ASSERT_THAT(first, StartsWith("created"));
  ASSERT_EQ(creator->read_line(60s).value_or(""), "published");

  auto other = client("rmmd_share_client", {"try-open", "tenant/pp"}, client_user_b);
  EXPECT_THAT(other->read_line(60s).value_or("(nothing: it exited)"), StartsWith("error "))
      << "uid " << b_->uid << " opened a pool pointer of uid " << a_->uid << "'s pool";
  other->close_stdin();
  EXPECT_EQ(other->wait(60s), 2);

  auto same = client("rmmd_share_client", {"try-open", "tenant/pp"}, client_user_a);
  EXPECT_THAT(same->read_line(60s).value_or("(nothing: it exited)"), StartsWith("opened "));
  same->close_stdin();
  EXPECT_EQ(same->wait(60s), 0);
}

}  // namespace
}  // namespace rmmd::test
