// daemon_core, packed leases: a small CUDA allocation asked for with may_pack
// is carved out of a block the daemon leases to that session alone; blocks
// are charged like leases, kept one empty per pool, retired (through the
// retire notifier) when more are empty or room is wanted, freed when the
// client drops them or the session ends. The backend stands in for a CUDA
// pool below the core (made-up addresses and export data, its calls
// counted): what is under test is the core's bookkeeping.

#include "daemon/core/daemon_core.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stop_token>
#include <thread>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::size_t KiB   = std::size_t{1} << 10;
constexpr std::size_t MiB   = std::size_t{1} << 20;
constexpr std::size_t block = default_pack_block_size;

struct retirement {
  session_id session;
  pool_id pool;
  std::vector<block_id> blocks;
};

class Packing : public ::testing::Test {
 protected:
  explicit Packing(std::size_t capacity                = 64 * MiB,
                   quota_limits quotas                 = {},
                   std::chrono::milliseconds pack_idle = std::chrono::hours(1))
      : core_(core_options{.access          = {.uids = {1000, 1001}, .gids = {}},
                           .quotas          = std::move(quotas),
                           .reclaim_timeout = 2s,
                           .pack_idle       = pack_idle})
  {
    auto owned = std::make_unique<fake_pool_backend>(
        fake_pool_backend::options{.capacity = capacity,
                                   .traits   = device_like_traits,
                                   .source   = fake_pool_backend::memory::made_up});
    backend_ = owned.get();
    pool_    = core_.pools().add_pool(
        pool_config{.name = "gpu0", .device = 0, .handle_types = {handle_type::posix_fd}},
        std::move(owned));
    core_.leases().set_retire_notifier(
        [this](session_id s, pool_id p, std::vector<block_id> const& ids) -> std::size_t {
          std::lock_guard lock(mutex_);
          if (socket_full_) {
            ++refused_sends_;  // as a session socket that refuses the datagram
            retired_changed_.notify_all();
            return 0;
          }
          retired_.push_back({s, p, ids});
          retired_changed_.notify_all();
          return ids.size();
        });
  }

  session_id open(uid_t uid = 1000)
  {
    auto grant =
        core_.sessions().open_session(peer_credentials{.pid = 1, .uid = uid, .gid = 100}, "t", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  lease_grant packed(session_id s, std::size_t bytes)
  {
    auto g = core_.leases().allocate(s, pool_, bytes, 0, reclaim_policy::refuse, true);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : lease_grant{};
  }

  pool_stats pool() const
  {
    return core_.pools().stats().pools.at(pool_);
  }
  session_info session(session_id id) const
  {
    for (auto const& s : core_.sessions().list()) {
      if (s.id == id) { return s; }
    }
    ADD_FAILURE() << "no session " << id;
    return {};
  }
  std::vector<retirement> retired() const
  {
    std::lock_guard lock(mutex_);
    return retired_;
  }
  /// `holder`'s client: drops the blocks it is first asked back, as the
  /// client library does.
  std::jthread drop_when_retired(session_id holder)
  {
    return std::jthread([this, holder](std::stop_token stop) {
      std::unique_lock lock(mutex_);
      if (!retired_changed_.wait(lock, stop, [&] { return !retired_.empty(); })) { return; }
      auto const ids = retired_.front().blocks;
      lock.unlock();
      EXPECT_TRUE(core_.leases().drop_blocks(holder, ids).ok());
    });
  }

  daemon_core core_;
  fake_pool_backend* backend_{};
  pool_id pool_{};
  mutable std::mutex mutex_;
  std::condition_variable_any retired_changed_;
  std::vector<retirement> retired_;
  bool socket_full_{false};      // under mutex_
  std::size_t refused_sends_{};  // under mutex_
};

TEST_F(Packing, SmallAllocationsOfOneSessionShareOneBlockExportedOnce)
{
  auto const s = open();
  auto a       = packed(s, 256);
  auto b       = packed(s, 1000);
  auto c       = packed(s, 64 * KiB);
  EXPECT_NE(a.packed_block, 0u);
  EXPECT_EQ(b.packed_block, a.packed_block);
  EXPECT_EQ(c.packed_block, a.packed_block);
  EXPECT_EQ(a.block.export_data, c.block.export_data) << "one export for the block";
  std::set<std::uint64_t> offsets{a.block_offset, b.block_offset, c.block_offset};
  EXPECT_EQ(offsets.size(), 3u);
  EXPECT_EQ(a.bytes, 256u);
  EXPECT_EQ(b.bytes, 1024u) << "rounded to 256 bytes, as the pool rounds";
  EXPECT_EQ(backend_->allocations(), 1u);
  // The block is what the session holds; the leases are counted one by one.
  EXPECT_EQ(pool().in_use_bytes, block);
  EXPECT_EQ(pool().allocation_count, 3u);
  EXPECT_EQ(session(s).bytes, block);
  EXPECT_EQ(session(s).allocation_count, 3u);
  EXPECT_EQ(session(s).idle_bytes, block - 256 - 1024 - 64 * KiB);
}

TEST_F(Packing, OnlySmallRequestsThatAskForItArePacked)
{
  auto const s = open();
  auto unasked = core_.leases().allocate(s, pool_, 256, 0);
  auto large   = core_.leases().allocate(s, pool_, 64 * KiB + 1, 0, reclaim_policy::refuse, true);
  auto aligned = core_.leases().allocate(s, pool_, 256, 4096, reclaim_policy::refuse, true);
  ASSERT_TRUE(unasked.ok() && large.ok() && aligned.ok());
  EXPECT_EQ(unasked->packed_block, 0u);
  EXPECT_EQ(large->packed_block, 0u);
  EXPECT_EQ(large->bytes, 64 * KiB + 256);
  // An alignment above the pool's 256 bytes goes to the backend unpacked
  // (the CUDA backend refuses it).
  EXPECT_EQ(aligned->packed_block, 0u);
  EXPECT_EQ(backend_->allocations(), 3u);
}

// A new kind of pool is its backend and its traits: the core packs by the
// traits, not by which kind it is, and describes the pool by them.
TEST(NewPoolKind, TheCoreGoesByItsBackendsTraits)
{
  core_options options;
  options.access = {.uids = {1000}, .gids = {}};
  daemon_core core(std::move(options));
  auto const device_unpacked = backend_traits{.name = "test-kind", .space = memory_space::device};
  auto owned                 = std::make_unique<fake_pool_backend>(
      fake_pool_backend::options{.capacity = 64 * MiB,
                                                 .traits   = device_unpacked,
                                                 .source   = fake_pool_backend::memory::made_up});
  auto* backend   = owned.get();
  auto const pool = core.pools().add_pool(
      pool_config{.name = "other", .device = 0, .handle_types = {handle_type::posix_fd}},
      std::move(owned));
  auto const described = core.pools().list().at(0).backend;
  EXPECT_EQ(described.name, "test-kind");
  EXPECT_EQ(described.space, memory_space::device);
  auto s =
      core.sessions().open_session(peer_credentials{.pid = 1, .uid = 1000, .gid = 100}, "t", "");
  auto small = core.leases().allocate(s->id, pool, 256, 0, reclaim_policy::refuse, true);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->packed_block, 0u);  // its traits do not pack
  EXPECT_EQ(backend->allocations(), 1u);
  EXPECT_EQ(core.pools().stats().pools.at(0).pool.backend.name, "test-kind");
}

TEST_F(Packing, SessionsNeverShareABlock)
{
  auto const s1 = open(1000);
  auto const s2 = open(1000);
  EXPECT_NE(packed(s1, 256).packed_block, packed(s2, 256).packed_block);
  EXPECT_EQ(backend_->allocations(), 2u);
}

TEST_F(Packing, AFullBlockLeadsToAnother)
{
  auto const s = open();
  std::set<block_id> blocks;
  for (int i = 0; i < 33; ++i) { blocks.insert(packed(s, 64 * KiB).packed_block); }
  EXPECT_EQ(blocks.size(), 2u) << "32 of 64 KiB fill a 2 MiB block";
  EXPECT_EQ(pool().in_use_bytes, 2 * block);
}

TEST_F(Packing, OneEmptyBlockStaysAndTheNextIsRetiredThenDropped)
{
  auto const s = open();
  std::vector<lease_grant> leases;
  for (int i = 0; i < 64; ++i) { leases.push_back(packed(s, 64 * KiB)); }
  auto const first  = leases.front().packed_block;
  auto const second = leases.back().packed_block;
  ASSERT_NE(first, second);
  for (auto const& l : leases) { ASSERT_TRUE(core_.leases().free(s, l.id).ok()); }
  // The first block to empty stays for the session's next allocations.
  ASSERT_EQ(retired().size(), 1u);
  EXPECT_EQ(retired()[0].session, s);
  EXPECT_EQ(retired()[0].pool, pool_);
  EXPECT_THAT(retired()[0].blocks, ::testing::ElementsAre(second));
  EXPECT_EQ(pool().allocation_count, 0u);
  EXPECT_EQ(pool().in_use_bytes, 2 * block) << "held until the client drops its import";
  EXPECT_EQ(pool().reclaimable_bytes, block) << "the empty block that stays";

  ASSERT_TRUE(core_.leases().drop_blocks(s, std::vector<block_id>{second}).ok());
  EXPECT_EQ(backend_->deallocations(), 1u);
  EXPECT_EQ(pool().in_use_bytes, block);
  EXPECT_EQ(session(s).bytes, block);

  // The block that stayed serves the next allocation.
  EXPECT_EQ(packed(s, 256).packed_block, first);
  EXPECT_EQ(backend_->allocations(), 2u);
}

TEST_F(Packing, ADropOfABlockNotRetiredOrNotHeldChangesNothing)
{
  auto const s     = open(1000);
  auto const other = open(1001);
  auto const l     = packed(s, 256);
  auto busy        = core_.leases().drop_blocks(s, std::vector<block_id>{l.packed_block});
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition) << busy;
  EXPECT_THAT(busy.message(), HasSubstr("has not retired it"));
  auto foreign = core_.leases().drop_blocks(other, std::vector<block_id>{l.packed_block});
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound) << foreign;
  auto unknown = core_.leases().drop_blocks(s, std::vector<block_id>{l.packed_block + 100});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_EQ(backend_->deallocations(), 0u);
  EXPECT_EQ(pool().in_use_bytes, block);
  EXPECT_TRUE(core_.leases().free(s, l.id).ok()) << "the lease is still there";
}

TEST_F(Packing, AClosingSessionGivesBackItsBlocksWithTheirLeases)
{
  auto const s = open();
  for (int i = 0; i < 40; ++i) { packed(s, 64 * KiB); }
  auto own = core_.leases().allocate(s, pool_, 1 * MiB, 0);
  ASSERT_TRUE(own.ok());
  core_.close_session(s);
  EXPECT_EQ(backend_->deallocations(), 3u) << "two blocks and the lease of its own";
  EXPECT_EQ(backend_->live_bytes(), 0u);
  EXPECT_EQ(pool().in_use_bytes, 0u);
  EXPECT_EQ(pool().allocation_count, 0u);
}

TEST_F(Packing, AHundredThousandLeasesTakeFewBlocksAndCloseAtOnce)
{
  auto const s = open();
  for (int i = 0; i < 100000; ++i) {
    auto g = core_.leases().allocate(s, pool_, 256, 0, reclaim_policy::refuse, true);
    ASSERT_TRUE(g.ok()) << g.status();
  }
  EXPECT_EQ(backend_->allocations(), 100000u * 256 / block + 1);
  EXPECT_EQ(pool().allocation_count, 100000u);
  core_.close_session(s);
  EXPECT_EQ(backend_->live_bytes(), 0u);
  EXPECT_EQ(pool().allocation_count, 0u);
}

class QuickIdle : public Packing {
 protected:
  QuickIdle() : Packing(64 * MiB, {}, 50ms) {}
};

TEST_F(QuickIdle, TheEmptyBlockThatStayedIsRetiredOnceIdle)
{
  auto const s = open();
  auto const l = packed(s, 256);
  ASSERT_TRUE(core_.leases().free(s, l.id).ok());
  auto const freed = std::chrono::steady_clock::now();
  {
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(retired_changed_.wait_for(lock, 5s, [&] { return !retired_.empty(); }));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - freed, 50ms);
  EXPECT_THAT(retired()[0].blocks, ::testing::ElementsAre(l.packed_block));
  EXPECT_EQ(pool().reclaimable_bytes, 0u) << "retired: asked for, no longer offered";
  ASSERT_TRUE(core_.leases().drop_blocks(s, retired()[0].blocks).ok());
  EXPECT_EQ(pool().in_use_bytes, 0u);
  EXPECT_EQ(backend_->live_bytes(), 0u);
}

TEST_F(QuickIdle, ABlockWhoseRetireCouldNotBeSentStaysTheSessionsAndIsAskedForAgain)
{
  auto const s = open();
  {
    std::lock_guard lock(mutex_);
    socket_full_ = true;
  }
  auto const l = packed(s, 256);
  ASSERT_TRUE(core_.leases().free(s, l.id).ok());
  {
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(retired_changed_.wait_for(lock, 5s, [&] { return refused_sends_ > 0; }))
        << "the idle-block sweeper did not try (50 ms idle)";
  }
  EXPECT_EQ(pool().reclaimable_bytes, block) << "not asked for: still offered";
  auto early = core_.leases().drop_blocks(s, std::vector<block_id>{l.packed_block});
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  auto const again = packed(s, 256);
  EXPECT_EQ(again.packed_block, l.packed_block) << "the session still carves from it";
  ASSERT_TRUE(core_.leases().free(s, again.id).ok());

  {
    std::unique_lock lock(mutex_);
    socket_full_ = false;
    ASSERT_TRUE(retired_changed_.wait_for(lock, 5s, [&] { return !retired_.empty(); }))
        << "the idle-block sweeper did not ask again";
  }
  EXPECT_THAT(retired()[0].blocks, ::testing::ElementsAre(l.packed_block));
  ASSERT_TRUE(core_.leases().drop_blocks(s, retired()[0].blocks).ok());
  EXPECT_EQ(pool().in_use_bytes, 0u);
  EXPECT_EQ(backend_->live_bytes(), 0u);
}

class SmallQuota : public Packing {
 protected:
  SmallQuota()
      : Packing(
            64 * MiB,
            quota_limits{.per_session_bytes = 1 * MiB, .per_uid_bytes = 0, .per_uid_overrides = {}})
  {
  }
};

TEST_F(SmallQuota, ARequestThatABlockWouldOverrunIsALeaseOfItsOwn)
{
  auto const s = open();
  auto const l = packed(s, 256);
  EXPECT_EQ(l.packed_block, 0u);
  EXPECT_EQ(session(s).bytes, 256u);
}

class SmallPool : public Packing {
 protected:
  SmallPool() : Packing(4 * MiB) {}
};

TEST_F(SmallPool, AWaitingRequestGetsTheRoomOfAnotherSessionsEmptyBlock)
{
  auto const holder = open(1000);
  auto const l      = packed(holder, 256);
  ASSERT_TRUE(core_.leases().free(holder, l.id).ok());
  ASSERT_TRUE(retired().empty()) << "its one empty block stays";
  EXPECT_EQ(pool().reclaimable_bytes, block);

  auto const client = drop_when_retired(holder);
  auto const asker  = open(1001);
  core_.leases().set_reclaim_notifier([](session_id, pool_id, std::size_t) {});
  auto big = core_.leases().allocate(asker, pool_, 3 * MiB, 0);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_EQ(retired().size(), 1u);
  EXPECT_EQ(retired()[0].session, holder);
  EXPECT_EQ(pool().reclaim_served, 1u);
}

// The ledger has room, the device does not (other processes took GPU memory
// after the daemon sized its pool): another session's empty block is asked
// back, and the request waits until it was dropped.
TEST_F(Packing, AWaitingRequestGetsAnEmptyBlocksRoomWhenTheDeviceIsShort)
{
  auto const holder = open(1000);
  auto const l      = packed(holder, 256);
  ASSERT_TRUE(core_.leases().free(holder, l.id).ok());
  ASSERT_TRUE(retired().empty()) << "its one empty block stays";
  backend_->set_device_limit(3 * MiB);  // 2 MiB of it in the holder's empty block

  auto const client = drop_when_retired(holder);
  auto const asker  = open(1001);
  core_.leases().set_reclaim_notifier([](session_id, pool_id, std::size_t) {});
  auto big = core_.leases().allocate(asker, pool_, 2 * MiB, 0);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_EQ(retired().size(), 1u);
  EXPECT_EQ(retired()[0].session, holder);
  EXPECT_EQ(pool().reclaim_refused, 0u);
}

}  // namespace
}  // namespace rmmd::core
