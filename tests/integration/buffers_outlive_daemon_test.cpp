// Buffers that outlive the daemon, on host pools: the real rmmd under
// harness::service_manager (a stand-in for systemd's fd store), SIGKILLed
// and started again with the fds the store kept. A published buffer comes
// back with its bytes, manifest and access rules; a delete takes it out of
// the store; a graceful stop keeps what is published; a corrupt state file,
// a record without an fd and an fd without a record are said in the log and
// nothing wrong is served; without a service manager nothing is kept, as
// before. Every client is a process of its own (kept_buffer_clients.hpp).
// The same on device memory: tests/gpu/buffers_outlive_daemon_test.cpp.

#include "daemon/restart/state_file.hpp"
#include "tests/tools/kept_buffer_clients.hpp"
#include "tests/tools/kv_takeover.hpp"
#include "tests/tools/managed_rmmd.hpp"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <csignal>
#include <cstring>
#include <fstream>

namespace rmmd::test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr std::size_t buffer_bytes = std::size_t{1} << 20;
constexpr std::uint64_t seed       = 27;

std::vector<std::string> host_args()
{
  return {"--backend", "host", "--host-pool-bytes", "64MiB"};
}

/// A persistent buffer of 4 tensors and two labels, readable by group 0.
std::vector<std::string> persistent_options()
{
  return {"--pool",
          "host",
          "--persistent",
          "--gid",
          "0",
          "--tensors",
          "4",
          "--label",
          "model=m1",
          "--label",
          "revision=r27"};
}

/// The state file, once it names `n` buffers.
std::optional<v1::BufferRegistryState> state_with(managed_rmmd const& daemon, int n)
{
  std::optional<v1::BufferRegistryState> found;
  eventually([&] {
    auto state = restart::read_state_file(daemon.state_file());
    if (state.ok() && *state && (*state)->buffers_size() == n) { found = **state; }
    return found.has_value();
  });
  return found;
}

/// Publishes `names` (persistent) and waits until the store and the state
/// file hold all of them: a SIGKILL then loses none.
void publish_kept(managed_rmmd& daemon, std::vector<std::string> const& names)
{
  for (std::size_t i = 0; i < names.size(); ++i) {
    produce(daemon, names[i], buffer_bytes, seed + i, persistent_options());
  }
  ASSERT_TRUE(daemon.wait_for_stored(names.size())) << daemon.log();
  ASSERT_TRUE(state_with(daemon, static_cast<int>(names.size()))) << daemon.log();
}

void crash_and_restart(managed_rmmd& daemon)
{
  auto killed = daemon.manager().kill_service(SIGKILL);
  ASSERT_TRUE(killed && WIFSIGNALED(*killed));
  ASSERT_TRUE(daemon.start());
}

TEST(BuffersOutliveDaemon, APersistentHostBufferComesBackAfterSigkillWithItsBytesAndManifest)
{
  managed_rmmd daemon(host_args());
  ASSERT_TRUE(daemon.start());
  publish_kept(daemon, {"team/weights"});
  EXPECT_THAT(daemon.stored_buffers(), ElementsAre(HasSubstr(".team/weights")));
  auto state = state_with(daemon, 1);
  ASSERT_TRUE(state);
  EXPECT_EQ(state->daemon_generation(), 1u);
  EXPECT_EQ(state->buffers(0).name(), "team/weights");
  EXPECT_TRUE(state->buffers(0).persistent());
  EXPECT_EQ(state->buffers(0).kind(), v1::STORED_BUFFER_KIND_HOST_MEMFD);
  auto const before =
      rmmctl_json<v1::DescribeBufferResponse>(daemon, {"buffers", "show", "team/weights"});

  crash_and_restart(daemon);
  EXPECT_THAT(daemon.log(), HasSubstr("buffer 'team/weights' (1048576 bytes in pool 'host', uid"));
  EXPECT_THAT(listed(daemon), ElementsAre("team/weights"));
  auto const after =
      rmmctl_json<v1::DescribeBufferResponse>(daemon, {"buffers", "show", "team/weights"});
  EXPECT_EQ(after.manifest().SerializeAsString(), before.manifest().SerializeAsString());
  EXPECT_EQ(after.manifest().tensors_size(), 4);
  EXPECT_TRUE(after.info().persistent());
  EXPECT_EQ(after.info().state(), v1::BUFFER_STATE_PUBLISHED);
  EXPECT_EQ(after.info().size(), buffer_bytes);
  EXPECT_EQ(after.info().creator_uid(), before.info().creator_uid());
  EXPECT_TRUE(after.info().has_gid() && after.info().gid() == 0u);
  EXPECT_EQ(consume(daemon, "team/weights", buffer_bytes, seed, {"--pool", "host"}), "verified");

  auto stats = stats_of(daemon);
  EXPECT_EQ(stats.restart().restarts(), 1u);
  EXPECT_EQ(stats.restart().readopted_buffers(), 1u);
  EXPECT_GE(stats.restart().readopted_bytes(), buffer_bytes);
  EXPECT_EQ(stats.restart().dropped_at_start(), 0u);
  EXPECT_TRUE(stats.restart().keeping_buffers());
  EXPECT_GE(stats.pools(0).in_use_bytes(), buffer_bytes);  // charged to the pool again
  auto text = run(
      {program_path("rmmctl").string(), "--runtime-dir", daemon.runtime_dir().string(), "stats"});
  EXPECT_THAT(text.out, HasSubstr("restarts: 1; buffers served again after the last: 1 ("));

  // A second crash: still there, and the restarts count on.
  crash_and_restart(daemon);
  EXPECT_EQ(consume(daemon, "team/weights", buffer_bytes, seed, {"--pool", "host"}), "verified");
  EXPECT_EQ(stats_of(daemon).restart().restarts(), 2u);

  // Deleted: out of the store and the state file; a restart serves nothing.
  auto deleted = run({program_path("rmmctl").string(),
                      "--runtime-dir",
                      daemon.runtime_dir().string(),
                      "buffers",
                      "delete",
                      "team/weights"});
  EXPECT_EQ(deleted.status, 0) << deleted.out;
  EXPECT_TRUE(daemon.wait_for_stored(0)) << daemon.log();
  EXPECT_TRUE(state_with(daemon, 0));
  crash_and_restart(daemon);
  EXPECT_THAT(listed(daemon), IsEmpty());
  EXPECT_EQ(stats_of(daemon).pools(0).in_use_bytes(), 0u);
}

TEST(BuffersOutliveDaemon, APublishTheClientHeardOfSurvivesASigkillRightAfterIt)
{
  // Publish answers once the fd is stored and the state file names it, so a
  // crash the moment the producer hears "published" loses nothing. (Before,
  // a SIGKILL between the store and the file dropped the buffer at start:
  // "no record of the state file names it".)
  managed_rmmd daemon(host_args());
  ASSERT_TRUE(daemon.start());
  for (int round = 0; round < 5; ++round) {
    auto const name = "team/quick-" + std::to_string(round);
    produce(daemon, name, buffer_bytes, seed + round, persistent_options());
    crash_and_restart(daemon);  // no wait for the store: at once
    EXPECT_EQ(consume(daemon, name, buffer_bytes, seed + round, {"--pool", "host"}), "verified")
        << daemon.log();
    EXPECT_EQ(stats_of(daemon).restart().dropped_at_start(), 0u) << daemon.log();
  }
  EXPECT_EQ(listed(daemon).size(), 5u);
}

TEST(BuffersOutliveDaemon, AGracefulStopKeepsWhatIsPublishedForTheNextStart)
{
  auto args = host_args();
  args.insert(args.end(), {"--drain-timeout-ms", "200"});  // the holder stays past the drain
  managed_rmmd daemon(args);
  ASSERT_TRUE(daemon.start());
  publish_kept(daemon, {"team/kept"});
  // A buffer that is not persistent, held by its producer while rmmd stops.
  auto holder = start_producer(daemon, "team/held", buffer_bytes, seed + 1, {"--pool", "host"});
  ASSERT_TRUE(daemon.wait_for_stored(2));
  ASSERT_TRUE(state_with(daemon, 2));
  auto stopped = daemon.manager().kill_service(SIGTERM);
  ASSERT_TRUE(stopped && WIFEXITED(*stopped) && WEXITSTATUS(*stopped) == 0) << daemon.log();
  holder.reset();
  EXPECT_EQ(daemon.stored_buffers().size(), 2u);

  ASSERT_TRUE(daemon.start());
  EXPECT_THAT(listed(daemon), UnorderedElementsAre("team/held", "team/kept"));
  EXPECT_EQ(consume(daemon, "team/held", buffer_bytes, seed + 1, {"--pool", "host"}), "verified");
  // The consumer was its last holder after the restart: a buffer that is not
  // persistent then goes, and leaves the store.
  EXPECT_TRUE(daemon.wait_for_stored(1, ".team/kept")) << daemon.log();
  EXPECT_THAT(listed(daemon), ElementsAre("team/kept"));
}

TEST(BuffersOutliveDaemon, ACorruptStateFileIsReportedAndNothingIsServed)
{
  managed_rmmd daemon(host_args());
  ASSERT_TRUE(daemon.start());
  publish_kept(daemon, {"team/a"});
  ASSERT_TRUE(daemon.manager().kill_service(SIGKILL));
  {
    std::fstream f(daemon.state_file(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x5a');
  }
  ASSERT_TRUE(daemon.start());
  EXPECT_THAT(daemon.log(), HasSubstr("the state file cannot be used"));
  EXPECT_THAT(daemon.log(), HasSubstr("there is no usable state file to say whose it is"));
  EXPECT_THAT(listed(daemon), IsEmpty());
  EXPECT_TRUE(daemon.wait_for_stored(0)) << "the unknown fd stays in the store";
  EXPECT_EQ(stats_of(daemon).restart().dropped_at_start(), 1u);
  // The daemon goes on, with a state file of its own: a new buffer is kept.
  publish_kept(daemon, {"team/b"});
}

TEST(BuffersOutliveDaemon, AMissingFdAndAnUnknownFdAreReportedAndNotServed)
{
  managed_rmmd daemon(host_args());
  ASSERT_TRUE(daemon.start());
  publish_kept(daemon, {"team/a", "team/b"});
  auto state = state_with(daemon, 2);
  ASSERT_TRUE(state);
  ASSERT_TRUE(daemon.manager().kill_service(SIGKILL));
  // The file names a, and c whose fd the store never had; b's fd is in the
  // store with no record.
  v1::BufferRegistryState edited = *state;
  edited.clear_buffers();
  for (auto const& r : state->buffers()) {
    if (r.name() == "team/a") { *edited.add_buffers() = r; }
  }
  ASSERT_EQ(edited.buffers_size(), 1);
  auto c = edited.buffers(0);
  c.set_name("team/c");
  c.set_fd_id(edited.next_fd_id());
  c.set_fd_name("rmmd-buffer-" + std::to_string(c.fd_id()) + ".team/c");
  edited.set_next_fd_id(c.fd_id() + 1);
  *edited.add_buffers() = c;
  ASSERT_TRUE(restart::write_state_file(daemon.state_file(), edited).ok());

  ASSERT_TRUE(daemon.start());
  auto const log = daemon.log();
  EXPECT_THAT(log, HasSubstr("buffer 'team/c'"));
  EXPECT_THAT(log, HasSubstr("the fd store passed no fd for it"));
  EXPECT_THAT(log, HasSubstr("no record of the state file names it"));
  EXPECT_THAT(listed(daemon), ElementsAre("team/a"));
  EXPECT_EQ(consume(daemon, "team/a", buffer_bytes, seed, {"--pool", "host"}), "verified");
  EXPECT_TRUE(daemon.wait_for_stored(1, ".team/a")) << "b's fd stays in the store";
  EXPECT_EQ(stats_of(daemon).restart().dropped_at_start(), 2u);
  auto again = state_with(daemon, 1);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->buffers(0).name(), "team/a");
  EXPECT_EQ(again->daemon_generation(), 2u);
}

TEST(BuffersOutliveDaemon, AnFdOfTheWrongSizeIsNotServed)
{
  managed_rmmd daemon(host_args());
  ASSERT_TRUE(daemon.start());
  publish_kept(daemon, {"team/a"});
  auto state = state_with(daemon, 1);
  ASSERT_TRUE(state);
  ASSERT_TRUE(daemon.manager().kill_service(SIGKILL));
  auto edited = *state;
  edited.mutable_buffers(0)->set_allocation_bytes(2 * buffer_bytes);
  edited.mutable_buffers(0)->set_size(2 * buffer_bytes);
  ASSERT_TRUE(restart::write_state_file(daemon.state_file(), edited).ok());
  ASSERT_TRUE(daemon.start());
  EXPECT_THAT(daemon.log(), HasSubstr("buffer 'team/a'"));
  EXPECT_THAT(listed(daemon), IsEmpty());
  EXPECT_TRUE(daemon.wait_for_stored(0));
}

TEST(BuffersOutliveDaemon, WithoutAServiceManagerNothingIsKept)
{
  char tmpl[] = "/tmp/rmmd-unkept-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::filesystem::path const dir = tmpl;
  auto const state                = dir / "buffers.state";
  std::vector<std::string> argv{program_path("rmmd").string(),
                                "--runtime-dir",
                                (dir / "run").string(),
                                "--state-file",
                                state.string()};
  for (auto const& a : host_args()) { argv.push_back(a); }
  child_process daemon(argv, {}, {.merge_stderr = true, .kill_last = true});
  std::string said;
  while (auto line = daemon.read_line(60s)) {
    said += *line + "\n";
    if (line->find("ready:") != std::string::npos) { break; }
  }
  EXPECT_THAT(said, HasSubstr("buffers live as long as this daemon"));
  child_process producer({program_path("rmmd_share_client").string(),
                          "produce",
                          "team/plain",
                          std::to_string(buffer_bytes),
                          "1",
                          "--pool",
                          "host",
                          "--persistent"},
                         {"RMMD_RUNTIME_DIR=" + (dir / "run").string()});
  std::string line;
  while (auto l = producer.read_line(60s)) {
    line = *l;
    if (line == "published") { break; }
  }
  EXPECT_EQ(line, "published");
  producer.close_stdin();
  EXPECT_EQ(producer.wait(60s), 0);
  EXPECT_FALSE(std::filesystem::exists(state)) << "no state file without a service manager";
  daemon.kill(SIGKILL);
  daemon.wait(60s);
  std::filesystem::remove_all(dir);
}

// The KV cache of an engine that dies with rmmd: a persistent buffer whose
// write lease an engine held while rmmd was SIGKILLed comes back with the
// engine's bytes, and the next exclusive open (the standby taking over) is
// granted at once, with a generation above every one before the restart,
// so that a late write of the old holder can be told from the new one's.
TEST(BuffersOutliveDaemon, AWriterLeasedKvComesBackAndItsNextWriterHasALargerGeneration)
{
  managed_rmmd daemon(host_args());
  ASSERT_TRUE(daemon.start());
  std::vector<unsigned char> const written(buffer_bytes, 0x6b);
  auto const first = engine_writes_kv_and_rmmd_dies(
      daemon, "kv/engine-0", buffer_bytes, {.pool = "host"}, [&](void* p) {
        std::memcpy(p, written.data(), buffer_bytes);
      });
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto standby = kv_session(daemon, "standby");
  auto kv      = standby_takes_kv(standby, "kv/engine-0");
  EXPECT_GT(kv.lease_generation(), first);
  EXPECT_EQ(std::memcmp(kv.data(), written.data(), buffer_bytes), 0)
      << "the KV bytes the engine wrote before rmmd's SIGKILL";
}

}  // namespace
}  // namespace rmmd::test
