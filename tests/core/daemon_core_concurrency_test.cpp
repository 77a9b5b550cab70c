// The core lets go of its lock while a backend allocates: other calls go on,
// the bytes asked for count against quotas and the pool meanwhile, and a
// session that closes during the call gets nothing and leaks nothing. The
// pools are real host_backends; one is wrapped to hold an allocation open.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;

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

/// A host_backend whose allocate() waits, once armed, until the test opens
/// the gate: an allocation held in the middle, as a slow CUDA export would be.
class gated_backend final : public pool_backend {
 public:
  explicit gated_backend(std::size_t bytes) : inner_("gated", bytes) {}

  backend_kind kind() const noexcept override
  {
    return inner_.kind();
  }
  std::size_t capacity() const noexcept override
  {
    return inner_.capacity();
  }
  absl::StatusOr<backend_allocation> allocate(std::size_t bytes, std::size_t alignment) override
  {
    if (armed_.exchange(false)) {
      entered_.set_value();
      gate_.wait();
    }
    return inner_.allocate(bytes, alignment);
  }
  void deallocate(backend_allocation const& block) noexcept override
  {
    ++deallocations;
    inner_.deallocate(block);
  }

  /// The next allocate() stops until open() is called; returns a future
  /// that is ready once it has stopped there.
  std::future<void> arm()
  {
    entered_   = {};
    opened_    = {};
    gate_      = opened_.get_future().share();
    open_done_ = false;
    armed_     = true;
    return entered_.get_future();
  }
  /// Lets the held allocate() go on (once; later calls do nothing).
  void open()
  {
    if (!open_done_.exchange(true)) { opened_.set_value(); }
  }

  /// Opens the gate when it goes out of scope, so that a failed assertion
  /// cannot leave a thread waiting at it (and the test hanging in std::future).
  struct open_at_exit {
    gated_backend* backend;
    ~open_at_exit()
    {
      backend->open();
    }
  };

  std::atomic<int> deallocations{0};

 private:
  backends::host::host_backend inner_;
  std::atomic<bool> armed_{false};
  std::atomic<bool> open_done_{false};
  std::promise<void> entered_;
  std::promise<void> opened_;
  std::shared_future<void> gate_;
};

class CoreDuringAnAllocation : public ::testing::Test {
 protected:
  CoreDuringAnAllocation()
  {
    auto backend = std::make_unique<gated_backend>(64 * MiB);
    backend_     = backend.get();
    pool_        = core_.add_pool(host_config(), std::move(backend));
    session_     = open();
  }

  session_id open()
  {
    auto grant = core_.open_session(peer(1000), "test", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  /// Starts an allocation of `bytes` for `session` on a thread, and returns
  /// once the backend holds it.
  std::future<absl::StatusOr<lease_grant>> start_held(session_id session, std::size_t bytes)
  {
    auto entered = backend_->arm();
    auto result  = std::async(std::launch::async, [this, session, bytes] {
      return core_.allocate(session, pool_, bytes, 0);
    });
    entered.wait();
    return result;
  }

  daemon_core core_{options(
      quota_limits{.per_session_bytes = 1 * MiB, .per_uid_bytes = 0, .per_uid_overrides = {}})};
  gated_backend* backend_{};
  pool_id pool_{};
  session_id session_{};
};

TEST_F(CoreDuringAnAllocation, OtherCallsGoOnAndSeeTheBytesAlreadyCounted)
{
  auto held = start_held(session_, 768 * 1024);
  gated_backend::open_at_exit guard{backend_};
  // The core answers while the backend works: the request counts already.
  auto const stats = core_.stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 768u * 1024);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);  // not a lease yet
  // ... so the session cannot overrun its quota with a second request.
  auto second = core_.allocate(session_, pool_, 512 * 1024, 0);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("quota"));
  // Another session allocates and frees meanwhile.
  auto other  = open();
  auto theirs = core_.allocate(other, pool_, 4096, 0);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_TRUE(core_.free(other, theirs->id, {}).ok());

  backend_->open();
  auto grant = held.get();
  ASSERT_TRUE(grant.ok()) << grant.status();
  auto const after = core_.stats();
  EXPECT_EQ(after.pools.at(0).in_use_bytes, 768u * 1024);
  EXPECT_EQ(after.pools.at(0).allocation_count, 1u);
  EXPECT_TRUE(core_.free(session_, grant->id, {}).ok());
  EXPECT_EQ(core_.stats().pools.at(0).in_use_bytes, 0u);
}

TEST_F(CoreDuringAnAllocation, ASessionClosedMeanwhileGetsNothingAndLeaksNothing)
{
  auto held = start_held(session_, 4096);
  gated_backend::open_at_exit guard{backend_};
  core_.close_session(session_);
  backend_->open();
  auto grant = held.get();
  EXPECT_EQ(grant.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(grant.status().message(), HasSubstr("closed"));
  EXPECT_EQ(backend_->deallocations.load(), 1);  // the block went back
  auto const stats = core_.stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 0u);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);
  EXPECT_TRUE(stats.sessions.empty());
}

TEST(CoreUnderLoad, ManyThreadsAllocatingAndFreeingKeepTheLedgerExact)
{
  daemon_core core(options(
      quota_limits{.per_session_bytes = 0, .per_uid_bytes = 2 * MiB, .per_uid_overrides = {}}));
  auto pool             = core.add_pool(host_config(),
                            std::make_unique<backends::host::host_backend>("load", 16 * MiB));
  constexpr int threads = 8;
  std::vector<std::thread> workers;
  std::atomic<std::size_t> refused{0};
  std::atomic<bool> over_quota{false};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto session = core.open_session(peer(1000), "load", "").value().id;
      for (int i = 0; i < 300; ++i) {
        auto const bytes = std::size_t{64} * 1024 * static_cast<std::size_t>(1 + (i + t) % 8);
        auto grant       = core.allocate(session, pool, bytes, 0);
        if (!grant.ok()) {
          EXPECT_EQ(grant.status().code(), absl::StatusCode::kResourceExhausted) << grant.status();
          ++refused;
          continue;
        }
        // The uid's quota holds at every moment, not only at the end.
        if (core.stats().pools.at(0).in_use_bytes > 2 * MiB) { over_quota = true; }
        EXPECT_TRUE(core.free(session, grant->id, {}).ok());
      }
      core.close_session(session);
    });
  }
  for (auto& w : workers) { w.join(); }
  EXPECT_FALSE(over_quota.load());
  auto const stats = core.stats();
  EXPECT_EQ(stats.pools.at(0).in_use_bytes, 0u);
  EXPECT_EQ(stats.pools.at(0).allocation_count, 0u);
  EXPECT_TRUE(stats.sessions.empty());
  EXPECT_EQ(stats.pools.at(0).total_allocations, threads * 300 - refused.load());
}

}  // namespace
}  // namespace rmmd::core
