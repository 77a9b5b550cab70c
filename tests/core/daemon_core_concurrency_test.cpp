// The core lets go of its lock while a backend allocates: other calls go on,
// the bytes asked for count against quotas and the pool meanwhile, and a
// session that closes during the call gets nothing and leaks nothing. The
// pools are real host_backends; one is wrapped to hold an allocation open,
// another to hold a trim open (a trim runs without the lock too).

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::size_t MiB = std::size_t{1} << 20;

peer_credentials peer(uid_t uid)
{
  return peer_credentials{.pid = 1234, .uid = uid, .gid = 100, .supplementary_gids = {}};
}

core_options options(quota_limits quotas = {})
{
  core_options o;
  o.access.uids = {1000};
  o.quotas      = std::move(quotas);
  return o;
}

pool_config host_config()
{
  return pool_config{.name = "host", .device = -1, .handle_types = {handle_type::host_offset}};
}

class CoreDuringAnAllocation : public ::testing::Test {
 protected:
  CoreDuringAnAllocation()
  {
    auto backend = std::make_unique<fake_pool_backend>(fake_pool_backend::options{});
    backend_     = backend.get();
    pool_        = core_.pools().add_pool(host_config(), std::move(backend));
    session_     = open();
  }

  session_id open()
  {
    auto grant = core_.sessions().open_session(peer(1000), "test", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  /// Starts an allocation of `bytes` for `session` on a thread, and returns
  /// once the backend holds it.
  std::future<absl::StatusOr<lease_grant>> start_held(session_id session, std::size_t bytes)
  {
    auto entered = backend_->hold_next(fake_pool_backend::call::allocate);
    auto result  = std::async(std::launch::async, [this, session, bytes] {
      return core_.leases().allocate(session, pool_, bytes, 0);
    });
    entered.wait();
    return result;
  }

  daemon_core core_{options(
      quota_limits{.per_session_bytes = 1 * MiB, .per_uid_bytes = 0, .per_uid_overrides = {}})};
  fake_pool_backend* backend_{};
  pool_id pool_{};
  session_id session_{};
};

TEST_F(CoreDuringAnAllocation, OtherCallsGoOnAndSeeTheBytesAlreadyCounted)
{
  auto held = start_held(session_, 768 * 1024);
  fake_pool_backend::gate_opener guard{backend_};
  // The core answers while the backend works: the request counts already.
  auto const stats = core_.pools().stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 768u * 1024);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);  // not a lease yet
  // ... so the session cannot overrun its quota with a second request.
  auto second = core_.leases().allocate(session_, pool_, 512 * 1024, 0);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("quota"));
  // Another session allocates and frees meanwhile.
  auto other  = open();
  auto theirs = core_.leases().allocate(other, pool_, 4096, 0);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_TRUE(core_.leases().free(other, theirs->id).ok());

  backend_->open_gate();
  auto grant = held.get();
  ASSERT_TRUE(grant.ok()) << grant.status();
  auto const after = core_.pools().stats();
  EXPECT_EQ(after.pools.at(0).in_use_bytes, 768u * 1024);
  EXPECT_EQ(after.pools.at(0).allocation_count, 1u);
  EXPECT_TRUE(core_.leases().free(session_, grant->id).ok());
  EXPECT_EQ(core_.pools().stats().pools.at(0).in_use_bytes, 0u);
}

TEST_F(CoreDuringAnAllocation, ASessionClosedMeanwhileGetsNothingAndLeaksNothing)
{
  auto held = start_held(session_, 4096);
  fake_pool_backend::gate_opener guard{backend_};
  core_.close_session(session_);
  backend_->open_gate();
  auto grant = held.get();
  EXPECT_EQ(grant.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(grant.status().message(), HasSubstr("closed"));
  EXPECT_EQ(backend_->deallocations(), 1);  // the block went back
  auto const stats = core_.pools().stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 0u);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);
  EXPECT_TRUE(stats.sessions.empty());
}

TEST_F(CoreDuringAnAllocation, AFreeLetsGoOfTheLockWhileTheBackendFrees)
{
  auto lease = core_.leases().allocate(session_, pool_, 256 * 1024, 0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto entered = backend_->hold_next(fake_pool_backend::call::deallocate);
  auto freeing =
      std::async(std::launch::async, [&] { return core_.leases().free(session_, lease->id); });
  entered.wait();
  fake_pool_backend::gate_opener guard{backend_};
  // The backend frees; the core answers meanwhile, and still counts the
  // bytes (the backend does not have them back yet) but not the lease.
  auto other = std::async(std::launch::async, [&] {
    auto session = open();
    auto theirs  = core_.leases().allocate(session, pool_, 4096, 0);
    return theirs.ok() && core_.leases().free(session, theirs->id).ok();
  });
  if (other.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    backend_->open_gate();  // before `other` waits for its call at the end of the scope
    FAIL() << "another session's calls waited for the backend's free";
  }
  EXPECT_TRUE(other.get());
  EXPECT_EQ(core_.pools().stats().pools.at(0).in_use_bytes, 256u * 1024);
  // Freed twice meanwhile: the ledger has it no more.
  EXPECT_EQ(core_.leases().free(session_, lease->id).code(), absl::StatusCode::kNotFound);
  backend_->open_gate();
  EXPECT_TRUE(freeing.get().ok());
  auto const stats = core_.pools().stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 0u);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);
  // The session's quota is whole again.
  auto again = core_.leases().allocate(session_, pool_, 1 * MiB, 0);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(CoreDuringAnAllocation, ASessionClosedDuringAFreeLeaksNothing)
{
  auto lease = core_.leases().allocate(session_, pool_, 4096, 0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto entered = backend_->hold_next(fake_pool_backend::call::deallocate);
  auto freeing =
      std::async(std::launch::async, [&] { return core_.leases().free(session_, lease->id); });
  entered.wait();
  fake_pool_backend::gate_opener guard{backend_};
  auto closing = std::async(std::launch::async, [&] { core_.close_session(session_); });
  if (closing.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    backend_->open_gate();
    FAIL() << "closing the session waited for the backend's free";
  }
  backend_->open_gate();
  EXPECT_TRUE(freeing.get().ok());
  EXPECT_EQ(backend_->deallocations(), 1);  // once, by the free
  auto const stats = core_.pools().stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 0u);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);
  EXPECT_TRUE(stats.sessions.empty());
}

TEST(CoreDuringATrim, AllocationsFreesAndStatsGoOnWhileABackendTrims)
{
  auto o      = options();
  o.admin_uid = 1000;
  daemon_core core(std::move(o));
  // A trim that waits until the test lets it go, as a CUDA pool's trim waits
  // for its stream; it then reports 3 MiB given back.
  auto backend =
      std::make_unique<fake_pool_backend>(fake_pool_backend::options{.capacity = 16 * MiB});
  backend->set_reserved(4 * MiB, 3 * MiB);
  auto* const trims = backend.get();
  auto const pool   = core.pools().add_pool(host_config(), std::move(backend));
  auto const admin  = core.sessions().open_session(peer(1000), "rmmctl", "").value().id;
  auto const user   = core.sessions().open_session(peer(1000), "worker", "").value().id;

  auto entered = trims->hold_next(fake_pool_backend::call::trim);
  auto trimmed = std::async(std::launch::async, [&] { return core.pools().trim(admin, {}); });
  std::future<absl::Status> work;
  fake_pool_backend::gate_opener guard{trims};  // last: released before the futures wait
  ASSERT_EQ(entered.wait_for(10s), std::future_status::ready) << "trim never reached the backend";

  // Another thread allocates and frees while the backend is still trimming.
  work = std::async(std::launch::async, [&]() -> absl::Status {
    auto grant = core.leases().allocate(user, pool, 64 * 1024, 0);
    if (!grant.ok()) { return grant.status(); }
    return core.leases().free(user, grant->id);
  });
  ASSERT_EQ(work.wait_for(10s), std::future_status::ready)
      << "an allocation waited for the trim: the core held its lock during the backend's trim";
  EXPECT_TRUE(work.get().ok());
  auto const stats = core.pools().stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 0u);
  EXPECT_EQ(stats.pools.at(0).total_allocations, 1u);
  EXPECT_EQ(trimmed.wait_for(0s), std::future_status::timeout)
      << "trim answered before its backend had finished";

  trims->open_gate();
  auto const result = trimmed.get();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->size(), 1u);
  EXPECT_EQ((*result)[0].pool, pool);
  EXPECT_EQ((*result)[0].name, "host");
  EXPECT_EQ((*result)[0].released_bytes, 3 * MiB);
  EXPECT_EQ((*result)[0].backend_reserved_before, 4 * MiB);
  EXPECT_EQ((*result)[0].backend_reserved_after, 1 * MiB);
}

TEST(CoreUnderLoad, ManyThreadsAllocatingAndFreeingKeepTheLedgerExact)
{
  daemon_core core(options(
      quota_limits{.per_session_bytes = 0, .per_uid_bytes = 2 * MiB, .per_uid_overrides = {}}));
  auto pool = core.pools().add_pool(
      host_config(), std::make_unique<backends::host::host_backend>("load", 16 * MiB));
  constexpr int threads = 8;
  std::vector<std::thread> workers;
  std::atomic<std::size_t> refused{0};
  std::atomic<bool> over_quota{false};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto session = core.sessions().open_session(peer(1000), "load", "").value().id;
      for (int i = 0; i < 300; ++i) {
        auto const bytes = std::size_t{64} * 1024 * static_cast<std::size_t>(1 + (i + t) % 8);
        auto grant       = core.leases().allocate(session, pool, bytes, 0);
        if (!grant.ok()) {
          EXPECT_EQ(grant.status().code(), absl::StatusCode::kResourceExhausted) << grant.status();
          ++refused;
          continue;
        }
        // The uid's quota holds at every moment, not only at the end.
        if (core.pools().stats().pools.at(0).in_use_bytes > 2 * MiB) { over_quota = true; }
        EXPECT_TRUE(core.leases().free(session, grant->id).ok());
      }
      core.close_session(session);
    });
  }
  for (auto& w : workers) { w.join(); }
  EXPECT_FALSE(over_quota.load());
  auto const stats = core.pools().stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 0u);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);
  EXPECT_TRUE(stats.sessions.empty());
  EXPECT_EQ(stats.pools.at(0).total_allocations, threads * 300 - refused.load());
}

}  // namespace
}  // namespace rmmd::core
