// Named sleep backups across a restart of rmmd, at the restart layer: a
// daemon's core (a fake CUDA pool, fake_pool_backend, and a real host pool)
// with the real fd_store_keeper and state file over an fd store that keeps
// duplicates of what it is given and passes them back at the next start, as
// systemd's does; each start does what rmmd's does (read the state file,
// reconcile, adopt_backups, write the file, remove what was not adopted). A
// crash is the core going without its keeper telling anything (as after a
// SIGKILL, or the daemon's stop): the memfds live on in the store. The
// buffers' counterpart with the real daemon:
// tests/integration/buffers_outlive_daemon_test.cpp; the same on a GPU:
// tests/gpu/stable_memory_test.cpp (ABackupSurvivesARestartOfRmmd...).

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/restart/backup_restore.hpp"
#include "daemon/restart/buffer_adoption.hpp"
#include "daemon/restart/fd_store.hpp"
#include "daemon/restart/fd_store_keeper.hpp"
#include "daemon/restart/state_file.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::restart {
namespace {

using core::pool_id;
using core::session_id;
using core::stable_id;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using namespace std::chrono_literals;

constexpr std::size_t MiB   = std::size_t{1} << 20;
constexpr std::size_t space = 64 * MiB;
constexpr uid_t alice       = 1000;
constexpr uid_t bob         = 1001;

/// systemd's fd store, in the test's process: it keeps a duplicate of each
/// fd stored, drops every fd of a name removed, and passes duplicates of
/// what it holds to the next start.
class recording_fd_store final : public fd_store {
 public:
  recording_fd_store() : fd_store(true) {}

  absl::Status store(std::string_view fd_name, int fd) override
  {
    std::lock_guard lock(mutex_);
    held_.push_back({std::string(fd_name), owned_fd(::fcntl(fd, F_DUPFD_CLOEXEC, 3))});
    return absl::OkStatus();
  }
  absl::Status remove(std::string_view fd_name) override
  {
    std::lock_guard lock(mutex_);
    std::erase_if(held_, [&](auto const& h) { return h.name == fd_name; });
    return absl::OkStatus();
  }

  [[nodiscard]] std::vector<std::string> names() const
  {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (auto const& h : held_) { out.push_back(h.name); }
    return out;
  }
  /// What the next start is passed (take_passed_fds().stored).
  [[nodiscard]] std::vector<passed_stored_fd> pass_back() const
  {
    std::lock_guard lock(mutex_);
    std::vector<passed_stored_fd> out;
    for (auto const& h : held_) {
      out.push_back({.fd_id = stored_fd_id(h.name).value_or(0),
                     .name  = h.name,
                     .fd    = owned_fd(::fcntl(h.fd.get(), F_DUPFD_CLOEXEC, 3))});
    }
    return out;
  }

 private:
  struct held {
    std::string name;
    owned_fd fd;
  };
  mutable std::mutex mutex_;
  std::vector<held> held_;
};

/// One daemon's life: its core, pools and keeper, and what its start said.
struct daemon_life {
  std::unique_ptr<core::daemon_core> core;
  pool_id gpu{};
  pool_id host{};
  std::shared_ptr<fd_store_keeper> keeper;
  std::vector<std::string> problems;  // reconcile's
  backups_adopted adopted;
  std::uint64_t generation{};
};

class KeptBackupsRestart : public ::testing::Test {
 protected:
  void SetUp() override
  {
    char tmpl[] = "/tmp/rmmd-backups-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override
  {
    daemon_ = {};
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path state_file() const
  {
    return dir_ / "buffers.state";
  }

  /// A start as rmmd's: pools, then what the store and the state file keep.
  void start(std::string const& gpu_uuid = "GPU-test")
  {
    daemon_life d;
    d.core = std::make_unique<core::daemon_core>(
        core::core_options{.access = {.uids = {0, alice, bob}, .gids = {}}, .quotas = {}});
    d.gpu = d.core->pools().add_pool(
        core::pool_config{.name         = "gpu",
                          .device       = 0,
                          .gpu_uuid     = gpu_uuid,
                          .handle_types = {core::handle_type::posix_fd}},
        core::device_like_traits,
        space,
        [](core::tenant_key const&) {
          return std::make_unique<core::fake_pool_backend>(
              core::fake_pool_backend::options{.capacity = space,
                                               .traits   = core::device_like_traits,
                                               .source = core::fake_pool_backend::memory::made_up});
        });
    d.host = d.core->pools().add_pool(
        core::pool_config{
            .name = "host", .device = -1, .handle_types = {core::handle_type::host_offset}},
        core::host_like_traits,
        space,
        [](core::tenant_key const& t) {
          return std::make_unique<backends::host::host_backend>("host", space, false, t.text());
        });
    // A state file that cannot be used is said and left aside, as rmmd does.
    auto read = read_state_file(state_file());
    std::optional<v1::BufferRegistryState> state;
    if (read.ok()) {
      state = *std::move(read);
    } else {
      d.problems.emplace_back(read.status().message());
    }
    d.generation = state ? state->daemon_generation() + 1 : 1;
    auto result  = reconcile(state, store_.pass_back());
    d.problems.insert(d.problems.end(), result.problems.begin(), result.problems.end());
    d.keeper =
        std::make_shared<fd_store_keeper>(fd_store_keeper::options{.state_file = state_file(),
                                                                   .generation = d.generation,
                                                                   .next_fd_id = result.next_fd_id},
                                          store_);
    d.adopted = adopt_backups(*d.core, std::move(result.adopted_backups), *d.keeper);
    ASSERT_TRUE(d.keeper->write_now().ok());
    for (auto const& name : result.remove_from_store) { ASSERT_TRUE(store_.remove(name).ok()); }
    for (auto const& name : d.adopted.remove_from_store) { ASSERT_TRUE(store_.remove(name).ok()); }
    d.core->stables().set_backup_keeper(d.keeper);
    daemon_ = std::move(d);
  }

  /// The daemon dies: nothing more reaches its keeper, its memory goes with it.
  void crash()
  {
    daemon_.core->stables().set_backup_keeper(nullptr);
    daemon_.keeper.reset();
    daemon_.core.reset();
  }

  core::stable_registry& stables()
  {
    return daemon_.core->stables();
  }

  session_id open(uid_t uid)
  {
    auto grant = daemon_.core->sessions().open_session(
        core::peer_credentials{.pid = 4321, .uid = uid, .gid = 100}, "engine --serve", "");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : session_id{};
  }

  std::size_t in_use(pool_id pool) const
  {
    return daemon_.core->pools().stats().pools.at(pool).in_use_bytes;
  }

  stable_id allocate(session_id s, std::size_t bytes, char const* tag)
  {
    auto g = stables().allocate(s, daemon_.gpu, bytes, tag);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? g->id : stable_id{};
  }

  /// A sleep of `tags` as the client makes it: each backup is written with
  /// `text` and the allocation's id (the copy), then the sleep is finished.
  void sleep(session_id s,
             std::vector<std::string> const& tags,
             bool backup,
             std::string const& name,
             std::string const& text = "")
  {
    auto chosen = stables().begin_sleep(s, tags, backup, name);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    std::vector<stable_id> ids;
    for (auto const& g : *chosen) { ids.push_back(g.id); }
    if (backup) {
      auto fds = stables().fds(s, ids, true);
      ASSERT_TRUE(fds.ok()) << fds.status();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        auto const bytes = text + std::to_string(ids[i]);
        ASSERT_EQ(::pwrite((*fds)[i], bytes.data(), bytes.size(), 0),
                  static_cast<ssize_t>(bytes.size()));
      }
    }
    ASSERT_TRUE(stables().finish_sleep(s, ids, false).ok());
  }

  /// The first `n` bytes of allocation `id`'s backup.
  std::string backup_text(session_id s, stable_id id, std::size_t n)
  {
    auto fds = stables().fds(s, std::vector<stable_id>{id}, true);
    EXPECT_TRUE(fds.ok()) << fds.status();
    if (!fds.ok()) { return {}; }
    std::string text(n, '\0');
    EXPECT_EQ(::pread(fds->front(), text.data(), n, 0), static_cast<ssize_t>(n));
    return text;
  }

  std::vector<std::string> stored_backups() const
  {
    std::vector<std::string> out;
    for (auto& name : store_.names()) {
      if (name.starts_with(backup_fd_name_prefix)) { out.push_back(name); }
    }
    return out;
  }

  v1::BufferRegistryState state() const
  {
    auto s = read_state_file(state_file());
    EXPECT_TRUE(s.ok() && s->has_value()) << s.status();
    return s.ok() && *s ? **s : v1::BufferRegistryState{};
  }

  /// What was kept or forgotten so far is in the store and the file.
  void settle()
  {
    ASSERT_TRUE(daemon_.keeper->wait_until_kept(std::chrono::steady_clock::now() + 10s));
  }

  std::filesystem::path dir_;
  recording_fd_store store_;
  daemon_life daemon_;
};

TEST_F(KeptBackupsRestart, ANamedBackupOutlivesTwoCrashesAndIsRestoredWithItsBytes)
{
  start();
  auto s       = open(alice);
  auto weights = allocate(s, 3 * MiB, "weights");
  auto extra   = allocate(s, 2 * MiB, "weights");
  allocate(s, 2 * MiB, "kv");
  sleep(s, {"weights"}, true, "engine-0", "weights of ");
  sleep(s, {"kv"}, true, "", "kv of ");  // unnamed: never kept
  // The sleep answered once the store and the file had both backups.
  EXPECT_THAT(stored_backups(),
              ElementsAre(backup_fd_name(1, "engine-0"), backup_fd_name(2, "engine-0")));
  auto written = state();
  ASSERT_THAT(written.backups(), SizeIs(2));
  EXPECT_EQ(written.backups(0).tag(), "weights");
  EXPECT_EQ(written.backups(0).size(), 3 * MiB);
  EXPECT_EQ(written.backups(0).allocation_bytes(), 4 * MiB);
  EXPECT_EQ(written.backups(0).backup_bytes(), 4 * MiB);
  EXPECT_EQ(written.backups(0).pool_name(), "gpu");
  EXPECT_EQ(written.backups(0).host_pool_name(), "host");
  EXPECT_EQ(written.backups(0).uid(), alice);
  daemon_.core->close_session(s);  // the engine is killed asleep
  crash();

  start();
  EXPECT_THAT(daemon_.problems, IsEmpty());
  EXPECT_EQ(daemon_.adopted.adopted, 2u);
  EXPECT_EQ(daemon_.adopted.bytes, 6 * MiB);
  crash();  // a second crash keeps them too
  start();
  EXPECT_EQ(daemon_.generation, 3u);
  EXPECT_EQ(daemon_.adopted.adopted, 2u);
  EXPECT_EQ(stored_backups().size(), 2u);
  auto sleepers = stables().sleepers();
  ASSERT_THAT(sleepers, SizeIs(1));
  EXPECT_EQ(sleepers[0].session, 0u);
  EXPECT_EQ(sleepers[0].uid, alice);
  EXPECT_EQ(sleepers[0].pid, 4321);
  EXPECT_EQ(sleepers[0].command, "engine --serve");
  EXPECT_EQ(sleepers[0].backup_name, "engine-0");
  EXPECT_THAT(sleepers[0].tags, ElementsAre("weights"));
  EXPECT_EQ(sleepers[0].sleeping_allocations, 2u);
  EXPECT_EQ(sleepers[0].sleeping_bytes, 6 * MiB);
  EXPECT_EQ(sleepers[0].backup_bytes, 6 * MiB);
  EXPECT_EQ(stables().totals().kept_backup_names, 1u);
  EXPECT_EQ(in_use(daemon_.host), 6 * MiB);
  EXPECT_EQ(in_use(daemon_.gpu), 0u);

  // Another uid cannot have it; a new process of alice restores it.
  EXPECT_EQ(stables().restore(open(bob), "engine-0").status().code(), absl::StatusCode::kNotFound);
  auto restorer = open(alice);
  auto restored = stables().restore(restorer, "engine-0");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_THAT(*restored, SizeIs(2));
  std::vector<stable_id> ids;
  std::vector<std::size_t> sizes;
  for (auto const& g : *restored) {
    ids.push_back(g.id);
    sizes.push_back(g.size);
    EXPECT_EQ(g.tag, "weights");
    EXPECT_EQ(g.pool, daemon_.gpu);
  }
  EXPECT_THAT(sizes, ElementsAre(3 * MiB, 2 * MiB));
  auto woken = stables().wake(restorer, {}, ids, std::chrono::steady_clock::now() + 1s);
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(in_use(daemon_.gpu), 6 * MiB);
  auto const first  = "weights of " + std::to_string(weights);
  auto const second = "weights of " + std::to_string(extra);
  EXPECT_EQ(backup_text(restorer, ids[0], first.size()), first);
  EXPECT_EQ(backup_text(restorer, ids[1], second.size()), second);
  ASSERT_TRUE(stables().finish_wake(restorer, ids).ok());
  settle();
  EXPECT_THAT(stored_backups(), IsEmpty());  // restored and woken: out of the store
  EXPECT_THAT(state().backups(), IsEmpty());
  EXPECT_EQ(in_use(daemon_.host), 0u);
  crash();
  start();
  EXPECT_TRUE(stables().sleepers().empty());
  EXPECT_EQ(daemon_.adopted.adopted, 0u);
}

TEST_F(KeptBackupsRestart, ALiveSessionsNamedSleepersAreKeptAndItsOthersAreNot)
{
  start();
  auto s = open(alice);
  allocate(s, 2 * MiB, "weights");
  allocate(s, 2 * MiB, "kv");
  allocate(s, 2 * MiB, "activations");
  sleep(s, {"weights"}, true, "engine-0", "w");
  sleep(s, {"kv"}, true, "", "k");  // an unnamed backup
  // activations stay awake (mapped by the client).
  EXPECT_THAT(stored_backups(), SizeIs(1));
  crash();  // the session is live

  start();
  auto const sleepers = stables().sleepers();
  ASSERT_THAT(sleepers, SizeIs(1));
  EXPECT_EQ(sleepers[0].backup_name, "engine-0");
  EXPECT_EQ(sleepers[0].session, 0u);  // kept: the session was the old daemon's
  EXPECT_EQ(in_use(daemon_.gpu), 0u);  // the awake allocation is not in this ledger
  EXPECT_EQ(in_use(daemon_.host), 2 * MiB);
  // The client, reconnected, restores it by name like any process of its uid.
  auto reconnected = open(alice);
  auto restored    = stables().restore(reconnected, "engine-0");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_THAT(*restored, SizeIs(1));
}

TEST_F(KeptBackupsRestart, ADroppedBackupLeavesTheStoreAndDoesNotComeBack)
{
  start();
  auto s = open(alice);
  allocate(s, 2 * MiB, "weights");
  sleep(s, {}, true, "engine-0", "w");
  daemon_.core->close_session(s);
  crash();
  start();
  ASSERT_EQ(daemon_.adopted.adopted, 1u);
  auto dropped = stables().drop_backups(open(alice), "engine-0");
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 2 * MiB);
  settle();
  EXPECT_THAT(stored_backups(), IsEmpty());
  EXPECT_THAT(state().backups(), IsEmpty());
  EXPECT_EQ(in_use(daemon_.host), 0u);
  crash();
  start();
  EXPECT_TRUE(stables().sleepers().empty());
}

TEST_F(KeptBackupsRestart, ASleepAgainUnderAnotherNameReplacesTheStoredBackup)
{
  start();
  auto s  = open(alice);
  auto id = allocate(s, 2 * MiB, "weights");
  sleep(s, {}, true, "engine-0", "first");
  // Woken but the wake not finished (the client died restoring?), then
  // asleep again under another name: one stored backup, the new name's.
  ASSERT_TRUE(stables().wake(s, {}, {}, std::chrono::steady_clock::now() + 1s).ok());
  sleep(s, {}, true, "engine-1", "second");
  settle();
  EXPECT_THAT(stored_backups(), ElementsAre(backup_fd_name(2, "engine-1")));
  ASSERT_THAT(state().backups(), SizeIs(1));
  EXPECT_EQ(state().backups(0).backup_name(), "engine-1");
  crash();
  start();
  auto restored = stables().restore(open(alice), "engine-1");
  ASSERT_TRUE(restored.ok()) << restored.status();
  (void)id;
}

TEST_F(KeptBackupsRestart, WhatNoLongerFitsIsReportedNotKeptAndRemovedFromTheStore)
{
  start();
  auto s = open(alice);
  allocate(s, 2 * MiB, "weights");
  sleep(s, {}, true, "engine-0", "w");
  daemon_.core->close_session(s);
  crash();
  // The pool is on another GPU now.
  start("GPU-other");
  EXPECT_EQ(daemon_.adopted.adopted, 0u);
  EXPECT_EQ(daemon_.adopted.dropped, 1u);
  EXPECT_THAT(stored_backups(), IsEmpty());
  EXPECT_THAT(state().backups(), IsEmpty());
  EXPECT_EQ(in_use(daemon_.host), 0u);
  EXPECT_TRUE(stables().sleepers().empty());
}

TEST_F(KeptBackupsRestart, ACorruptStateFileKeepsNothingAndEmptiesTheStore)
{
  start();
  auto s = open(alice);
  allocate(s, 2 * MiB, "weights");
  sleep(s, {}, true, "engine-0", "w");
  daemon_.core->close_session(s);
  crash();
  {
    std::fstream f(state_file(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x5a');
  }
  start();
  ASSERT_THAT(daemon_.problems, SizeIs(2));
  EXPECT_THAT(daemon_.problems[0], HasSubstr("checksum"));
  EXPECT_THAT(daemon_.problems[1], HasSubstr(backup_fd_name(1, "engine-0")));
  EXPECT_THAT(daemon_.problems[1], HasSubstr("there is no usable state file"));
  EXPECT_THAT(stored_backups(), IsEmpty());
  EXPECT_TRUE(stables().sleepers().empty());
  EXPECT_EQ(in_use(daemon_.host), 0u);
}

}  // namespace
}  // namespace rmmd::restart
