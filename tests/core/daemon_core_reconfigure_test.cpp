// daemon_core::reconfigure: a reload changes who may open sessions and the
// quotas; open sessions and what they hold stay.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;

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

class Reconfigure : public ::testing::Test {
 protected:
  Reconfigure() : core_(core_options{.access = uids({1000, 1001}), .quotas = {}})
  {
    pool_ = core_.add_pool(
        pool_config{.name = "host", .device = -1, .handle_types = {handle_type::host_offset}},
        std::make_unique<backends::host::host_backend>("host", 64 * MiB));
  }
  daemon_core core_;
  pool_id pool_{};
};

TEST_F(Reconfigure, ALoweredSessionQuotaRefusesTheNextAllocationAndKeepsWhatIsHeld)
{
  auto s = core_.open_session(peer(1000), "cmd", "client");
  ASSERT_TRUE(s.ok());
  auto held = core_.allocate(s->id, pool_, 4 * MiB, 0);
  ASSERT_TRUE(held.ok());

  core_.reconfigure(uids({1000, 1001}), session_quota(2 * MiB));

  auto over = core_.allocate(s->id, pool_, 4096, 0);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("quota of 2097152 bytes"));
  ASSERT_EQ(core_.sessions().size(), 1u);
  EXPECT_EQ(core_.sessions()[0].bytes, 4 * MiB);  // still held
  EXPECT_TRUE(core_.free(s->id, held->id).ok());
  EXPECT_TRUE(core_.allocate(s->id, pool_, MiB, 0).ok());  // under the new quota
}

TEST_F(Reconfigure, APerUidOverrideAppliesToOpenSessions)
{
  auto s = core_.open_session(peer(1001), "cmd", "client");
  ASSERT_TRUE(s.ok());
  quota_limits quotas;
  quotas.per_uid_overrides[1001] = MiB;
  core_.reconfigure(uids({1000, 1001}), quotas);
  EXPECT_EQ(core_.allocate(s->id, pool_, 2 * MiB, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(core_.allocate(s->id, pool_, MiB, 0).ok());
}

TEST_F(Reconfigure, ANewAccessPolicyRefusesNewSessionsAndKeepsOpenOnes)
{
  auto before = core_.open_session(peer(1001), "cmd", "client");
  ASSERT_TRUE(before.ok());
  core_.reconfigure(uids({1000}), quota_limits{});
  EXPECT_EQ(core_.open_session(peer(1001), "cmd", "client").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(core_.open_session(peer(1000), "cmd", "client").ok());
  EXPECT_TRUE(core_.authenticate(to_hex(before->token)).ok());
  EXPECT_TRUE(core_.allocate(before->id, pool_, 4096, 0).ok());
}

}  // namespace
}  // namespace rmmd::core
