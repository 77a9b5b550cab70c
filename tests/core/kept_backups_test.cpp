// stable_registry's side of sleep backups that outlive the daemon
// (backup_keeper.hpp): the keeper hears of every allocation that falls
// asleep with a named host backup and of every such backup that goes (its
// wake finished, dropped by name, freed), never of unnamed ones; a stopped
// keeper hears nothing; adopted backups are kept under their names, charged
// to their uid and the host pool, restorable by that uid, and freed through
// their own release. The CUDA pool is fake_pool_backend, the host pool a
// real host_backend (a memfd per backup). The whole restart, with the real
// fd-store keeper and state file: tests/restart/kept_backups_restart_test.cpp.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using namespace std::chrono_literals;

constexpr std::size_t MiB   = std::size_t{1} << 20;
constexpr std::size_t space = 64 * MiB;
constexpr uid_t alice       = 1000;
constexpr uid_t bob         = 1001;

class recording_keeper final : public backup_keeper {
 public:
  void keep_backup(kept_backup const& b) noexcept override
  {
    struct stat st {};
    fds_valid = fds_valid && ::fstat(b.fd, &st) == 0 &&
                static_cast<std::size_t>(st.st_size) == b.backup_bytes;
    kept.push_back(b);
  }
  void forget_backup(stable_id id) noexcept override
  {
    forgotten.push_back(id);
  }
  bool wait_until_kept(std::chrono::steady_clock::time_point) noexcept override
  {
    ++waits;
    return true;
  }
  std::vector<kept_backup> kept;
  std::vector<stable_id> forgotten;
  int waits{0};
  bool fds_valid{true};
};

class KeptBackups : public ::testing::Test {
 protected:
  KeptBackups()
      : core_(std::make_unique<daemon_core>(core_options{
            .access = {.uids = {0, alice, bob}, .gids = {}},
            .quotas = {
                .per_session_bytes = 0, .per_uid_bytes = 12 * MiB, .per_uid_overrides = {}}}))
  {
    gpu_ = core_->pools().add_pool(
        pool_config{.name         = "gpu",
                    .device       = 0,
                    .gpu_uuid     = "GPU-test",
                    .handle_types = {handle_type::posix_fd}},
        device_like_traits,
        space,
        [](tenant_key const&) {
          return std::make_unique<fake_pool_backend>(
              fake_pool_backend::options{.capacity = space,
                                         .traits   = device_like_traits,
                                         .source   = fake_pool_backend::memory::made_up});
        });
    host_ = core_->pools().add_pool(
        pool_config{.name = "host", .device = -1, .handle_types = {handle_type::host_offset}},
        host_like_traits,
        space,
        [](tenant_key const& t) {
          return std::make_unique<backends::host::host_backend>("host", space, false, t.text());
        });
    core_->stables().set_backup_keeper(keeper_);
  }

  session_id open(uid_t uid, pid_t pid = 1234)
  {
    auto grant = core_->sessions().open_session(
        peer_credentials{.pid = pid, .uid = uid, .gid = 100}, "engine --serve", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  std::size_t in_use(pool_id pool) const
  {
    return core_->pools().stats().pools.at(pool).in_use_bytes;
  }

  stable_grant allocate(session_id s, std::size_t bytes, char const* tag)
  {
    auto g = core_->stables().allocate(s, gpu_, bytes, tag);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : stable_grant{};
  }

  /// Both steps of a sleep of `tags`, as the client makes them.
  void sleep(session_id s, std::vector<std::string> const& tags, bool backup, std::string name)
  {
    auto chosen = core_->stables().begin_sleep(s, tags, backup, name);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    std::vector<stable_id> ids;
    for (auto const& g : *chosen) { ids.push_back(g.id); }
    ASSERT_TRUE(core_->stables().finish_sleep(s, ids, false).ok());
  }

  /// A sealed memfd of `bytes` whose first byte is `mark`, as the fd store
  /// passes a backup back.
  static shared_allocation memfd(std::size_t bytes, char mark)
  {
    int fd = ::memfd_create("kept-backup", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    EXPECT_EQ(::pwrite(fd, &mark, 1, 0), 1);
    EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    return {.block = {.bytes = bytes}, .fd = fd, .host_memfd = true};
  }

  adopted_backup_spec adopted(std::string name, std::size_t bytes, char mark, int* released)
  {
    return adopted_backup_spec{.uid          = alice,
                               .gid          = 100,
                               .pid          = 77,
                               .command      = "engine --before",
                               .backup_name  = std::move(name),
                               .tag          = "weights",
                               .size         = bytes - 100,
                               .bytes        = bytes,
                               .pool         = gpu_,
                               .host_pool    = host_,
                               .asleep_since = std::chrono::system_clock::now() - 1h,
                               .memory       = memfd(bytes, mark),
                               .release      = [released](shared_allocation const& m) {
                                 ++*released;
                                 ::close(m.fd);
                               }};
  }

  std::shared_ptr<recording_keeper> keeper_ = std::make_shared<recording_keeper>();
  std::unique_ptr<daemon_core> core_;
  pool_id gpu_{};
  pool_id host_{};
};

TEST_F(KeptBackups, ANamedBackupIsKeptWhenItsAllocationSleepsAndForgottenWhenItsWakeIsDone)
{
  auto s = open(alice);
  auto w = allocate(s, 3 * MiB, "weights");
  allocate(s, 2 * MiB, "kv");
  sleep(s, {"kv"}, true, "");  // unnamed: goes with the session, never kept
  EXPECT_THAT(keeper_->kept, IsEmpty());
  EXPECT_EQ(keeper_->waits, 0);

  // A begun sleep called off keeps nothing.
  auto ids = std::vector<stable_id>{w.id};
  ASSERT_TRUE(core_->stables().begin_sleep(s, {}, true, "engine-0", ids).ok());
  ASSERT_TRUE(core_->stables().finish_sleep(s, ids, true).ok());
  EXPECT_THAT(keeper_->kept, IsEmpty());

  sleep(s, {"weights"}, true, "engine-0");
  ASSERT_EQ(keeper_->kept.size(), 1u);
  EXPECT_EQ(keeper_->waits, 1);  // the sleep answered once it was kept
  EXPECT_TRUE(keeper_->fds_valid);
  auto const& k = keeper_->kept[0];
  EXPECT_EQ(k.id, w.id);
  EXPECT_EQ(k.uid, alice);
  EXPECT_EQ(k.gid, 100u);
  EXPECT_EQ(k.pid, 1234);
  EXPECT_EQ(k.command, "engine --serve");
  EXPECT_EQ(k.backup_name, "engine-0");
  EXPECT_EQ(k.tag, "weights");
  EXPECT_EQ(k.size, 3 * MiB);
  EXPECT_EQ(k.bytes, 4 * MiB);  // the driver's granularity
  EXPECT_EQ(k.pool_name, "gpu");
  EXPECT_EQ(k.gpu_uuid, "GPU-test");
  EXPECT_EQ(k.host_pool_name, "host");
  EXPECT_EQ(k.backup_bytes, 4 * MiB);

  auto const weights = std::vector<std::string>{"weights"};
  auto woken         = core_->stables().wake(s, weights, {}, std::chrono::steady_clock::now() + 1s);
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_THAT(keeper_->forgotten, IsEmpty());  // until the client restored it
  ASSERT_TRUE(core_->stables().finish_wake(s, ids).ok());
  EXPECT_THAT(keeper_->forgotten, ElementsAre(w.id));
  EXPECT_EQ(keeper_->waits, 2);  // the wake answered once the keeper forgot it
  core_->close_session(s);
  EXPECT_THAT(keeper_->forgotten, ElementsAre(w.id));  // the unnamed one was never kept
}

TEST_F(KeptBackups, ASessionsEndKeepsWhatIsKeptAndADropOrAFreeForgetsIt)
{
  auto s = open(alice);
  auto a = allocate(s, 2 * MiB, "weights");
  auto b = allocate(s, 2 * MiB, "kv");
  sleep(s, {"weights"}, true, "engine-0");
  sleep(s, {"kv"}, true, "engine-1");
  ASSERT_EQ(keeper_->kept.size(), 2u);
  ASSERT_EQ(keeper_->waits, 2);
  ASSERT_TRUE(core_->stables().free(s, b.id).ok());  // freed asleep: its backup goes
  EXPECT_THAT(keeper_->forgotten, ElementsAre(b.id));
  // Answered once the keeper forgot it: an rmmd SIGKILLed right after the
  // answer must not find it in the fd store and serve it again.
  EXPECT_EQ(keeper_->waits, 3);
  core_->close_session(s);  // a crash while asleep: kept, still with the keeper
  EXPECT_THAT(keeper_->forgotten, ElementsAre(b.id));
  EXPECT_EQ(keeper_->waits, 3);  // nobody waits for a session's end
  auto again = open(alice);
  ASSERT_TRUE(core_->stables().drop_backups(again, "engine-0").ok());
  EXPECT_THAT(keeper_->forgotten, ElementsAre(b.id, a.id));
  EXPECT_EQ(keeper_->waits, 4);
}

TEST_F(KeptBackups, WithoutAKeeperNothingIsKeptOrForgotten)
{
  auto s = open(alice);
  allocate(s, 2 * MiB, "weights");
  core_->stables().set_backup_keeper(nullptr);  // what the daemon's stop does
  sleep(s, {}, true, "engine-0");
  auto again = open(alice);
  core_->close_session(s);
  ASSERT_TRUE(core_->stables().drop_backups(again, "engine-0").ok());
  EXPECT_THAT(keeper_->kept, IsEmpty());
  EXPECT_THAT(keeper_->forgotten, IsEmpty());
}

TEST_F(KeptBackups, AnAdoptedBackupIsKeptChargedRestoredAndFreedThroughItsRelease)
{
  int released = 0;
  auto id      = core_->stables().adopt_backup(adopted("engine-0", 4 * MiB, 'w', &released));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(keeper_->kept, IsEmpty());  // the keeper has it already

  // Kept under its name, as after its session ended; charged to the host
  // pool (its uid's row) and to the uid.
  auto sleepers = core_->stables().sleepers();
  ASSERT_EQ(sleepers.size(), 1u);
  EXPECT_EQ(sleepers[0].session, 0u);
  EXPECT_EQ(sleepers[0].uid, alice);
  EXPECT_EQ(sleepers[0].pid, 77);
  EXPECT_EQ(sleepers[0].command, "engine --before");
  EXPECT_EQ(sleepers[0].backup_name, "engine-0");
  EXPECT_THAT(sleepers[0].tags, ElementsAre("weights"));
  EXPECT_EQ(sleepers[0].sleeping_bytes, 4 * MiB);
  EXPECT_EQ(sleepers[0].backup_bytes, 4 * MiB);
  auto const totals = core_->stables().totals();
  EXPECT_EQ(totals.kept_backup_names, 1u);
  EXPECT_EQ(totals.backup_bytes, 4 * MiB);
  EXPECT_EQ(in_use(host_), 4 * MiB);
  EXPECT_EQ(in_use(gpu_), 0u);
  auto rows = core_->pools().stats().pools[host_].tenants;
  ASSERT_EQ(rows.size(), 1u);  // no session of alice yet: a row of its own
  EXPECT_EQ(rows[0].tenant, "uid 1000");
  EXPECT_EQ(rows[0].in_use_bytes, 4 * MiB);

  // The uid's quota (12 MiB) counts it: 10 MiB more do not fit.
  auto s = open(alice);
  EXPECT_EQ(core_->stables().allocate(s, gpu_, 10 * MiB, "kv").status().code(),
            absl::StatusCode::kResourceExhausted);
  // The name is taken for a sleep of that uid; another uid neither sees nor drops it.
  allocate(s, 2 * MiB, "kv");
  EXPECT_EQ(core_->stables().begin_sleep(s, {}, true, "engine-0").status().code(),
            absl::StatusCode::kAlreadyExists);
  auto stranger = open(bob);
  EXPECT_EQ(core_->stables().restore(stranger, "engine-0").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->stables().drop_backups(stranger, "engine-0").status().code(),
            absl::StatusCode::kNotFound);

  auto restored = core_->stables().restore(s, "engine-0");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  auto const& g = restored->front();
  EXPECT_EQ(g.tag, "weights");
  EXPECT_EQ(g.size, 4 * MiB - 100);
  EXPECT_EQ(g.bytes, 4 * MiB);
  EXPECT_EQ(g.pool, gpu_);
  EXPECT_TRUE(g.has_backup);
  EXPECT_FALSE(g.awake);
  auto ids   = std::vector<stable_id>{g.id};
  auto woken = core_->stables().wake(s, {}, ids, std::chrono::steady_clock::now() + 1s);
  ASSERT_TRUE(woken.ok()) << woken.status();
  auto fds = core_->stables().fds(s, ids, true);
  ASSERT_TRUE(fds.ok()) << fds.status();
  char mark = 0;
  EXPECT_EQ(::pread(fds->front(), &mark, 1, 0), 1);
  EXPECT_EQ(mark, 'w');              // the bytes the last daemon kept
  EXPECT_EQ(in_use(gpu_), 6 * MiB);  // and the 2 MiB of kv
  ASSERT_TRUE(core_->stables().finish_wake(s, ids).ok());
  EXPECT_EQ(released, 1);
  EXPECT_THAT(keeper_->forgotten, ElementsAre(g.id));
  EXPECT_EQ(in_use(host_), 0u);
  EXPECT_EQ(core_->pools().stats().pools[host_].tenants[0].in_use_bytes, 0u);
  core_->close_session(s);
  core_->close_session(stranger);
  EXPECT_EQ(in_use(gpu_), 0u);
  EXPECT_TRUE(core_->stables().sleepers().empty());
}

TEST_F(KeptBackups, AnAdoptedBackupIsDroppedByNameOrFreedWithTheDaemon)
{
  int released = 0;
  ASSERT_TRUE(core_->stables().adopt_backup(adopted("engine-0", 2 * MiB, 'a', &released)).ok());
  ASSERT_TRUE(core_->stables().adopt_backup(adopted("engine-0", 2 * MiB, 'b', &released)).ok());
  ASSERT_TRUE(core_->stables().adopt_backup(adopted("engine-1", 2 * MiB, 'c', &released)).ok());
  EXPECT_EQ(core_->stables().sleepers().size(), 2u);  // one line per name
  auto root    = open(0);
  auto dropped = core_->stables().drop_backups(root, "engine-0");  // root drops any uid's
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 4 * MiB);
  EXPECT_EQ(released, 2);
  EXPECT_EQ(keeper_->forgotten.size(), 2u);
  EXPECT_EQ(in_use(host_), 2 * MiB);
  core_->stables().set_backup_keeper(nullptr);
  core_->close_session(root);
  // The daemon stopping frees the last through its release, and forgets nothing.
  core_.reset();
  EXPECT_EQ(released, 3);
  EXPECT_EQ(keeper_->forgotten.size(), 2u);
}

TEST_F(KeptBackups, AdoptionRefusesWhatDoesNotFitAndChangesNothing)
{
  int released = 0;
  auto code    = [&](auto change) {
    auto spec = adopted("engine-0", 2 * MiB, 'x', &released);
    change(spec);
    int const fd = spec.memory.fd;
    auto r       = core_->stables().adopt_backup(std::move(spec));
    ::close(fd);  // refused: still the caller's
    return r.status().code();
  };
  using spec = adopted_backup_spec;
  EXPECT_EQ(code([](spec& s) { s.backup_name = "../x"; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](spec& s) { s.tag = ""; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([&](spec& s) { s.pool = host_; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([&](spec& s) { s.host_pool = gpu_; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](spec& s) { s.pool = 9; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](spec& s) { s.size = 0; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](spec& s) { s.bytes = 4 * MiB; }), absl::StatusCode::kInvalidArgument);
  auto s = open(alice);
  allocate(s, 2 * MiB, "weights");
  sleep(s, {}, true, "engine-0");
  EXPECT_EQ(code([](spec&) {}), absl::StatusCode::kAlreadyExists);  // a live session's name
  EXPECT_EQ(released, 0);
  EXPECT_EQ(in_use(host_), 2 * MiB);  // the live sleeper's backup alone
  EXPECT_EQ(core_->stables().sleepers().size(), 1u);
}

}  // namespace
}  // namespace rmmd::core
