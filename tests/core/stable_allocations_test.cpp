// stable_registry: address-stable allocations, sleep and wake, kept
// backups. The CUDA pool is fake_pool_backend (kind cuda: its stable memory
// is an empty memfd per allocation, counted against a device limit), one
// per tenant; the backups' host pool is a real host_backend (a memfd per
// backup). What these tests check is the ledger: charges to pools, sessions
// and uids, the refusals of DESIGN.md's error table that change nothing, and
// a wake that waits for room and fails naming who holds the pool.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::size_t MiB         = std::size_t{1} << 20;
constexpr std::size_t device_size = 64 * MiB;

peer_credentials peer(uid_t uid, pid_t pid = 1234)
{
  return peer_credentials{.pid = pid, .uid = uid, .gid = 100};
}

std::vector<std::string> tags(std::initializer_list<char const*> list)
{
  return {list.begin(), list.end()};
}

class StableAllocations : public ::testing::Test {
 protected:
  StableAllocations()
      : core_(core_options{.access = {.uids = {1000, 1001}, .gids = {}}, .quotas = {}})
  {
    gpu_ = core_.pools().add_pool(
        pool_config{.name = "gpu", .device = 0, .handle_types = {handle_type::posix_fd}},
        device_like_traits,
        device_size,
        [this](tenant_key const& t) {
          auto b = std::make_unique<fake_pool_backend>(
              fake_pool_backend::options{.capacity       = device_size,
                                         .traits         = device_like_traits,
                                         .source         = fake_pool_backend::memory::made_up,
                                         .stable_pieces  = stable_pieces_,
                                         .stable_returns = returns_});
          backends_[t] = b.get();
          return b;
        });
    host_ = core_.pools().add_pool(
        pool_config{.name = "host", .device = -1, .handle_types = {handle_type::host_offset}},
        host_like_traits,
        device_size,
        [](tenant_key const& t) {
          return std::make_unique<backends::host::host_backend>(
              "host", device_size, false, t.text());
        });
  }

  session_id open(uid_t uid, pid_t pid = 1234)
  {
    auto grant = core_.sessions().open_session(peer(uid, pid), "test", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  std::size_t in_use(pool_id pool) const
  {
    return core_.pools().stats().pools.at(pool).in_use_bytes;
  }

  std::size_t session_bytes(session_id id) const
  {
    for (auto const& s : core_.sessions().list()) {
      if (s.id == id) { return s.bytes; }
    }
    return 0;
  }

  stable_grant allocate(session_id s, std::size_t bytes, char const* tag)
  {
    auto g = core_.stables().allocate(s, gpu_, bytes, tag);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : stable_grant{};
  }

  /// Both steps of a sleep, as the client makes them.
  std::vector<stable_grant> sleep(session_id s,
                                  std::vector<std::string> const& t,
                                  bool backup      = false,
                                  std::string name = "")
  {
    auto chosen = core_.stables().begin_sleep(s, t, backup, name);
    EXPECT_TRUE(chosen.ok()) << chosen.status();
    if (!chosen.ok()) { return {}; }
    std::vector<stable_id> ids;
    for (auto const& g : *chosen) { ids.push_back(g.id); }
    auto done = core_.stables().finish_sleep(s, ids, false);
    EXPECT_TRUE(done.ok()) << done.status();
    return *chosen;
  }

  daemon_core core_;
  pool_id gpu_{};
  pool_id host_{};
  std::map<tenant_key, fake_pool_backend*> backends_;
  std::size_t stable_pieces_{1};  // what a backend made from now on makes allocations in
  std::shared_ptr<std::map<stable_return, int>> returns_ =
      std::make_shared<std::map<stable_return, int>>();
};

TEST_F(StableAllocations, AllocationIsChargedLikeALeaseAndFreedWhole)
{
  auto s = open(1000);
  auto g = allocate(s, 3 * MiB, "weights");
  EXPECT_EQ(g.size, 3 * MiB);
  EXPECT_EQ(g.bytes, 4 * MiB);  // the driver's granularity
  EXPECT_TRUE(g.awake);
  EXPECT_EQ(in_use(gpu_), 4 * MiB);
  EXPECT_EQ(session_bytes(s), 4 * MiB);
  auto fds = core_.stables().fds(s, std::vector<stable_id>{g.id}, false);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_GE(fds->front(), 0);
  ASSERT_TRUE(core_.stables().free(s, g.id).ok());
  EXPECT_EQ(in_use(gpu_), 0u);
  EXPECT_EQ(session_bytes(s), 0u);
  EXPECT_EQ(backends_.at(tenant_key{tenant_key::kind::uid, 1000})->live_stable(), 0u);
}

TEST_F(StableAllocations, BadRequestsAreRefusedPreciselyAndChangeNothing)
{
  auto s       = open(1000);
  auto const g = allocate(s, MiB, "kv");
  auto before  = in_use(gpu_);
  auto code    = [](auto const& r) { return r.status().code(); };

  EXPECT_EQ(code(core_.stables().allocate(s, gpu_, MiB, "")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().allocate(s, gpu_, MiB, std::string(200, 'x'))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().allocate(s, gpu_, MiB, "bad\ttag")),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().allocate(s, gpu_, 0, "kv")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().allocate(s, 7, MiB, "kv")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().allocate(s, gpu_, 2 * device_size, "kv")),
            absl::StatusCode::kResourceExhausted);
  auto host = core_.stables().allocate(s, host_, MiB, "kv");
  EXPECT_EQ(code(host), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(host.status().message()), HasSubstr("CUDA pool"));
  EXPECT_EQ(code(core_.stables().allocate(999, gpu_, MiB, "kv")),
            absl::StatusCode::kUnauthenticated);

  // Sleep and wake refusals.
  EXPECT_EQ(code(core_.stables().begin_sleep(s, tags({""}), false, "")),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().begin_sleep(s, tags({"kv"}), false, "engine-0")),
            absl::StatusCode::kInvalidArgument);  // a name needs a backup
  EXPECT_EQ(code(core_.stables().begin_sleep(s, tags({"kv"}), true, "/bad name")),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().finish_sleep(s, std::vector<stable_id>{g.id + 100}, false)),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(code(core_.stables().finish_sleep(s, std::vector<stable_id>{g.id}, true)),
            absl::StatusCode::kFailedPrecondition);  // nothing to cancel
  EXPECT_EQ(code(core_.stables().wake(s, {}, std::vector<stable_id>{g.id}, {})),
            absl::StatusCode::kFailedPrecondition);  // awake
  EXPECT_EQ(code(core_.stables().finish_wake(s, std::vector<stable_id>{g.id + 100})),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(code(core_.stables().fds(s, std::vector<stable_id>(251, g.id), false)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(core_.stables().fds(s, std::vector<stable_id>{g.id}, true)),
            absl::StatusCode::kFailedPrecondition);  // no backup
  EXPECT_EQ(code(core_.stables().restore(s, "nobody")), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(core_.stables().drop_backups(s, "nobody")), absl::StatusCode::kNotFound);

  // Another session sees none of it.
  auto other = open(1001);
  EXPECT_EQ(core_.stables().free(other, g.id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(core_.stables().fds(other, std::vector<stable_id>{g.id}, false)),
            absl::StatusCode::kNotFound);

  EXPECT_EQ(in_use(gpu_), before);
  EXPECT_EQ(in_use(host_), 0u);
  auto held = core_.stables().held_by(s);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_TRUE(held.front().awake);
  EXPECT_FALSE(held.front().has_backup);
}

TEST_F(StableAllocations, MemoryInPiecesReachesOnlyAClientThatMapsThemWithAnFdEach)
{
  stable_pieces_ = 3;
  auto s         = open(1000);
  auto one       = core_.stables().allocate(s, gpu_, 6 * MiB, "kv");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->pieces.empty());  // one piece: the client maps one
  auto fds = core_.stables().fds(s, std::vector<stable_id>{one->id}, false);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(fds->size(), 1u);

  auto three = core_.stables().allocate(s, gpu_, 6 * MiB, "kv", max_stable_pieces);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->pieces, (std::vector<std::size_t>{2 * MiB, 2 * MiB, 2 * MiB}));
  EXPECT_EQ(three->bytes, 6 * MiB);
  EXPECT_EQ(in_use(gpu_), 12 * MiB);  // charged whole, whatever its pieces
  fds = core_.stables().fds(s, std::vector<stable_id>{one->id, three->id}, false);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(fds->size(), 4u);  // in order: one's, then three's three
  // 84 x 3 fds do not fit one call, although 84 ids would.
  auto too_many = core_.stables().fds(s, std::vector<stable_id>(84, three->id), false);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.status().message(), HasSubstr("252 fds"));

  // A wake says its new memory's pieces, for a client that maps them.
  ASSERT_EQ(sleep(s, {"kv"}).size(), 2u);
  auto woken = core_.stables().wake(s,
                                    {},
                                    std::vector<stable_id>{three->id},
                                    std::chrono::steady_clock::now(),
                                    max_stable_pieces);
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(woken->front().pieces.size(), 3u);
  woken = core_.stables().wake(
      s, {}, std::vector<stable_id>{one->id}, std::chrono::steady_clock::now());
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_TRUE(woken->front().pieces.empty());
  ASSERT_TRUE(core_.stables().free(s, three->id).ok());
  ASSERT_TRUE(core_.stables().free(s, one->id).ok());
  EXPECT_EQ(in_use(gpu_), 0u);
  // Every piece went back (the tenant's backend goes with its last session).
  EXPECT_EQ(backends_.at(tenant_key{tenant_key::kind::uid, 1000})->live_stable(), 0u);
  core_.close_session(s);
}

TEST_F(StableAllocations, OnlyMemoryItsClientUnmappedMayServeItsUidAgain)
{
  auto s     = open(1000);
  auto freed = allocate(s, 2 * MiB, "kv");
  auto slept = allocate(s, 2 * MiB, "kv");
  auto kept  = allocate(s, 2 * MiB, "weights");
  // A free and a sleep come after the client unmapped: reusable.
  ASSERT_TRUE(core_.stables().free(s, freed.id).ok());
  ASSERT_EQ(sleep(s, {"kv"}).size(), 1u);
  EXPECT_EQ((*returns_)[stable_return::reusable], 2);
  EXPECT_EQ((*returns_)[stable_return::to_driver], 0);
  // A session's end may leave its process mapping it (dying, or
  // reconnecting with its mappings): to the driver.
  core_.close_session(s);
  EXPECT_EQ((*returns_)[stable_return::to_driver], 1);
  EXPECT_EQ((*returns_)[stable_return::reusable], 2);
  (void)slept;
  (void)kept;
}

TEST_F(StableAllocations, SleepReleasesTheMemoryAndWakeMakesItAgain)
{
  auto s       = open(1000);
  auto kv      = allocate(s, 8 * MiB, "kv");
  auto w       = allocate(s, 4 * MiB, "weights");
  auto& device = *backends_.at(tenant_key{tenant_key::kind::uid, 1000});

  auto chosen = core_.stables().begin_sleep(s, tags({"kv"}), false, "");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_EQ(chosen->size(), 1u);
  EXPECT_EQ(chosen->front().id, kv.id);
  EXPECT_EQ(in_use(gpu_), 12 * MiB);  // nothing released before the client is done
  auto released = core_.stables().finish_sleep(s, std::vector<stable_id>{kv.id}, false);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(*released, 8 * MiB);
  EXPECT_EQ(in_use(gpu_), 4 * MiB);  // the ledger shows it free
  EXPECT_EQ(device.live_stable(), 1u);
  EXPECT_EQ(core_.stables().totals().sleeping_bytes, 8 * MiB);
  auto sleepers = core_.stables().sleepers();
  ASSERT_EQ(sleepers.size(), 1u);
  EXPECT_EQ(sleepers[0].session, s);
  EXPECT_EQ(sleepers[0].tags, tags({"kv"}));
  EXPECT_EQ(sleepers[0].awake_bytes, 4 * MiB);

  auto woken = core_.stables().wake(s, tags({"kv"}), {}, std::chrono::steady_clock::now());
  ASSERT_TRUE(woken.ok()) << woken.status();
  ASSERT_EQ(woken->size(), 1u);
  EXPECT_EQ(woken->front().id, kv.id);  // the same allocation, new memory
  EXPECT_EQ(woken->front().bytes, 8 * MiB);
  EXPECT_EQ(in_use(gpu_), 12 * MiB);
  EXPECT_EQ(device.live_stable(), 2u);
  EXPECT_TRUE(core_.stables().sleepers().empty());

  // Empty tags: every tag. Then the session's end frees it all.
  EXPECT_EQ(sleep(s, {}).size(), 2u);
  EXPECT_EQ(in_use(gpu_), 0u);
  EXPECT_TRUE(core_.stables().wake(s, {}, {}, std::chrono::steady_clock::now()).ok());
  core_.close_session(s);
  EXPECT_EQ(in_use(gpu_), 0u);
  EXPECT_EQ(core_.stables().totals().awake_bytes, 0u);
  (void)w;
}

TEST_F(StableAllocations, HostBackupsAreChargedToTheHostPoolUntilTheWakeIsDone)
{
  auto s      = open(1000);
  auto w      = allocate(s, 6 * MiB, "weights");
  auto chosen = core_.stables().begin_sleep(s, tags({"weights"}), true, "");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_TRUE(chosen->front().has_backup);
  EXPECT_EQ(in_use(host_), 6 * MiB);
  auto fds = core_.stables().fds(s, std::vector<stable_id>{w.id}, true);
  ASSERT_TRUE(fds.ok()) << fds.status();
  struct stat st {};
  ASSERT_EQ(::fstat(fds->front(), &st), 0);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), 6 * MiB);  // room for every byte
  ASSERT_TRUE(core_.stables().finish_sleep(s, std::vector<stable_id>{w.id}, false).ok());
  EXPECT_EQ(in_use(gpu_), 0u);
  EXPECT_EQ(in_use(host_), 6 * MiB);
  EXPECT_EQ(core_.stables().totals().backup_bytes, 6 * MiB);

  auto woken = core_.stables().wake(s, {}, {}, std::chrono::steady_clock::now());
  ASSERT_TRUE(woken.ok());
  EXPECT_TRUE(woken->front().has_backup);  // to restore from
  EXPECT_TRUE(core_.stables().fds(s, std::vector<stable_id>{w.id}, true).ok());
  auto dropped = core_.stables().finish_wake(s, std::vector<stable_id>{w.id});
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 6 * MiB);
  EXPECT_EQ(in_use(host_), 0u);
  EXPECT_EQ(in_use(gpu_), 6 * MiB);

  // A begun sleep called off keeps the memory and drops the backup.
  ASSERT_TRUE(core_.stables().begin_sleep(s, {}, true, "").ok());
  EXPECT_EQ(in_use(host_), 6 * MiB);
  ASSERT_TRUE(core_.stables().finish_sleep(s, std::vector<stable_id>{w.id}, true).ok());
  EXPECT_EQ(in_use(host_), 0u);
  EXPECT_EQ(in_use(gpu_), 6 * MiB);
  EXPECT_TRUE(core_.stables().held_by(s).front().awake);
}

TEST_F(StableAllocations, AWakeThatKeepsTheBackupsLeavesTheirRoomForTheNextSleep)
{
  auto s     = open(1000);
  auto w     = allocate(s, 6 * MiB, "weights");
  auto first = core_.stables().begin_sleep(s, tags({"weights"}), true, "");
  ASSERT_TRUE(first.ok()) << first.status();
  auto const serial = first->front().backup_serial;
  EXPECT_NE(serial, 0u);
  ASSERT_TRUE(core_.stables().finish_sleep(s, std::vector<stable_id>{w.id}, false).ok());
  ASSERT_TRUE(core_.stables().wake(s, {}, {}, std::chrono::steady_clock::now()).ok());
  auto dropped = core_.stables().finish_wake(s, std::vector<stable_id>{w.id}, true);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 0u);
  EXPECT_EQ(in_use(host_), 6 * MiB);  // still charged, awake beside its memory
  EXPECT_EQ(in_use(gpu_), 6 * MiB);
  EXPECT_TRUE(core_.stables().held_by(s).front().has_backup);

  // The next sleep with a backup copies into the same one: nothing new made.
  auto second = core_.stables().begin_sleep(s, tags({"weights"}), true, "");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->front().backup_serial, serial);
  EXPECT_EQ(in_use(host_), 6 * MiB);
  ASSERT_TRUE(core_.stables().finish_sleep(s, std::vector<stable_id>{w.id}, false).ok());
  ASSERT_TRUE(core_.stables().wake(s, {}, {}, std::chrono::steady_clock::now()).ok());
  ASSERT_TRUE(core_.stables().finish_wake(s, std::vector<stable_id>{w.id}, true).ok());

  // A sleep without a backup drops it; the next with one is a new backup.
  ASSERT_TRUE(core_.stables().begin_sleep(s, {}, false, "").ok());
  EXPECT_EQ(in_use(host_), 0u);
  ASSERT_TRUE(core_.stables().finish_sleep(s, std::vector<stable_id>{w.id}, false).ok());
  ASSERT_TRUE(core_.stables().wake(s, {}, {}, std::chrono::steady_clock::now()).ok());
  ASSERT_TRUE(core_.stables().finish_wake(s, std::vector<stable_id>{w.id}, true).ok());
  auto third = core_.stables().begin_sleep(s, {}, true, "");
  ASSERT_TRUE(third.ok());
  EXPECT_NE(third->front().backup_serial, serial);
  // Called off, and freed awake with its room: nothing left anywhere.
  ASSERT_TRUE(core_.stables().finish_sleep(s, std::vector<stable_id>{w.id}, true).ok());
  EXPECT_EQ(in_use(host_), 0u);
  ASSERT_TRUE(core_.stables().begin_sleep(s, {}, true, "").ok());
  ASSERT_TRUE(core_.stables().finish_sleep(s, std::vector<stable_id>{w.id}, false).ok());
  ASSERT_TRUE(core_.stables().wake(s, {}, {}, std::chrono::steady_clock::now()).ok());
  ASSERT_TRUE(core_.stables().finish_wake(s, std::vector<stable_id>{w.id}, true).ok());
  ASSERT_TRUE(core_.stables().free(s, w.id).ok());
  EXPECT_EQ(in_use(host_), 0u);
  EXPECT_EQ(in_use(gpu_), 0u);
}

TEST_F(StableAllocations, AnotherUidIsServedWhileTheOwnerSleepsAndTheWakeFailsNamingIt)
{
  auto owner = open(1000);
  auto other = open(1001);
  auto kv    = allocate(owner, 48 * MiB, "kv");
  sleep(owner, tags({"kv"}));
  // The other uid gets the freed memory.
  auto lent = core_.stables().allocate(other, gpu_, 40 * MiB, "trainer");
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(in_use(gpu_), 40 * MiB);

  auto const start = std::chrono::steady_clock::now();
  auto woken       = core_.stables().wake(owner, {}, {}, start + 100ms);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  ASSERT_EQ(woken.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(woken.status().message()), HasSubstr("uid 1001 holds 41943040 bytes"));
  EXPECT_THAT(std::string(woken.status().message()), HasSubstr("mapped nothing"));
  EXPECT_EQ(in_use(gpu_), 40 * MiB);  // nothing changed
  EXPECT_FALSE(core_.stables().held_by(owner).front().awake);
  EXPECT_EQ(core_.stables().totals().wake_failures, 1u);

  // A wake that waits while the other frees: served once it has.
  std::thread freeing([&] {
    // Once the wake waits for room (or after 5 s, and the wake fails).
    auto const until = std::chrono::steady_clock::now() + 5s;
    while (core_.stables().totals().wake_waits < 2 && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    EXPECT_TRUE(core_.stables().free(other, lent->id).ok());
  });
  auto later = core_.stables().wake(owner, {}, {}, std::chrono::steady_clock::now() + 5s);
  freeing.join();
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->front().id, kv.id);
  EXPECT_EQ(in_use(gpu_), 48 * MiB);
  EXPECT_EQ(core_.stables().totals().wake_waits, 2u);
  core_.close_session(owner);
  core_.close_session(other);
  EXPECT_EQ(in_use(gpu_), 0u);
}

TEST_F(StableAllocations, AWakeAsksIdleSlabsBackAndIsServedByThem)
{
  auto owner  = open(1000);
  auto slabby = open(1001);
  allocate(owner, 48 * MiB, "kv");
  sleep(owner, {});
  // A slab client of another uid leases the room and carves nothing of it.
  auto slab = core_.leases().allocate(slabby, gpu_, 40 * MiB, 0);
  ASSERT_TRUE(slab.ok()) << slab.status();
  ASSERT_TRUE(core_.leases()
                  .report_usage(slabby,
                                {carved_usage{.pool              = gpu_,
                                              .bytes             = 0,
                                              .allocation_count  = 0,
                                              .slab_bytes        = 40 * MiB,
                                              .reclaimable_bytes = 40 * MiB}})
                  .ok());
  std::vector<std::thread> answering;
  core_.leases().set_reclaim_notifier([&](session_id s, pool_id, std::size_t) {
    // As a slab client does: its Free, from its own thread.
    answering.emplace_back(
        [this, s, id = slab->id] { EXPECT_TRUE(core_.leases().free(s, id).ok()); });
  });
  auto woken = core_.stables().wake(owner, {}, {}, std::chrono::steady_clock::now() + 5s);
  for (auto& t : answering) { t.join(); }
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(answering.size(), 1u);
  EXPECT_EQ(in_use(gpu_), 48 * MiB);
  EXPECT_EQ(core_.stables().totals().wake_waits, 1u);
}

TEST_F(StableAllocations, WakeIsAllOrNoneWhenTheDeviceFailsHalfWay)
{
  auto s = open(1000);
  auto a = allocate(s, 2 * MiB, "kv");
  auto b = allocate(s, 2 * MiB, "kv");
  sleep(s, {});
  auto& device = *backends_.at(tenant_key{tenant_key::kind::uid, 1000});
  // The first allocation succeeds, the second finds the device full.
  device.set_device_limit(2 * MiB);
  auto woken = core_.stables().wake(s, {}, {}, std::chrono::steady_clock::now() + 30ms);
  ASSERT_EQ(woken.status().code(), absl::StatusCode::kResourceExhausted) << woken.status();
  EXPECT_EQ(device.live_stable(), 0u);
  EXPECT_EQ(in_use(gpu_), 0u);
  for (auto const& g : core_.stables().held_by(s)) { EXPECT_FALSE(g.awake); }
  device.set_device_limit(SIZE_MAX);
  EXPECT_TRUE(core_.stables().wake(s, {}, std::vector<stable_id>{a.id, b.id}, {}).ok());
}

TEST_F(StableAllocations, NamedBackupsOutliveTheirSessionAndAreRestoredByTheSameUid)
{
  auto first = open(1000, 11);
  auto w     = allocate(first, 4 * MiB, "weights");
  auto kv    = allocate(first, 8 * MiB, "kv");
  sleep(first, tags({"weights"}), true, "engine-0");
  sleep(first, tags({"kv"}));  // no backup: goes with the session
  // While the session lives, the name is its own.
  auto second = open(1000, 12);
  EXPECT_EQ(core_.stables().restore(second, "engine-0").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_.stables().begin_sleep(second, {}, true, "engine-0").status().code(),
            absl::StatusCode::kAlreadyExists);

  core_.close_session(first);  // a crash while asleep
  EXPECT_EQ(in_use(gpu_), 0u);
  EXPECT_EQ(in_use(host_), 4 * MiB);  // the backup stays, charged to the uid's host pool
  auto totals = core_.stables().totals();
  EXPECT_EQ(totals.kept_backup_names, 1u);
  EXPECT_EQ(totals.sleeping_allocations, 1u);
  auto sleepers = core_.stables().sleepers();
  ASSERT_EQ(sleepers.size(), 1u);
  EXPECT_EQ(sleepers[0].session, 0u);
  EXPECT_EQ(sleepers[0].backup_name, "engine-0");
  EXPECT_EQ(sleepers[0].backup_bytes, 4 * MiB);

  auto stranger = open(1001);
  EXPECT_EQ(core_.stables().restore(stranger, "engine-0").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(core_.stables().drop_backups(stranger, "engine-0").status().code(),
            absl::StatusCode::kNotFound);

  auto restored = core_.stables().restore(second, "engine-0");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  EXPECT_EQ(restored->front().tag, "weights");
  EXPECT_TRUE(restored->front().has_backup);
  EXPECT_FALSE(restored->front().awake);
  EXPECT_EQ(session_bytes(second), 4 * MiB);  // the backup, now this session's
  auto ids   = std::vector<stable_id>{restored->front().id};
  auto woken = core_.stables().wake(second, {}, ids, {});
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_TRUE(core_.stables().fds(second, ids, true).ok());
  ASSERT_TRUE(core_.stables().finish_wake(second, ids).ok());
  EXPECT_EQ(in_use(host_), 0u);
  EXPECT_EQ(in_use(gpu_), 4 * MiB);
  core_.close_session(second);
  core_.close_session(stranger);
  EXPECT_EQ(in_use(gpu_), 0u);
  EXPECT_EQ(in_use(host_), 0u);
  (void)w;
  (void)kv;
}

TEST_F(StableAllocations, ASleepByIdsTakesExactlyThose)
{
  auto s      = open(1000);
  auto mine   = allocate(s, 2 * MiB, "kv");
  auto other  = allocate(s, 2 * MiB, "kv");  // another resource's, same session and tag
  auto ids    = std::vector<stable_id>{mine.id};
  auto chosen = core_.stables().begin_sleep(s, {}, false, "", ids);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_EQ(chosen->size(), 1u);
  EXPECT_EQ(chosen->front().id, mine.id);
  ASSERT_TRUE(core_.stables().finish_sleep(s, ids, false).ok());
  EXPECT_EQ(in_use(gpu_), 2 * MiB);
  EXPECT_EQ(core_.stables().begin_sleep(s, {}, false, "", ids).status().code(),
            absl::StatusCode::kFailedPrecondition);  // asleep already
  auto unknown = std::vector<stable_id>{other.id + 100};
  EXPECT_EQ(core_.stables().begin_sleep(s, {}, false, "", unknown).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_.stables().held_by(s).back().awake);
}

TEST_F(StableAllocations, TheGpusLedgerCountsAwakeMemoryAndNotWhatSleeps)
{
  core_.pools().set_driver_usage_source([](int) { return std::optional<std::size_t>(40 * MiB); });
  auto gpu_memory = [&] {
    auto const stats = core_.pools().stats();
    EXPECT_EQ(stats.gpu_memory.size(), 1u);
    return stats.gpu_memory.empty() ? gpu_memory_use{} : stats.gpu_memory.front();
  };
  auto s = open(1000);
  allocate(s, 6 * MiB, "weights");
  allocate(s, 2 * MiB, "kv");
  EXPECT_EQ(gpu_memory().ledger_bytes, 8 * MiB);
  EXPECT_EQ(gpu_memory().unaccounted_bytes, 32 * MiB);
  sleep(s, tags({"kv"}));
  EXPECT_EQ(gpu_memory().ledger_bytes, 6 * MiB);
}

TEST_F(StableAllocations, KeptBackupsAreDroppedByName)
{
  auto s = open(1000);
  allocate(s, 2 * MiB, "weights");
  sleep(s, {}, true, "engine-1");
  core_.close_session(s);
  EXPECT_EQ(in_use(host_), 2 * MiB);
  auto again   = open(1000);
  auto dropped = core_.stables().drop_backups(again, "engine-1");
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 2 * MiB);
  EXPECT_EQ(in_use(host_), 0u);
  EXPECT_TRUE(core_.stables().sleepers().empty());
}

}  // namespace
}  // namespace rmmd::core
