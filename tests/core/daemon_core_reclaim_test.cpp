// daemon_core, memory that moves: a request that finds its pool short while
// other sessions report idle slabs there asks them (through the reclaim
// notifier) to give those back and waits for the room, up to reclaim_timeout;
// one that idle slabs cannot serve is refused at once. The pool is a real
// host_backend; the "clients" are the test's own threads, answering the
// notifier as a slab client would (a Free of its slab, then a report).

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::size_t MiB       = std::size_t{1} << 20;
constexpr std::size_t pool_size = 64 * MiB;

peer_credentials peer(uid_t uid)
{
  return peer_credentials{.pid = 1234, .uid = uid, .gid = 100};
}

class Reclaim : public ::testing::Test {
 protected:
  explicit Reclaim(std::chrono::milliseconds timeout = 500ms, quota_limits quotas = {})
      : core_(core_options{.access          = {.uids = {1000, 1001, 1002}, .gids = {}},
                           .quotas          = std::move(quotas),
                           .reclaim_timeout = timeout})
  {
    pool_ = core_.pools().add_pool(
        pool_config{.name = "host", .device = -1, .handle_types = {handle_type::host_offset}},
        std::make_unique<backends::host::host_backend>("host", pool_size));
    core_.leases().set_reclaim_notifier([this](session_id s, pool_id p, std::size_t bytes) {
      std::lock_guard lock(mutex_);
      asked_.push_back({s, p, bytes});
      if (answer_) { answer_(s); }
    });
  }

  ~Reclaim() override
  {
    for (auto& t : answering_) { t.join(); }
  }

  session_id open(uid_t uid)
  {
    auto grant = core_.sessions().open_session(peer(uid), "test", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  /// A slab client: `session` leases one slab of `bytes` and carves `carved` of it.
  allocation_id hold_slab(session_id session, std::size_t bytes, std::size_t carved = 0)
  {
    auto lease = core_.leases().allocate(session, pool_, bytes, 0);
    EXPECT_TRUE(lease.ok()) << lease.status();
    auto reported =
        core_.leases().report_usage(session,
                                    {carved_usage{.pool              = pool_,
                                                  .bytes             = carved,
                                                  .allocation_count  = carved == 0 ? 0u : 1u,
                                                  .slab_bytes        = bytes,
                                                  .reclaimable_bytes = carved == 0 ? bytes : 0}});
    EXPECT_TRUE(reported.ok()) << reported.status();
    slabs_[session] = lease.ok() ? lease->id : 0;
    return slabs_[session];
  }

  /// Answers the notifier as a slab client does: on a thread of its own, it
  /// frees the session's idle slab and reports what is left (nothing).
  void answer_by_giving_back()
  {
    answer_ = [this](session_id s) {
      answering_.emplace_back([this, s] {
        EXPECT_TRUE(core_.leases().free(s, slabs_.at(s)).ok());
        EXPECT_TRUE(core_.leases().report_usage(s, {carved_usage{.pool = pool_}}).ok());
      });
    };
  }

  pool_stats pool_now() const
  {
    return core_.pools().stats().pools.at(0);
  }

  struct request {
    session_id session;
    pool_id pool;
    std::size_t bytes;
  };
  daemon_core core_;
  pool_id pool_{};
  std::mutex mutex_;
  std::vector<request> asked_;
  std::function<void(session_id)> answer_;
  std::vector<std::thread> answering_;
  std::map<session_id, allocation_id> slabs_;
};

TEST_F(Reclaim, AnAllocationOnlyOtherSessionsIdleSlabsCanServeSucceeds)
{
  auto a = open(1000), b = open(1001), c = open(1002);
  hold_slab(a, 32 * MiB);
  hold_slab(b, 32 * MiB);
  answer_by_giving_back();
  auto const start = std::chrono::steady_clock::now();
  auto lease       = core_.leases().allocate(c, pool_, 48 * MiB, 0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 400ms);
  {
    std::lock_guard lock(mutex_);
    ASSERT_EQ(asked_.size(), 2u);  // both were needed; never the requester
    for (auto const& r : asked_) {
      EXPECT_NE(r.session, c);
      EXPECT_EQ(r.pool, pool_);
      EXPECT_EQ(r.bytes, 48 * MiB);  // the pool was full
    }
  }
  auto stats = pool_now();
  EXPECT_EQ(stats.reclaim_waits, 1u);
  EXPECT_EQ(stats.reclaim_served, 1u);
  EXPECT_EQ(stats.reclaim_refused, 0u);
  EXPECT_EQ(stats.in_use_bytes, 48 * MiB);
}

TEST_F(Reclaim, OnlyAsManySessionsAsTheRoomNeedsAreAskedTheLargestFirst)
{
  auto a = open(1000), b = open(1001), c = open(1002);
  hold_slab(a, 16 * MiB);
  hold_slab(b, 48 * MiB);
  answer_by_giving_back();
  auto lease = core_.leases().allocate(c, pool_, 8 * MiB, 0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::lock_guard lock(mutex_);
  ASSERT_EQ(asked_.size(), 1u);
  EXPECT_EQ(asked_[0].session, b);
  EXPECT_EQ(asked_[0].bytes, 8 * MiB);
}

TEST_F(Reclaim, WhenTheSlabsThatCameBackAreNotOneRangeItAsksForMore)
{
  // Host pool, in order: A's slab, a direct lease, B's slab, C's slab. The
  // two largest slabs (A's and B's) make room in the ledger but no 24 MiB
  // range; C's makes one with B's.
  auto a = open(1000), b = open(1001), c = open(1002), d = open(1000);
  hold_slab(a, 16 * MiB);
  ASSERT_TRUE(core_.leases().allocate(d, pool_, 8 * MiB, 0).ok());
  hold_slab(b, 16 * MiB);
  hold_slab(c, 8 * MiB);
  answer_by_giving_back();
  auto lease = core_.leases().allocate(d, pool_, 24 * MiB, 0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  {
    std::lock_guard lock(mutex_);
    ASSERT_EQ(asked_.size(), 3u);
    EXPECT_EQ(asked_[2].session, c);
  }
  auto stats = pool_now();
  EXPECT_EQ(stats.reclaim_waits, 1u);
  EXPECT_EQ(stats.reclaim_served, 1u);
  EXPECT_EQ(stats.reclaim_refused, 0u);
}

TEST_F(Reclaim, ARequestIdleSlabsCannotServeIsRefusedAtOnceAsBefore)
{
  auto a = open(1000), b = open(1001), c = open(1002);
  hold_slab(a, 32 * MiB, 24 * MiB);  // 8 MiB idle, but carved: nothing reclaimable
  hold_slab(b, 16 * MiB);            // 16 MiB reclaimable, 16 MiB free
  auto const start = std::chrono::steady_clock::now();
  auto refused     = core_.leases().allocate(c, pool_, 48 * MiB, 0);  // would need 32 MiB back
  EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("pool 'host'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("the pool has"));
  std::lock_guard lock(mutex_);
  EXPECT_TRUE(asked_.empty());
  EXPECT_EQ(pool_now().reclaim_waits, 0u);
  EXPECT_EQ(pool_now().in_use_bytes, 48 * MiB);
}

TEST_F(Reclaim, ASessionThatDoesNotAnswerCostsTheDeadlineThenTheSameRefusal)
{
  auto a = open(1000), c = open(1002);
  hold_slab(a, 60 * MiB);
  auto const start = std::chrono::steady_clock::now();
  auto refused     = core_.leases().allocate(c, pool_, 16 * MiB, 0);
  auto const took  = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 500ms);
  EXPECT_LT(took, 2s);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("the pool has"));
  auto stats = pool_now();
  EXPECT_EQ(stats.reclaim_waits, 1u);
  EXPECT_EQ(stats.reclaim_refused, 1u);
  EXPECT_EQ(stats.in_use_bytes, 60 * MiB);  // nothing changed
  EXPECT_EQ(stats.allocation_count, 1u);
}

TEST_F(Reclaim, HandingOffChangesNothingAndAsksNobody)
{
  auto a = open(1000), c = open(1002);
  hold_slab(a, 60 * MiB);
  auto held = core_.leases().allocate_or_hold(c, pool_, 16 * MiB, 0);
  EXPECT_TRUE(std::holds_alternative<reclaim_hold>(held));
  auto created =
      core_.buffers().create_buffer_or_hold(c, "team/x", pool_, 16 * MiB, buffer_options{});
  EXPECT_TRUE(std::holds_alternative<reclaim_hold>(created));
  // A request that idle slabs cannot serve is answered, not held.
  auto refused = core_.leases().allocate_or_hold(c, pool_, 128 * MiB, 0);
  ASSERT_TRUE(std::holds_alternative<absl::StatusOr<lease_grant>>(refused));
  EXPECT_EQ(std::get<absl::StatusOr<lease_grant>>(refused).status().code(),
            absl::StatusCode::kResourceExhausted);
  std::lock_guard lock(mutex_);
  EXPECT_TRUE(asked_.empty());
  EXPECT_EQ(pool_now().reclaim_waits, 0u);
  EXPECT_EQ(pool_now().in_use_bytes, 60 * MiB);
  EXPECT_TRUE(core_.buffers().all().empty());
}

TEST_F(Reclaim, ASharedBufferCreateWaitsForIdleSlabsToo)
{
  auto a = open(1000), c = open(1002);
  hold_slab(a, 60 * MiB);
  answer_by_giving_back();
  auto created =
      core_.buffers().create_buffer(c, "team/weights", pool_, 16 * MiB, buffer_options{});
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(pool_now().reclaim_served, 1u);
}

TEST_F(Reclaim, TheRequestersOwnIdleSlabsAreNotWaitedFor)
{
  // Its own calls are answered in order: it could not give them back while
  // this one waits.
  auto c = open(1002);
  hold_slab(c, 60 * MiB);
  auto refused = core_.leases().allocate(c, pool_, 16 * MiB, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  std::lock_guard lock(mutex_);
  EXPECT_TRUE(asked_.empty());
}

TEST_F(Reclaim, StatsShowIdleAndReclaimableBytesPerPoolAndSession)
{
  auto a = open(1000), b = open(1001);
  hold_slab(a, 16 * MiB, 4 * MiB);  // 12 MiB idle, not reclaimable
  hold_slab(b, 8 * MiB);            // 8 MiB idle and reclaimable
  auto stats = core_.pools().stats();
  EXPECT_EQ(stats.pools.at(0).idle_bytes, 20 * MiB);
  EXPECT_EQ(stats.pools.at(0).reclaimable_bytes, 8 * MiB);
  EXPECT_EQ(stats.pools.at(0).carved_bytes, 4 * MiB);
  for (auto const& s : stats.sessions) {
    EXPECT_EQ(s.idle_bytes, s.id == a ? 12 * MiB : 8 * MiB);
    EXPECT_EQ(s.reclaimable_bytes, s.id == a ? 0 : 8 * MiB);
  }
  // A slab given back before the next report is not counted idle.
  ASSERT_TRUE(core_.leases().free(b, slabs_.at(b)).ok());
  EXPECT_EQ(core_.pools().stats().pools.at(0).idle_bytes, 12 * MiB);
}

TEST_F(Reclaim, AReportThatContradictsItselfIsInvalidAndRecordsNothing)
{
  auto a = open(1000);
  hold_slab(a, 16 * MiB, 4 * MiB);
  auto bad = [&](carved_usage u, char const* says) {
    auto r = core_.leases().report_usage(a, {u});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << says;
    EXPECT_THAT(r.status().message(), HasSubstr(says));
  };
  bad({.pool = pool_, .bytes = 4 * MiB, .slab_bytes = 32 * MiB}, "the session holds");
  bad({.pool = pool_, .bytes = 8 * MiB, .slab_bytes = 4 * MiB}, "carves only from its slabs");
  bad({.pool = pool_, .bytes = 4 * MiB, .slab_bytes = 16 * MiB, .reclaimable_bytes = 16 * MiB},
      "are not carved");
  auto stats = core_.pools().stats();
  EXPECT_EQ(stats.pools.at(0).idle_bytes, 12 * MiB);
  EXPECT_EQ(stats.pools.at(0).reclaimable_bytes, 0u);
}

class ReclaimOff : public Reclaim {
 protected:
  ReclaimOff() : Reclaim(0ms) {}
};

TEST_F(ReclaimOff, ATimeoutOfZeroRefusesAtOnce)
{
  auto a = open(1000), c = open(1002);
  hold_slab(a, 60 * MiB);
  EXPECT_EQ(core_.leases().allocate(c, pool_, 16 * MiB, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  std::lock_guard lock(mutex_);
  EXPECT_TRUE(asked_.empty());
}

class ReclaimWithQuota : public Reclaim {
 protected:
  ReclaimWithQuota()
      : Reclaim(
            500ms,
            quota_limits{.per_session_bytes = 8 * MiB, .per_uid_bytes = 0, .per_uid_overrides = {}})
  {
  }
};

TEST_F(ReclaimWithQuota, AQuotaRefusalNeverWaits)
{
  auto a = open(1000), c = open(1002);
  hold_slab(a, 8 * MiB);
  auto refused = core_.leases().allocate(c, pool_, 16 * MiB, 0);
  EXPECT_THAT(refused.status().message(), HasSubstr("quota"));
  std::lock_guard lock(mutex_);
  EXPECT_TRUE(asked_.empty());
}

TEST_F(Reclaim, ADrainEndsTheWait)
{
  auto a = open(1000), c = open(1002);
  hold_slab(a, 60 * MiB);
  std::thread drain([&] {
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (!asked_.empty()) { break; }
      }
      std::this_thread::yield();
    }
    core_.begin_drain();
  });
  auto const start = std::chrono::steady_clock::now();
  auto refused     = core_.leases().allocate(c, pool_, 16 * MiB, 0);
  drain.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 400ms);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace rmmd::core
