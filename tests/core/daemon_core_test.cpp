// daemon_core on its own: access policy, tokens, validation, quotas,
// ownership, reclaim, stats and draining. The pools are real host_backends
// (memfd), under the tests' fake_pool_backend where a test counts what the
// core asks of them or has them fail, as a broken device would.

#include "daemon/core/daemon_core.hpp"
#include "common/hex.hpp"
#include "daemon/backends/host/host_backend.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr std::size_t MiB       = std::size_t{1} << 20;
constexpr std::size_t pool_size = 64 * MiB;

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

pool_config host_config(std::string name = "host", std::size_t limit = 0)
{
  return pool_config{.name         = std::move(name),
                     .device       = -1,
                     .handle_types = {handle_type::host_offset},
                     .limit_bytes  = limit};
}

/// Everything a refused request must leave untouched: pools, sessions, quotas
/// as the stats show them (allocation counts, bytes, high water, totals).
std::string fingerprint(daemon_core const& core)
{
  std::string out;
  auto s = core.pools().stats();
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

// ---------------------------------------------------------------------------
// Access policy and sessions

TEST(AccessPolicy, AllowsByUidPrimaryGidOrSupplementaryGid)
{
  access_policy policy{.uids = {1000}, .gids = {50}};
  EXPECT_TRUE(policy.allows(peer(1000)));
  EXPECT_TRUE(policy.allows(peer(2000, 50)));
  EXPECT_TRUE(policy.allows(peer(2000, 100, {7, 50})));
  EXPECT_FALSE(policy.allows(peer(2000, 100, {7, 8})));
  EXPECT_FALSE(policy.allows(peer(50, 1000)));  // a uid is not a gid, nor the reverse
}

TEST(AccessPolicy, AnEmptyPolicyAllowsNobody)
{
  EXPECT_FALSE(access_policy{}.allows(peer(0, 0, {0})));
}

TEST(DaemonCore, OpensSessionsForAnAllowedUidPrimaryGidOrSupplementaryGid)
{
  core_options options;
  options.access = access_policy{.uids = {1000}, .gids = {50}};
  daemon_core core(options);
  EXPECT_TRUE(core.sessions().open_session(peer(1000), "by-uid", "").ok());
  EXPECT_TRUE(core.sessions().open_session(peer(2000, 50), "by-gid", "").ok());
  EXPECT_TRUE(core.sessions().open_session(peer(2001, 100, {7, 50}), "by-group", "").ok());
  EXPECT_EQ(core.sessions().session_count(), 3u);
}

TEST(DaemonCore, ARefusedPeerGetsPermissionDeniedAndNoSession)
{
  core_options options;
  options.access = access_policy{.uids = {1000}, .gids = {50}};
  daemon_core core(options);
  auto s = core.sessions().open_session(peer(2000, 100, {7, 8}), "intruder", "");
  ASSERT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.status().message(), AllOf(HasSubstr("uid 2000"), HasSubstr("gid 100")));
  EXPECT_THAT(s.status().message(), HasSubstr("pid 1234"));
  EXPECT_EQ(core.sessions().session_count(), 0u);
  EXPECT_TRUE(core.pools().stats().sessions.empty());
}

TEST(DaemonCore, SessionsRecordWhoOpenedThemAndWhat)
{
  daemon_core core(allow_uids({1000}));
  auto grant = core.sessions().open_session(peer(1000, 100, {5, 6}), "python3", "loader-0");
  ASSERT_TRUE(grant.ok());
  auto sessions = core.sessions().list();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].id, grant->id);
  EXPECT_EQ(sessions[0].peer.pid, 1234);
  EXPECT_EQ(sessions[0].peer.uid, 1000u);
  EXPECT_EQ(sessions[0].peer.gid, 100u);
  EXPECT_EQ(sessions[0].peer.supplementary_gids, (std::vector<gid_t>{5, 6}));
  EXPECT_EQ(sessions[0].command, "python3");
  EXPECT_EQ(sessions[0].client_name, "loader-0");
  EXPECT_EQ(sessions[0].bytes, 0u);
  EXPECT_EQ(sessions[0].allocation_count, 0u);
}

TEST(DaemonCore, TokensAreLowercaseHexAndDistinct)
{
  daemon_core core(allow_uids({1000}));
  std::set<std::string> seen;
  std::set<session_id> ids;
  for (int i = 0; i < 64; ++i) {
    auto grant = core.sessions().open_session(peer(1000), "t", "");
    ASSERT_TRUE(grant.ok());
    auto hex = common::to_hex(std::span<std::byte const>(grant->token));
    EXPECT_EQ(hex.size(), 32u);
    EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos) << hex;
    seen.insert(hex);
    ids.insert(grant->id);
  }
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_EQ(ids.size(), 64u);
}

TEST(DaemonCore, TokensAuthenticateTheirOwnSessionOnly)
{
  daemon_core core(allow_uids({1000}));
  auto a = core.sessions().open_session(peer(1000), "a", "");
  auto b = core.sessions().open_session(peer(1000), "b", "");
  ASSERT_TRUE(a.ok() && b.ok());
  auto const hex_a = common::to_hex(std::span<std::byte const>(a->token));
  EXPECT_EQ(*core.sessions().authenticate(hex_a), a->id);
  EXPECT_EQ(*core.sessions().authenticate(common::to_hex(std::span<std::byte const>(b->token))),
            b->id);

  auto empty = core.sessions().authenticate("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(empty.status().message(), HasSubstr("no session token"));
  auto unknown = core.sessions().authenticate(std::string(32, '0'));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown session token"));

  core.close_session(a->id);
  EXPECT_EQ(core.sessions().authenticate(hex_a).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(*core.sessions().authenticate(common::to_hex(std::span<std::byte const>(b->token))),
            b->id);
}

// ---------------------------------------------------------------------------
// A core with one 64 MiB host pool and one session of uid 1000.

class CoreWithPool : public ::testing::Test {
 protected:
  explicit CoreWithPool(quota_limits quotas = {}, std::size_t pool_limit = 0)
      : core_(allow_uids({1000, 1001}, std::move(quotas)))
  {
    auto backend =
        std::make_unique<fake_pool_backend>(fake_pool_backend::options{.capacity = pool_size});
    backend_ = backend.get();
    pool_    = core_.pools().add_pool(host_config("host", pool_limit), std::move(backend));
    session_ = open(1000);
  }

  session_id open(uid_t uid)
  {
    auto grant = core_.sessions().open_session(peer(uid), "test", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  pool_stats pool_stats_now() const
  {
    return core_.pools().stats().pools.at(0);
  }

  daemon_core core_;
  fake_pool_backend* backend_{};  // owned by core_
  pool_id pool_{};
  session_id session_{};
};

TEST_F(CoreWithPool, DescribesItsPools)
{
  auto pools = core_.pools().list();
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].id, pool_);
  EXPECT_EQ(pools[0].name, "host");
  EXPECT_EQ(pools[0].device, -1);
  EXPECT_EQ(pools[0].backend.space, memory_space::host);
  EXPECT_EQ(pools[0].backend.name, "host");
  EXPECT_EQ(pools[0].capacity_bytes, pool_size);
  EXPECT_EQ(pools[0].max_alignment, 2 * MiB);
  // One backend for everyone (added as one): each session imports its fd.
  auto mine = core_.pools().pools_for(session_);
  ASSERT_TRUE(mine.ok());
  EXPECT_GE((*mine)[0].shareable_fd, 0);
}

TEST_F(CoreWithPool, AllocationsAreAlignedAndCountedAtTheirReservedSize)
{
  auto plain = core_.leases().allocate(session_, pool_, 1000, 0);  // 0: the default alignment
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->block.offset % default_alignment, 0u);
  EXPECT_EQ(plain->block.bytes, 1024u);
  auto widest = core_.leases().allocate(session_, pool_, 4096, 2 * MiB);  // the largest accepted
  ASSERT_TRUE(widest.ok()) << widest.status();
  EXPECT_EQ(widest->block.offset % (2 * MiB), 0u);
  EXPECT_NE(plain->id, widest->id);
  EXPECT_EQ(pool_stats_now().in_use_bytes, 1024u + 4096u);
  EXPECT_EQ(core_.sessions().list()[0].bytes, 1024u + 4096u);
}

TEST_F(CoreWithPool, InvalidArgumentsAreRefusedAndChangeNothing)
{
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 4096, 0).ok());
  auto const before = fingerprint(core_);
  struct bad {
    pool_id pool;
    std::size_t bytes, alignment;
    std::vector<char const*> says;
  };
  for (auto const& r :
       std::vector<bad>{{pool_, 0, 0, {"pool 'host'", "size 0"}},
                        {pool_, 4096, 3, {"pool 'host'", "alignment 3", "power of two"}},
                        {pool_, 4096, 4 * MiB, {"pool 'host'", "alignment 4194304", "2097152"}},
                        {7, 4096, 0, {"unknown pool id 7", "0 to 0"}}}) {
    auto st = core_.leases().allocate(session_, r.pool, r.bytes, r.alignment).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << r.says.back();
    for (auto const* fact : r.says) { EXPECT_THAT(st.message(), HasSubstr(fact)); }
  }
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(backend_->allocate_calls(), 1u);  // none of them reached the backend
}

TEST_F(CoreWithPool, ARequestLargerThanThePoolIsOutOfMemoryAndChangesNothing)
{
  // As RMM's resources do for a request no memory could hold: out of memory,
  // not a bad argument (the client raises rmm::out_of_memory).
  auto const before = fingerprint(core_);
  auto st           = core_.leases().allocate(session_, pool_, pool_size + 1, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("pool 'host'"),
                    HasSubstr("67108865 bytes"),
                    HasSubstr("larger than the pool's capacity of 67108864 bytes")));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(backend_->allocate_calls(), 0u);
}

TEST_F(CoreWithPool, AClosedSessionCannotAllocate)
{
  core_.close_session(session_);
  auto st = core_.leases().allocate(session_, pool_, 4096, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(backend_->allocate_calls(), 0u);
}

TEST_F(CoreWithPool, FreeChecksExistenceAndOwnershipAndChangesNothingWhenRefused)
{
  auto other        = open(1001);
  auto mine         = core_.leases().allocate(session_, pool_, 4096, 0)->id;
  auto const before = fingerprint(core_);

  auto theirs = core_.leases().free(other, mine);
  EXPECT_EQ(theirs.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(theirs.message(),
              AllOf(HasSubstr(std::to_string(mine)), HasSubstr("another session")));
  auto unknown = core_.leases().free(session_, 999);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("allocation 999"));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(backend_->live_blocks(), 1u);

  EXPECT_TRUE(core_.leases().free(session_, mine).ok());
  EXPECT_EQ(backend_->live_blocks(), 0u);
  auto const after_free = fingerprint(core_);
  auto again            = core_.leases().free(session_, mine);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.message(), AllOf(HasSubstr(std::to_string(mine)), HasSubstr("already freed")));
  EXPECT_EQ(fingerprint(core_), after_free);
  EXPECT_EQ(backend_->live_blocks(), 0u);
}

TEST_F(CoreWithPool, StatsCountBytesHighWaterAndTotals)
{
  auto a = core_.leases().allocate(session_, pool_, 1000, 0);  // reserves 1024
  auto b = core_.leases().allocate(session_, pool_, 4096, 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  auto p = pool_stats_now();
  EXPECT_EQ(p.in_use_bytes, 1024u + 4096u);
  EXPECT_EQ(p.high_water_bytes, 1024u + 4096u);
  EXPECT_EQ(p.allocation_count, 2u);
  EXPECT_EQ(p.total_allocations, 2u);
  EXPECT_EQ(p.pool.name, "host");

  ASSERT_TRUE(core_.leases().free(session_, a->id).ok());
  p = pool_stats_now();
  EXPECT_EQ(p.in_use_bytes, 4096u);
  EXPECT_EQ(p.high_water_bytes, 1024u + 4096u);  // the mark stays
  EXPECT_EQ(p.allocation_count, 1u);
  EXPECT_EQ(p.total_allocations, 2u);

  ASSERT_FALSE(core_.leases().allocate(session_, pool_, 0, 0).ok());  // refused: not counted
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 512, 0).ok());
  p = pool_stats_now();
  EXPECT_EQ(p.in_use_bytes, 4096u + 512u);
  EXPECT_EQ(p.high_water_bytes, 1024u + 4096u);  // below the mark: unchanged
  EXPECT_EQ(p.total_allocations, 3u);

  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 2048, 0).ok());
  p = pool_stats_now();
  EXPECT_EQ(p.high_water_bytes, 4096u + 512u + 2048u);  // a new mark
  EXPECT_EQ(p.total_allocations, 4u);
  auto s = core_.pools().stats().sessions;
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].bytes, 4096u + 512u + 2048u);
  EXPECT_EQ(s[0].allocation_count, 3u);
}

TEST_F(CoreWithPool, ClosingASessionFreesEverythingItHeld)
{
  auto other = open(1001);
  auto kept  = core_.leases().allocate(other, pool_, MiB, 0);
  ASSERT_TRUE(kept.ok());
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(core_.leases().allocate(session_, pool_, 3 * MiB, 0).ok());
  }
  core_.close_session(session_);

  auto s = core_.pools().stats();
  EXPECT_EQ(s.pools[0].in_use_bytes, MiB);
  EXPECT_EQ(s.pools[0].allocation_count, 1u);
  EXPECT_EQ(s.pools[0].high_water_bytes, 31 * MiB);
  ASSERT_EQ(s.sessions.size(), 1u);
  EXPECT_EQ(s.sessions[0].id, other);
  EXPECT_EQ(backend_->live_blocks(), 1u);
  EXPECT_EQ(backend_->live_bytes(), MiB);
  // The other session's lease is untouched, and the freed memory is reusable.
  EXPECT_TRUE(core_.leases().allocate(other, pool_, pool_size - MiB, 0).ok());
  EXPECT_TRUE(core_.leases().free(other, kept->id).ok());

  core_.close_session(session_);  // twice is harmless
  core_.close_session(12345);     // and so is an unknown id
  core_.close_session(other);
  EXPECT_EQ(pool_stats_now().in_use_bytes, 0u);
  EXPECT_EQ(backend_->live_blocks(), 0u);
  EXPECT_EQ(core_.sessions().session_count(), 0u);
}

TEST_F(CoreWithPool, ClosingASessionFreesItsLeasesInOneBatchPerPool)
{
  auto other = open(1001);
  auto kept  = core_.leases().allocate(other, pool_, 256, 0);
  ASSERT_TRUE(kept.ok());
  std::vector<allocation_id> ids;
  for (int i = 0; i < 5000; ++i) {
    auto grant = core_.leases().allocate(session_, pool_, 1 + i % 700, 0);
    ASSERT_TRUE(grant.ok()) << grant.status();
    ids.push_back(grant->id);
  }
  // Some freed one by one first, some of them in the middle of the run.
  for (int i = 100; i < 200; ++i) { ASSERT_TRUE(core_.leases().free(session_, ids[i]).ok()); }
  EXPECT_EQ(backend_->batches(), 0u);
  core_.close_session(session_);
  EXPECT_EQ(backend_->batches(), 1u);
  EXPECT_EQ(backend_->live_blocks(), 1u);
  EXPECT_EQ(pool_stats_now().in_use_bytes, 256u);
  EXPECT_EQ(pool_stats_now().allocation_count, 1u);
  // Their ids are gone with them; the other session's lease is not.
  EXPECT_EQ(core_.leases().free(other, ids[0]).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_.leases().allocate(other, pool_, pool_size - 256, 0).ok());
  EXPECT_TRUE(core_.leases().free(other, kept->id).ok());
  core_.close_session(other);
  EXPECT_EQ(backend_->batches(), 2u);
  EXPECT_EQ(backend_->live_blocks(), 0u);
  EXPECT_EQ(pool_stats_now().in_use_bytes, 0u);
}

TEST_F(CoreWithPool, TopSessionsListsThoseHoldingTheMostAndSumsTheRest)
{
  auto b = open(1001);
  auto c = open(1000);
  auto d = open(1001);
  ASSERT_TRUE(core_.leases().allocate(b, pool_, 4 * MiB, 0).ok());
  ASSERT_TRUE(core_.leases().allocate(c, pool_, MiB, 0).ok());
  ASSERT_TRUE(core_.leases().allocate(c, pool_, MiB, 0).ok());
  ASSERT_TRUE(core_.leases().allocate(d, pool_, 2 * MiB, 0).ok());
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 256, 0).ok());

  auto top = core_.sessions().top_sessions(2);
  ASSERT_EQ(top.sessions.size(), 2u);
  EXPECT_EQ(top.sessions[0].id, b);
  // c and d hold 2 MiB each: more allocations first.
  EXPECT_EQ(top.sessions[1].id, c);
  EXPECT_EQ(top.session_count, 4u);
  EXPECT_EQ(top.unlisted_bytes, 2 * MiB + 256);
  EXPECT_EQ(top.unlisted_allocations, 2u);

  // Ties on bytes and allocations: the oldest first.
  ASSERT_TRUE(core_.leases().allocate(d, pool_, 256, 0).ok());
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 2 * MiB, 0).ok());
  auto all = core_.sessions().top_sessions(10);
  ASSERT_EQ(all.sessions.size(), 4u);
  EXPECT_EQ(all.sessions[0].id, b);
  EXPECT_EQ(all.sessions[1].id, session_);
  EXPECT_EQ(all.sessions[2].id, d);
  EXPECT_EQ(all.sessions[3].id, c);
  EXPECT_EQ(all.unlisted_bytes, 0u);

  auto none = core_.sessions().top_sessions(0);
  EXPECT_TRUE(none.sessions.empty());
  EXPECT_EQ(none.session_count, 4u);
  EXPECT_EQ(none.unlisted_allocations, 7u);

  // Stats: the same choice, or, without a count, every session by id.
  auto stats = core_.pools().stats(1);
  ASSERT_EQ(stats.sessions.size(), 1u);
  EXPECT_EQ(stats.sessions[0].id, b);
  EXPECT_EQ(stats.session_count, 4u);
  EXPECT_EQ(stats.unlisted_bytes, 6 * MiB + 512);
  auto every = core_.pools().stats();
  ASSERT_EQ(every.sessions.size(), 4u);
  EXPECT_EQ(every.sessions[0].id, session_);
  EXPECT_EQ(every.sessions[3].id, d);
  EXPECT_EQ(every.session_count, 4u);
  EXPECT_EQ(every.unlisted_bytes, 0u);
}

// ---------------------------------------------------------------------------
// Fast-path sessions: carved usage and pool pressure

TEST_F(CoreWithPool, CarvedUsageShowsInStatsAndEachReportReplacesTheLast)
{
  auto slab = core_.leases().allocate(session_, pool_, 16 * MiB, 0);
  ASSERT_TRUE(slab.ok());
  auto trim = core_.leases().report_usage(
      session_, {{.pool = pool_, .bytes = 5 * MiB, .allocation_count = 3}});
  ASSERT_TRUE(trim.ok()) << trim.status();
  EXPECT_TRUE(trim->empty());  // no pressure
  auto s = core_.pools().stats();
  EXPECT_EQ(s.pools[0].in_use_bytes, 16 * MiB);  // slabs count whole
  EXPECT_EQ(s.pools[0].carved_bytes, 5 * MiB);
  EXPECT_EQ(s.pools[0].carved_allocations, 3u);
  EXPECT_EQ(s.sessions[0].carved_bytes, 5 * MiB);
  ASSERT_TRUE(core_.leases()
                  .report_usage(session_, {{.pool = pool_, .bytes = MiB, .allocation_count = 1}})
                  .ok());
  EXPECT_EQ(core_.pools().stats().pools[0].carved_bytes, MiB);
  ASSERT_TRUE(core_.leases().report_usage(session_, {{.pool = pool_}}).ok());
  EXPECT_EQ(core_.pools().stats().pools[0].carved_bytes, 0u);
  core_.close_session(session_);
  EXPECT_EQ(core_.pools().stats().pools[0].carved_bytes, 0u);
}

TEST_F(CoreWithPool, ABadUsageReportIsInvalidArgumentAndRecordsNothing)
{
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, MiB, 0).ok());
  ASSERT_TRUE(core_.leases()
                  .report_usage(session_, {{.pool = pool_, .bytes = 4096, .allocation_count = 1}})
                  .ok());
  auto const before = core_.pools().stats().pools[0].carved_bytes;
  struct bad {
    std::vector<carved_usage> usage;
    char const* says;
  };
  for (auto const& b : std::vector<bad>{
           {{{.pool = 7, .bytes = 1}}, "unknown pool id 7"},
           {{{.pool = pool_, .bytes = 1}, {.pool = pool_, .bytes = 2}}, "appears twice"},
           {{{.pool = pool_, .bytes = 2 * MiB, .allocation_count = 1}}, "holds 1048576 bytes"}}) {
    auto r = core_.leases().report_usage(session_, b.usage);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(b.says));
  }
  EXPECT_EQ(core_.pools().stats().pools[0].carved_bytes, before);
  EXPECT_EQ(core_.leases().report_usage(999, {}).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(CoreWithPool, APoolShortOfMemoryAsksFastPathSessionsToTrim)
{
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, pool_size / 2, 0).ok());
  auto other = open(1001);
  EXPECT_EQ(core_.leases().allocate(other, pool_, pool_size, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto trim = core_.leases().report_usage(session_, {});
  ASSERT_TRUE(trim.ok());
  EXPECT_EQ(*trim, std::vector<pool_id>{pool_});
}

TEST_F(CoreWithPool, AnOperatorCanSignalPressure)
{
  core_.leases().signal_pressure(pool_);
  EXPECT_EQ(*core_.leases().report_usage(session_, {}), std::vector<pool_id>{pool_});
  core_.leases().signal_pressure(42);  // unknown pools are ignored
}

TEST_F(CoreWithPool, CloseAllSessionsFreesEveryLease)
{
  auto other = open(1001);
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, MiB, 0).ok());
  ASSERT_TRUE(core_.leases().allocate(other, pool_, MiB, 0).ok());
  core_.close_all_sessions();
  EXPECT_EQ(core_.sessions().session_count(), 0u);
  EXPECT_EQ(pool_stats_now().in_use_bytes, 0u);
  EXPECT_EQ(pool_stats_now().allocation_count, 0u);
  EXPECT_EQ(backend_->live_blocks(), 0u);
}

TEST_F(CoreWithPool, TheFirstDrainPhaseRefusesSessionsButLiveOnesKeepAllocating)
{
  EXPECT_FALSE(core_.draining());
  core_.stop_new_sessions();
  EXPECT_TRUE(core_.draining());  // what Health and the metrics report
  EXPECT_EQ(core_.sessions().open_session(peer(1000), "late", "").status().code(),
            absl::StatusCode::kUnavailable);
  auto a = core_.leases().allocate(session_, pool_, MiB, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(core_.leases().free(session_, a->id).ok());
}

TEST_F(CoreWithPool, DrainRefusesNewWorkButFreesStillWork)
{
  auto a = core_.leases().allocate(session_, pool_, 4096, 0)->id;
  auto b = core_.leases().allocate(session_, pool_, 4096, 0)->id;
  core_.begin_drain();
  auto const before = fingerprint(core_);

  auto alloc = core_.leases().allocate(session_, pool_, 4096, 0).status();
  EXPECT_EQ(alloc.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(alloc.message(), AllOf(HasSubstr("4096 bytes"), HasSubstr("draining")));
  auto late = core_.sessions().open_session(peer(1000), "late", "").status();
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late.message(), HasSubstr("draining"));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(core_.sessions().session_count(), 1u);

  EXPECT_TRUE(core_.leases().free(session_, a).ok());
  EXPECT_EQ(pool_stats_now().in_use_bytes, 4096u);
  core_.close_session(session_);  // and so does reclaim
  EXPECT_EQ(pool_stats_now().in_use_bytes, 0u);
  EXPECT_EQ(core_.leases().free(session_, b).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoreWithPool, ABackendErrorPropagatesWithItsCodeAndChangesNothing)
{
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 4096, 0).ok());
  auto const before = fingerprint(core_);

  backend_->fail_next(absl::InternalError("cudaErrorIllegalAddress"));
  auto internal = core_.leases().allocate(session_, pool_, 8192, 0).status();
  EXPECT_EQ(internal.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(
      internal.message(),
      AllOf(
          HasSubstr("pool 'host'"), HasSubstr("8192 bytes"), HasSubstr("cudaErrorIllegalAddress")));
  EXPECT_EQ(fingerprint(core_), before);

  backend_->fail_next(absl::ResourceExhaustedError("cudaErrorMemoryAllocation"));
  auto oom = core_.leases().allocate(session_, pool_, 8192, 0).status();
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(), HasSubstr("cudaErrorMemoryAllocation"));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(backend_->live_blocks(), 1u);

  // The next request that the backend serves is counted normally.
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 8192, 0).ok());
  EXPECT_EQ(pool_stats_now().total_allocations, 2u);
  EXPECT_EQ(pool_stats_now().in_use_bytes, 4096u + 8192u);
}

// ---------------------------------------------------------------------------
// Quotas: 4 MiB per session, 6 MiB per uid, 16 MiB for uid 1001.

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
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 3 * MiB, 0).ok());
  auto const before = fingerprint(core_);
  auto st           = core_.leases().allocate(session_, pool_, 2 * MiB, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("pool 'host'"),
                    HasSubstr("2097152 bytes"),
                    HasSubstr("session " + std::to_string(session_)),
                    HasSubstr("holds 3145728 bytes"),
                    HasSubstr("quota of 4194304 bytes")));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(backend_->live_blocks(), 1u);
  EXPECT_TRUE(core_.leases().allocate(session_, pool_, MiB, 0).ok());  // exactly up to the quota
  EXPECT_EQ(core_.leases().allocate(session_, pool_, 1, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(QuotaTest, PerUidQuotaSpansTheUidsSessions)
{
  auto second = open(1000);
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 4 * MiB, 0).ok());
  auto const before = fingerprint(core_);
  auto st           = core_.leases().allocate(second, pool_, 3 * MiB, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("uid 1000"),
                    HasSubstr("holds 4194304 bytes"),
                    HasSubstr("quota of 6291456 bytes")));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_TRUE(
      core_.leases().allocate(second, pool_, 2 * MiB, 0).ok());  // exactly up to the uid quota
  EXPECT_EQ(core_.leases().allocate(second, pool_, 256, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Another uid has a quota of its own.
  EXPECT_TRUE(core_.leases().allocate(open(1001), pool_, 4 * MiB, 0).ok());
}

TEST_F(QuotaTest, ClosingSessionsReleasesTheUidsQuota)
{
  auto second = open(1000);
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, 4 * MiB, 0).ok());
  ASSERT_TRUE(core_.leases().allocate(second, pool_, 2 * MiB, 0).ok());
  core_.close_session(session_);
  core_.close_session(second);
  EXPECT_EQ(pool_stats_now().in_use_bytes, 0u);

  // The whole uid quota again, from two new sessions.
  auto third  = open(1000);
  auto fourth = open(1000);
  EXPECT_TRUE(core_.leases().allocate(third, pool_, 4 * MiB, 0).ok());
  EXPECT_TRUE(core_.leases().allocate(fourth, pool_, 2 * MiB, 0).ok());
  EXPECT_EQ(core_.leases().allocate(fourth, pool_, 256, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(QuotaTest, FreeingReleasesQuota)
{
  auto a = core_.leases().allocate(session_, pool_, 4 * MiB, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(core_.leases().free(session_, a->id).ok());
  EXPECT_TRUE(core_.leases().allocate(session_, pool_, 4 * MiB, 0).ok());
}

TEST_F(QuotaTest, APerUidOverrideWinsOverTheDefault)
{
  std::vector<session_id> sessions;
  for (int i = 0; i < 5; ++i) { sessions.push_back(open(1001)); }
  for (int i = 0; i < 4; ++i) {
    // 16 MiB in all: well past the 6 MiB default, up to the override.
    EXPECT_TRUE(
        core_.leases().allocate(sessions[static_cast<std::size_t>(i)], pool_, 4 * MiB, 0).ok())
        << i;
  }
  auto const before = fingerprint(core_);
  auto st           = core_.leases().allocate(sessions[4], pool_, 256, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("uid 1001"), HasSubstr("quota of 16777216 bytes")));
  EXPECT_EQ(fingerprint(core_), before);
}

/// Quotas count what the backend reserved, not what was asked.
class TightQuotaTest : public CoreWithPool {
 protected:
  TightQuotaTest()
      : CoreWithPool(
            quota_limits{.per_session_bytes = 1000, .per_uid_bytes = 0, .per_uid_overrides = {}})
  {
  }
};

TEST_F(TightQuotaTest, ARequestRoundedUpPastTheQuotaIsRefusedAndGivenBack)
{
  auto const before = fingerprint(core_);
  auto st =
      core_.leases().allocate(session_, pool_, 1000, 0).status();  // the backend reserves 1024
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("1000 bytes"), HasSubstr("rounded up to 1024 bytes")));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(backend_->live_blocks(), 0u);  // the block went back to the backend
  EXPECT_TRUE(core_.leases().allocate(session_, pool_, 768, 0).ok());
}

// ---------------------------------------------------------------------------
// Pool limits

class PoolLimitTest : public CoreWithPool {
 protected:
  PoolLimitTest() : CoreWithPool({}, 2 * MiB) {}
};

TEST_F(PoolLimitTest, ThePoolLimitIsResourceExhausted)
{
  EXPECT_EQ(core_.pools().list()[0].capacity_bytes, 2 * MiB);
  ASSERT_TRUE(core_.leases().allocate(session_, pool_, MiB + MiB / 2, 0).ok());
  auto const before = fingerprint(core_);
  auto st           = core_.leases().allocate(session_, pool_, MiB, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("pool 'host'"),
                    HasSubstr("1048576 bytes"),
                    HasSubstr("1572864 bytes of 2097152 bytes in use")));
  EXPECT_EQ(fingerprint(core_), before);
  EXPECT_EQ(backend_->live_blocks(), 1u);
  EXPECT_TRUE(
      core_.leases().allocate(session_, pool_, MiB / 2, 0).ok());  // exactly up to the limit
  // Beyond the limit is beyond this pool's capacity, however much the memfd holds.
  EXPECT_EQ(core_.leases().allocate(session_, pool_, 3 * MiB, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(DaemonCore, AFragmentedHostPoolIsResourceExhaustedNamingThePool)
{
  daemon_core core(allow_uids({1000}));
  auto pool = core.pools().add_pool(
      host_config("staging"), std::make_unique<backends::host::host_backend>("staging", 4096));
  auto s = core.sessions().open_session(peer(1000), "t", "")->id;
  std::vector<allocation_id> ids;
  for (int i = 0; i < 16; ++i) { ids.push_back(core.leases().allocate(s, pool, 256, 0)->id); }
  for (std::size_t i = 0; i < ids.size(); i += 2) {
    ASSERT_TRUE(core.leases().free(s, ids[i]).ok());
  }
  auto const before = fingerprint(core);
  auto st = core.leases().allocate(s, pool, 512, 0).status();  // 2 KiB free, in 256-byte pieces
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("pool 'staging'"), HasSubstr("512 bytes"), HasSubstr("fragmented")));
  EXPECT_EQ(fingerprint(core), before);
}

}  // namespace
}  // namespace rmmd::core
