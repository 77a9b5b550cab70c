// daemon_core on its own: policy, quotas, ownership, reclaim, stats. The pool
// is a real host_backend (memfd); one test uses a failing backend to show a
// backend error changes no state.

#include "daemon/core/daemon_core.hpp"
#include "daemon/backends/host/host_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t MiB = std::size_t{1} << 20;

peer_credentials peer(uid_t uid, gid_t gid = 100, std::vector<gid_t> groups = {})
{
  return peer_credentials{
      .pid = 1234, .uid = uid, .gid = gid, .supplementary_gids = std::move(groups)};
}

core_options allow_uids(std::vector<uid_t> uids, quota_limits quotas = {})
{
  core_options o;
  o.access.uids = std::move(uids);
  o.quotas      = std::move(quotas);
  return o;
}

std::unique_ptr<pool_backend> host_pool(std::size_t bytes = 64 * MiB)
{
  return std::make_unique<backends::host::host_backend>("test", bytes);
}

pool_config host_config(std::size_t limit = 0)
{
  return pool_config{.name         = "host",
                     .device       = -1,
                     .handle_types = {handle_type::host_offset},
                     .limit_bytes  = limit};
}

/// What a refused request must leave untouched.
std::string fingerprint(daemon_core const& core)
{
  std::string out;
  auto s = core.stats();
  for (auto const& p : s.pools) {
    out += std::to_string(p.in_use_bytes) + "/" + std::to_string(p.allocation_count) + "/" +
           std::to_string(p.high_water_bytes) + "/" + std::to_string(p.total_allocations) + ";";
  }
  for (auto const& x : s.sessions) {
    out += std::to_string(x.id) + ":" + std::to_string(x.bytes) + "/" +
           std::to_string(x.allocation_count) + ";";
  }
  return out;
}

TEST(AccessPolicy, AllowsByUidPrimaryGidOrSupplementaryGid)
{
  access_policy policy{.uids = {1000}, .gids = {50}};
  EXPECT_TRUE(policy.allows(peer(1000)));
  EXPECT_TRUE(policy.allows(peer(2000, 50)));
  EXPECT_TRUE(policy.allows(peer(2000, 100, {7, 50})));
  EXPECT_FALSE(policy.allows(peer(2000, 100, {7, 8})));
}

TEST(DaemonCore, RefusedPeerGetsPermissionDeniedAndNoSession)
{
  daemon_core core(allow_uids({1000}));
  auto s = core.open_session(peer(2000), "intruder", "");
  ASSERT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.status().message(), HasSubstr("uid 2000"));
  EXPECT_EQ(core.session_count(), 0u);
}

TEST(DaemonCore, TokensAuthenticateTheirSessionOnly)
{
  daemon_core core(allow_uids({1000}));
  auto a = core.open_session(peer(1000), "a", "");
  auto b = core.open_session(peer(1000), "b", "");
  ASSERT_TRUE(a.ok() && b.ok());
  auto hex_a = to_hex(a->token);
  EXPECT_EQ(hex_a.size(), 32u);
  EXPECT_EQ(hex_a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(hex_a, to_hex(b->token));
  EXPECT_EQ(*core.authenticate(hex_a), a->id);
  EXPECT_EQ(*core.authenticate(to_hex(b->token)), b->id);
  EXPECT_EQ(core.authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(core.authenticate(std::string(32, '0')).status().code(),
            absl::StatusCode::kUnauthenticated);
  core.close_session(a->id);
  EXPECT_EQ(core.authenticate(hex_a).status().code(), absl::StatusCode::kUnauthenticated);
}

class CoreWithPool : public ::testing::Test {
 protected:
  explicit CoreWithPool(quota_limits quotas = {}, std::size_t pool_limit = 0)
      : core_(allow_uids({1000, 1001}, std::move(quotas)))
  {
    pool_    = core_.add_pool(host_config(pool_limit), host_pool());
    session_ = core_.open_session(peer(1000), "test", "")->id;
  }

  daemon_core core_;
  pool_id pool_{};
  session_id session_{};
};

TEST_F(CoreWithPool, InvalidArgumentsChangeNothing)
{
  ASSERT_TRUE(core_.allocate(session_, pool_, 4096, 0).ok());
  auto const before = fingerprint(core_);
  struct bad {
    pool_id pool;
    std::size_t bytes, alignment;
    char const* says;
  };
  for (auto const& r : {bad{pool_, 0, 0, "size 0"},
                        bad{pool_, 65 * MiB, 0, "larger than the pool's capacity"},
                        bad{pool_, 4096, 3, "alignment 3"},
                        bad{pool_, 4096, std::size_t{1} << 30, "alignment 1073741824"},
                        bad{7, 4096, 0, "unknown pool id 7"}}) {
    auto st = core_.allocate(session_, r.pool, r.bytes, r.alignment).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << r.says;
    EXPECT_THAT(st.message(), HasSubstr(r.says));
  }
  EXPECT_EQ(fingerprint(core_), before);
}

TEST_F(CoreWithPool, FreeChecksExistenceAndOwnership)
{
  auto other        = core_.open_session(peer(1001), "other", "")->id;
  auto mine         = core_.allocate(session_, pool_, 4096, 0)->id;
  auto const before = fingerprint(core_);
  EXPECT_EQ(core_.free(other, mine).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_.free(session_, 999).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_TRUE(core_.free(session_, mine).ok());
  auto again = core_.free(session_, mine);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.message(), HasSubstr("already freed"));
}

TEST_F(CoreWithPool, StatsCountBytesHighWaterAndTotals)
{
  auto a = core_.allocate(session_, pool_, 1000, 0);  // rounded up to 1024
  auto b = core_.allocate(session_, pool_, 4096, 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->block.bytes, 1024u);
  EXPECT_EQ(b->block.offset % 4096, 0u);
  auto s = core_.stats();
  EXPECT_EQ(s.pools[0].in_use_bytes, 1024u + 4096u);
  EXPECT_EQ(s.pools[0].allocation_count, 2u);
  ASSERT_EQ(s.sessions.size(), 1u);
  EXPECT_EQ(s.sessions[0].bytes, 1024u + 4096u);
  EXPECT_EQ(s.sessions[0].command, "test");
  ASSERT_TRUE(core_.free(session_, a->id).ok());
  s = core_.stats();
  EXPECT_EQ(s.pools[0].in_use_bytes, 4096u);
  EXPECT_EQ(s.pools[0].high_water_bytes, 1024u + 4096u);
  EXPECT_EQ(s.pools[0].total_allocations, 2u);
}

TEST_F(CoreWithPool, ClosingASessionFreesEverythingItHeld)
{
  for (int i = 0; i < 10; ++i) { ASSERT_TRUE(core_.allocate(session_, pool_, MiB, 0).ok()); }
  core_.close_session(session_);
  auto s = core_.stats();
  EXPECT_EQ(s.pools[0].in_use_bytes, 0u);
  EXPECT_EQ(s.pools[0].allocation_count, 0u);
  EXPECT_TRUE(s.sessions.empty());
  core_.close_session(session_);  // twice is harmless
}

TEST_F(CoreWithPool, DrainRefusesNewWorkButFreesStillWork)
{
  auto a = core_.allocate(session_, pool_, 4096, 0)->id;
  core_.begin_drain();
  EXPECT_EQ(core_.allocate(session_, pool_, 4096, 0).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(core_.open_session(peer(1000), "late", "").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(core_.free(session_, a).ok());
}

class QuotaTest : public CoreWithPool {
 protected:
  QuotaTest()
      : CoreWithPool(quota_limits{.per_session_bytes = 4 * MiB,
                                  .per_uid_bytes     = 6 * MiB,
                                  .per_uid_overrides = {{1001, 16 * MiB}}})
  {
  }
};

TEST_F(QuotaTest, PerSessionQuota)
{
  ASSERT_TRUE(core_.allocate(session_, pool_, 3 * MiB, 0).ok());
  auto const before = fingerprint(core_);
  auto st           = core_.allocate(session_, pool_, 2 * MiB, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("quota of 4194304 bytes"));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_TRUE(core_.allocate(session_, pool_, MiB, 0).ok());  // exactly up to the quota
}

TEST_F(QuotaTest, PerUidQuotaSpansSessionsAndIsReleasedOnClose)
{
  auto second = core_.open_session(peer(1000), "second", "")->id;
  ASSERT_TRUE(core_.allocate(session_, pool_, 4 * MiB, 0).ok());
  auto const before = fingerprint(core_);
  auto st           = core_.allocate(second, pool_, 3 * MiB, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("uid 1000"));
  EXPECT_EQ(fingerprint(core_), before);
  core_.close_session(session_);
  EXPECT_TRUE(core_.allocate(second, pool_, 4 * MiB, 0).ok());
}

TEST_F(QuotaTest, PerUidOverrideWins)
{
  auto s1 = core_.open_session(peer(1001), "a", "")->id;
  auto s2 = core_.open_session(peer(1001), "b", "")->id;
  auto s3 = core_.open_session(peer(1001), "c", "")->id;
  for (auto s : {s1, s2, s3}) {
    EXPECT_TRUE(core_.allocate(s, pool_, 4 * MiB, 0).ok());  // 12 MiB > 6 MiB default
  }
}

class PoolLimitTest : public CoreWithPool {
 protected:
  PoolLimitTest() : CoreWithPool({}, 2 * MiB) {}
};

TEST_F(PoolLimitTest, PoolLimitIsResourceExhausted)
{
  EXPECT_EQ(core_.pools()[0].capacity_bytes, 2 * MiB);
  ASSERT_TRUE(core_.allocate(session_, pool_, MiB + MiB / 2, 0).ok());
  auto const before = fingerprint(core_);
  auto st           = core_.allocate(session_, pool_, MiB, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("in use"));
  EXPECT_EQ(fingerprint(core_), before);
}

/// A backend that fails every allocation, as a broken device would.
class failing_backend final : public pool_backend {
 public:
  backend_kind kind() const noexcept override
  {
    return backend_kind::cuda;
  }
  std::size_t capacity() const noexcept override
  {
    return 1 << 30;
  }
  absl::StatusOr<backend_allocation> allocate(std::size_t, std::size_t) override
  {
    return absl::InternalError("cudaErrorIllegalAddress");
  }
  void deallocate(backend_allocation const&) noexcept override {}
};

TEST(DaemonCore, BackendErrorPropagatesAndChangesNothing)
{
  daemon_core core(allow_uids({1000}));
  auto pool         = core.add_pool(pool_config{.name = "broken", .device = 0},
                            std::make_unique<failing_backend>());
  auto s            = core.open_session(peer(1000), "t", "")->id;
  auto const before = fingerprint(core);
  auto st           = core.allocate(s, pool, 4096, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("pool 'broken'"));
  EXPECT_THAT(st.message(), HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_EQ(fingerprint(core), before);
}

}  // namespace
}  // namespace rmmd::core
