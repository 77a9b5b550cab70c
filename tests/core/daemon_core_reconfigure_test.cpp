// daemon_core::reconfigure: a reload changes who may open sessions, the
// quotas, the reclaim timeout and which requests are packed; open sessions
// and what they hold stay.

#include "common/hex.hpp"
#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

peer_credentials peer(uid_t uid)
{
  return peer_credentials{.pid = 1234, .uid = uid, .gid = 100};
}

access_policy uids(std::vector<uid_t> list)
{
  access_policy policy;
  policy.uids = std::move(list);
  return policy;
}

quota_limits session_quota(std::size_t bytes)
{
  quota_limits quotas;
  quotas.per_session_bytes = bytes;
  return quotas;
}

/// What a reload that changes only the access policy and quotas carries.
core_reload reload(access_policy access, quota_limits quotas)
{
  return core_reload{.access = std::move(access), .quotas = std::move(quotas)};
}

class Reconfigure : public ::testing::Test {
 protected:
  // No reclaim wait until a reload sets a timeout.
  Reconfigure()
      : core_(core_options{.access = uids({1000, 1001}), .quotas = {}, .reclaim_timeout = 0ms})
  {
    pool_ = core_.pools().add_pool(
        pool_config{.name = "host", .device = -1, .handle_types = {handle_type::host_offset}},
        std::make_unique<backends::host::host_backend>("host", 64 * MiB));
  }
  daemon_core core_;
  pool_id pool_{};
};

TEST_F(Reconfigure, ALoweredSessionQuotaRefusesTheNextAllocationAndKeepsWhatIsHeld)
{
  auto s = core_.sessions().open_session(peer(1000), "cmd", "client");
  ASSERT_TRUE(s.ok());
  auto held = core_.leases().allocate(s->id, pool_, 4 * MiB, 0);
  ASSERT_TRUE(held.ok());

  core_.reconfigure(reload(uids({1000, 1001}), session_quota(2 * MiB)));

  auto over = core_.leases().allocate(s->id, pool_, 4096, 0);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("quota of 2097152 bytes"));
  ASSERT_EQ(core_.sessions().list().size(), 1u);
  EXPECT_EQ(core_.sessions().list()[0].bytes, 4 * MiB);  // still held
  EXPECT_TRUE(core_.leases().free(s->id, held->id).ok());
  EXPECT_TRUE(core_.leases().allocate(s->id, pool_, MiB, 0).ok());  // under the new quota
}

TEST_F(Reconfigure, APerUidOverrideAppliesToOpenSessions)
{
  auto s = core_.sessions().open_session(peer(1001), "cmd", "client");
  ASSERT_TRUE(s.ok());
  quota_limits quotas;
  quotas.per_uid_overrides[1001] = MiB;
  core_.reconfigure(reload(uids({1000, 1001}), quotas));
  EXPECT_EQ(core_.leases().allocate(s->id, pool_, 2 * MiB, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(core_.leases().allocate(s->id, pool_, MiB, 0).ok());
}

TEST_F(Reconfigure, ANewAccessPolicyRefusesNewSessionsAndKeepsOpenOnes)
{
  auto before = core_.sessions().open_session(peer(1001), "cmd", "client");
  ASSERT_TRUE(before.ok());
  core_.reconfigure(reload(uids({1000}), quota_limits{}));
  EXPECT_EQ(core_.sessions().open_session(peer(1001), "cmd", "client").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(core_.sessions().open_session(peer(1000), "cmd", "client").ok());
  EXPECT_TRUE(core_.sessions()
                  .authenticate(common::to_hex(std::span<std::byte const>(before->token)))
                  .ok());
  EXPECT_TRUE(core_.leases().allocate(before->id, pool_, 4096, 0).ok());
}

TEST_F(Reconfigure, ANewReclaimTimeoutAppliesToTheNextShortRequest)
{
  // One session holds 60 MiB of the 64 as a slab it reports idle, and gives
  // it back when asked.
  auto const holder = core_.sessions().open_session(peer(1000), "slabs", "").value().id;
  auto const asker  = core_.sessions().open_session(peer(1001), "asker", "").value().id;
  auto const slab   = core_.leases().allocate(holder, pool_, 60 * MiB, 0).value().id;
  ASSERT_TRUE(
      core_.leases()
          .report_usage(
              holder,
              {carved_usage{.pool = pool_, .slab_bytes = 60 * MiB, .reclaimable_bytes = 60 * MiB}})
          .ok());
  std::atomic<int> asked{0};
  core_.leases().set_reclaim_notifier([&](session_id s, pool_id, std::size_t) {
    ++asked;
    EXPECT_TRUE(core_.leases().free(s, slab).ok());  // called without the core's lock
  });

  // Timeout 0: a short request is refused at once, and nobody is asked.
  EXPECT_EQ(core_.leases().allocate(asker, pool_, 16 * MiB, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(asked.load(), 0);

  core_.reconfigure({.access = uids({1000, 1001}), .quotas = {}, .reclaim_timeout = 10s});
  auto served = core_.leases().allocate(asker, pool_, 16 * MiB, 0);
  EXPECT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(asked.load(), 1);
  EXPECT_EQ(core_.pools().stats().pools.at(0).reclaim_served, 1u);
}

TEST(ReconfigurePacking, ANewPackUpToAppliesToTheNextAllocationAndBlocksStay)
{
  daemon_core core(core_options{.access = uids({1000}), .quotas = {}});
  auto const pool = core.pools().add_pool(
      pool_config{.name = "gpu0", .device = 0, .handle_types = {handle_type::posix_fd}},
      std::make_unique<fake_pool_backend>(
          fake_pool_backend::options{.capacity = 64 * MiB,
                                     .traits   = device_like_traits,
                                     .source   = fake_pool_backend::memory::made_up}));
  auto const s = core.sessions().open_session(peer(1000), "t", "").value().id;
  auto packed  = [&](std::size_t bytes) {
    auto g = core.leases().allocate(s, pool, bytes, 0, reclaim_policy::refuse, /*may_pack=*/true);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() && g->packed_block != 0;
  };
  auto const block = default_pack_block_size;

  EXPECT_TRUE(packed(256));
  EXPECT_FALSE(packed(128 * KiB));  // above the default 64 KiB

  core.reconfigure({.access = uids({1000}), .quotas = {}, .pack_up_to = 256 * KiB});
  EXPECT_TRUE(packed(128 * KiB));

  // Above the block size: lowered to it, as the constructor does.
  core.reconfigure({.access = uids({1000}), .quotas = {}, .pack_up_to = 4 * block});
  EXPECT_TRUE(packed(block / 2));
  EXPECT_FALSE(packed(block + 1));

  // 0: nothing more is packed; the blocks leased so far stay the session's.
  auto const before = core.pools().stats().pools.at(0).in_use_bytes;
  core.reconfigure({.access = uids({1000}), .quotas = {}, .pack_up_to = 0});
  EXPECT_FALSE(packed(256));
  EXPECT_EQ(core.pools().stats().pools.at(0).in_use_bytes, before + 256);
}

}  // namespace
}  // namespace rmmd::core
