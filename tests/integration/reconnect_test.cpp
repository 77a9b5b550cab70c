// Sessions that reconnect (session::options::reconnect): rmmd is SIGKILLed
// and started again on the same runtime directory while this process holds
// host-pool memory; the memory it holds stays readable and writable, its
// frees succeed without a request (the new daemon never lent it), new
// allocations come from the new daemon (whose ledger shows the reconnected
// session with them and nothing of the old), on_reconnect runs once per
// restart, and calls racing with the restart wait for the reconnect. With
// reconnect off, or a daemon that does not come back within the bound, the
// error is the one sessions always gave. tests/gpu/reconnect_test.cpp does
// the same for CUDA pools in direct and slab mode.
//
// IdleRestart: a session that makes no call while rmmd, under a service
// manager that keeps its fd store, is SIGKILLed and started again: whichever
// call it makes first afterwards, from C++ or the C ABI, reconnects and is
// answered by the new daemon.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "client/detail/usage_reports.hpp"
#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/child_process.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/managed_rmmd.hpp"
#include "tests/tools/pattern.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/rmmd.h>
#include <rmmd/host_memory_resource.hpp>
#include <rmmd/shared_buffer.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::test {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr std::size_t buffer_bytes = 65536;

/// rmmd with a 64 MiB host pool; in `dir` if one is given (left in place).
std::unique_ptr<harness::daemon_process> start_rmmd(std::filesystem::path const& dir = {})
{
  return std::make_unique<harness::daemon_process>(
      harness::daemon_process::options{.program     = program_path("rmmd"),
                                       .args        = {"--backend",
                                                       "host",
                                                       "--host-pool-bytes",
                                                       "64MiB",
                                                       "--drain-timeout-ms",
                                                       "0"},  // the test stops it at once
                                       .dir_prefix  = "rmmd-reconnect-",
                                       .runtime_dir = dir,
                                       .log_to_file = true});
}

void kill_daemon(harness::daemon_process& d)
{
  d.process().kill(SIGKILL);
  ASSERT_EQ(d.process().wait(), 128 + SIGKILL);
}

/// The session of `id` in `stats`, or null.
v1::SessionInfo const* session_in(v1::Stats const& stats, std::uint64_t id)
{
  for (auto const& s : stats.sessions()) {
    if (s.session_id() == id) { return &s; }
  }
  return nullptr;
}

struct held_buffer {
  void* ptr;
  std::uint64_t seed;
};

TEST(Reconnect, HostClientRidesThroughThreeRestarts)
{
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  std::mutex infos_mutex;
  std::vector<reconnect_info> infos;
  rmmd::session s(rmmd::session::options{.runtime_dir  = dir,
                                         .client_name  = "rider",
                                         .reconnect    = 30s,
                                         .on_reconnect = [&](reconnect_info const& i) {
                                           std::lock_guard lock(infos_mutex);
                                           infos.push_back(i);
                                         }});
  rmmd::host_memory_resource mr(s);
  std::vector<held_buffer> held;  // from every daemon so far
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    held.push_back({mr.allocate_sync(buffer_bytes, 256), seed});
    fill(held.back().ptr, buffer_bytes, seed);
  }

  std::unique_ptr<harness::daemon_process> current;  // the first owns the directory
  std::uint64_t previous_id = 0;
  testing::internal::CaptureStderr();
  for (std::uint32_t restart = 1; restart <= 3; ++restart) {
    kill_daemon(current ? *current : *first);
    current.reset();
    current             = start_rmmd(dir);
    auto const previous = s.id();
    previous_id         = previous;

    // What this process held stays readable and writable.
    for (auto& b : held) {
      ASSERT_EQ(first_mismatch(b.ptr, buffer_bytes, b.seed), -1) << "buffer " << b.seed;
      b.seed += 100;
      fill(b.ptr, buffer_bytes, b.seed);
    }
    // The next allocation reconnects and comes from the new daemon.
    std::vector<held_buffer> fresh;
    for (std::uint64_t i = 0; i < 2; ++i) {
      fresh.push_back({mr.allocate_sync(buffer_bytes, 256), 1000 * restart + i});
      fill(fresh.back().ptr, buffer_bytes, fresh.back().seed);
    }
    EXPECT_EQ(s.reconnects(), restart);
    EXPECT_NE(s.id(), 0u);
    {
      std::lock_guard lock(infos_mutex);
      ASSERT_EQ(infos.size(), restart) << "on_reconnect runs once per restart";
      EXPECT_EQ(infos.back().reconnects, restart);
      EXPECT_EQ(infos.back().previous_session_id, previous);
      EXPECT_EQ(infos.back().session_id, s.id());
    }
    // The new daemon's ledger: this session, with its new allocations only.
    auto stats = stats_of(s);
    ASSERT_EQ(stats.sessions_size(), 1) << stats.DebugString();
    auto const* mine = session_in(stats, s.id());
    ASSERT_NE(mine, nullptr) << stats.DebugString();
    EXPECT_EQ(mine->client_name(), "rider");
    EXPECT_EQ(mine->allocation_count(), 2u);
    // The operator sees a reconnected session: which reconnect, and the
    // session it had with the daemon before.
    EXPECT_EQ(mine->reconnects(), restart);
    EXPECT_EQ(mine->previous_session_id(), previous);
    EXPECT_EQ(stats.restart().reconnected_sessions(), 1u) << stats.DebugString();
    EXPECT_EQ(in_use(stats, s.host_pool().id), 2 * buffer_bytes);

    // Freeing what an earlier daemon lent asks nothing of this one.
    auto const old = held.front();
    held.erase(held.begin());
    mr.deallocate_sync(old.ptr, buffer_bytes, 256);
    stats = stats_of(s);
    EXPECT_EQ(session_in(stats, s.id())->allocation_count(), 2u);
    EXPECT_EQ(in_use(stats, s.host_pool().id), 2 * buffer_bytes);
    for (auto const& b : fresh) {
      EXPECT_EQ(first_mismatch(b.ptr, buffer_bytes, b.seed), -1) << "buffer " << b.seed;
    }
    held.insert(held.end(), fresh.begin(), fresh.end());
  }
  // Frees of this daemon's leases reach it; the earlier ones' stay local.
  for (auto const& b : held) {
    EXPECT_EQ(first_mismatch(b.ptr, buffer_bytes, b.seed), -1) << "buffer " << b.seed;
    mr.deallocate_sync(b.ptr, buffer_bytes, 256);
  }
  auto const stats = stats_of(s);
  EXPECT_EQ(in_use(stats, s.host_pool().id), 0u) << stats.DebugString();
  // The daemon's log says whose reconnect it took (the hello says so).
  EXPECT_THAT(current->log_tail(50),
              HasSubstr("a client reconnecting (it was session " + std::to_string(previous_id) +
                        " of the daemon before, reconnect 3)"));
  auto const said = lines_of(testing::internal::GetCapturedStderr());
  // One line per reconnect, and nothing else.
  ASSERT_EQ(said.size(), 3u) << ::testing::PrintToString(said);
  for (auto const& line : said) {
    EXPECT_THAT(line, HasSubstr("reconnected to the daemon at " + dir.string()));
  }
}

TEST(Reconnect, CallsRacingWithARestartWaitForTheReconnect)
{
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  std::atomic<int> told{0};
  rmmd::session s(rmmd::session::options{.runtime_dir  = dir,
                                         .client_name  = "racer",
                                         .reconnect    = 30s,
                                         .on_reconnect = [&](reconnect_info const&) { ++told; }});
  rmmd::host_memory_resource mr(s);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::atomic<std::size_t> rounds{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> mine;
      while (!stop.load()) {
        try {
          mine.push_back(mr.allocate_sync(4096, 256));
          fill(mine.back(), 4096, static_cast<std::uint64_t>(t));
          if (mine.size() > 8) {
            mr.deallocate_sync(mine.front(), 4096, 256);
            mine.erase(mine.begin());
          }
          ++rounds;
        } catch (std::exception const& e) {
          ++failures;
          ADD_FAILURE() << "thread " << t << ": " << e.what();
          return;
        }
      }
      for (auto* p : mine) { mr.deallocate_sync(p, 4096, 256); }
    });
  }
  ASSERT_TRUE(eventually([&] { return rounds.load() > 100; }));
  testing::internal::CaptureStderr();
  kill_daemon(*first);
  auto second           = start_rmmd(dir);
  auto const at_restart = rounds.load();
  EXPECT_TRUE(eventually([&] { return rounds.load() > at_restart + 100; }, 30s));
  stop = true;
  for (auto& t : threads) { t.join(); }
  auto const said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(told.load(), 1);
  EXPECT_EQ(s.reconnects(), 1u);
  EXPECT_EQ(lines_of(said).size(), 1u) << said;
  // Every thread freed what it held: the new daemon's ledger is empty.
  EXPECT_EQ(in_use(stats_of(s), s.host_pool().id), 0u);
}

TEST(Reconnect, TheReaderThreadReconnectsWithoutACallAndReportsGoOn)
{
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  std::atomic<int> told{0};
  rmmd::session s(rmmd::session::options{.runtime_dir  = dir,
                                         .reconnect    = 30s,
                                         .on_reconnect = [&](reconnect_info const&) { ++told; }});
  // A reclaim watch keeps the session's reader thread on the socket.
  auto const pool  = s.host_pool().id;
  auto const watch = s.watch_reclaims(pool, [](std::uint32_t) {});
  testing::internal::CaptureStderr();
  kill_daemon(*first);
  auto second = start_rmmd(dir);
  EXPECT_TRUE(eventually([&] { return told.load() == 1; }, 30s));
  static_cast<void>(testing::internal::GetCapturedStderr());
  EXPECT_EQ(s.reconnects(), 1u);
  // Usage reports reach the new daemon, under its pool ids.
  auto lease = s.allocate(pool, buffer_bytes, 256);
  EXPECT_NO_THROW(static_cast<void>(s.report_usage({carved_usage{
      .pool_id = pool, .bytes = 4096, .allocation_count = 1, .slab_bytes = buffer_bytes}})));
  auto const stats = stats_of(s);
  ASSERT_NE(session_in(stats, s.id()), nullptr);
  EXPECT_EQ(session_in(stats, s.id())->carved_bytes(), 4096u) << stats.DebugString();
  s.free(lease.id);
  s.unwatch_reclaims(watch);
}

// Slab mode's reports (the only reporter is the device resource's carver,
// tests/gpu/reconnect_test.cpp) go through usage_reports with the daemon
// they were counted for: here the same path with host-pool leases standing
// in for slabs. A report counted for the daemon before a restart that
// reaches the new one (its try at the old one failed, and the session
// reconnected) must not count the old daemon's slabs there: the new daemon
// refuses more slabs than the session holds in the pool.
TEST(Reconnect, CarvedReportsCountedForAnEarlierDaemonAreLeftOut)
{
  constexpr std::size_t MiB = std::size_t{1} << 20;
  auto first                = start_rmmd();
  auto const dir            = first->runtime_dir();
  rmmd::session s(rmmd::session::options{.runtime_dir = dir, .reconnect = 30s});
  auto const pool = s.host_pool().id;
  auto& reports   = rmmd::detail::impl_of(s).reports();
  int const old_reporter{};
  int const new_reporter{};
  // At the first daemon: a 16 MiB "slab", 1 MiB carved from it.
  auto const slab      = s.allocate(pool, 16 * MiB, 256);
  auto const first_gen = rmmd::detail::impl_of(s).channel().generation();
  carved_usage const old_figures{
      .pool_id = pool, .bytes = MiB, .allocation_count = 1, .slab_bytes = 16 * MiB};
  EXPECT_NO_THROW(static_cast<void>(reports.report_carved(&old_reporter, old_figures, first_gen)));
  EXPECT_EQ(session_in(stats_of(s), s.id())->carved_bytes(), MiB);

  testing::internal::CaptureStderr();
  kill_daemon(*first);
  auto second = start_rmmd(dir);
  // The figures counted for the first daemon: the try at it fails, the
  // session reconnects, and the new daemon hears nothing of them.
  EXPECT_NO_THROW(static_cast<void>(reports.report_carved(&old_reporter, old_figures, first_gen)));
  EXPECT_EQ(s.reconnects(), 1u);
  auto const second_gen = rmmd::detail::impl_of(s).channel().generation();
  EXPECT_NE(second_gen, first_gen);
  auto stats = stats_of(s);
  ASSERT_NE(session_in(stats, s.id()), nullptr) << stats.DebugString();
  EXPECT_EQ(session_in(stats, s.id())->carved_bytes(), 0u) << stats.DebugString();

  // Another reporter's figures for the new daemon: the old ones are not
  // added to them (16 MiB more of slabs than the session holds there).
  auto const lease = s.allocate(pool, 4 * MiB, 256);
  EXPECT_NO_THROW(static_cast<void>(reports.report_carved(
      &new_reporter,
      carved_usage{.pool_id = pool, .bytes = MiB, .allocation_count = 1, .slab_bytes = 4 * MiB},
      second_gen)));
  stats = stats_of(s);
  EXPECT_EQ(session_in(stats, s.id())->carved_bytes(), MiB) << stats.DebugString();
  EXPECT_EQ(session_in(stats, s.id())->carved_allocations(), 1u) << stats.DebugString();

  reports.forget_reporter(&old_reporter, pool);
  reports.forget_reporter(&new_reporter, pool);
  s.free(slab.id);  // the first daemon's: answered here
  s.free(lease.id);
  auto const said = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(said.size(), 1u) << ::testing::PrintToString(said);
  EXPECT_THAT(said.front(), HasSubstr("reconnected to the daemon at"));
}

TEST(Reconnect, OpenBuffersStayMappedAndTheLogSaysWhatTheNewDaemonDoesNotKnow)
{
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  reconnect_info told{};
  rmmd::session s(rmmd::session::options{
      .runtime_dir = dir, .reconnect = 30s, .on_reconnect = [&](reconnect_info const& i) {
        told = i;
      }});
  auto const pool = s.host_pool().name;
  auto made       = shared_buffer::create(s, "reconnect/kept", buffer_bytes, {.pool = pool});
  fill(made.data(), buffer_bytes, 7);
  made.publish();
  auto opened = shared_buffer::open(s, "reconnect/kept");
  ASSERT_EQ(first_mismatch(opened.data(), buffer_bytes, 7), -1);

  kill_daemon(*first);
  auto second = start_rmmd(dir);
  testing::internal::CaptureStderr();
  // A call reconnects; a daemon that did not re-adopt the buffer cannot hold it.
  s.free(s.allocate(s.host_pool().id, 4096, 256).id);
  auto const said = testing::internal::GetCapturedStderr();
  EXPECT_THAT(said, HasSubstr("not known to the new daemon, kept mapped here: reconnect/kept"));
  EXPECT_EQ(told.reconnects, 1u);
  EXPECT_EQ(told.buffers_held_again + told.buffers_unknown, 1u);
  EXPECT_EQ(told.buffers_unknown, 1u);
  // The mapping stays this process's; closing asks nothing of the new daemon.
  EXPECT_EQ(first_mismatch(opened.data(), buffer_bytes, 7), -1);
  testing::internal::CaptureStderr();
  opened.close();
  made.close();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  // The name is free at the new daemon.
  auto again = shared_buffer::create(s, "reconnect/kept", buffer_bytes, {.pool = pool});
  again.publish();
}

TEST(Reconnect, OffTheNextCallSaysTheDaemonIsGone)
{
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  rmmd::session s(rmmd::session::options{.runtime_dir = dir, .reconnect = 0ms});
  rmmd::host_memory_resource mr(s);
  auto* p = mr.allocate_sync(buffer_bytes, 256);
  kill_daemon(*first);
  auto second = start_rmmd(dir);
  try {
    (void)mr.allocate_sync(4096, 256);
    ADD_FAILURE() << "allocate succeeded through a session whose daemon was killed";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("daemon is gone"));
  }
  EXPECT_EQ(s.reconnects(), 0u);
  testing::internal::CaptureStderr();
  mr.deallocate_sync(p, buffer_bytes, 256);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("daemon is gone"));
}

TEST(Reconnect, ADaemonThatDoesNotComeBackWithinTheBoundEndsTheSessionAsBefore)
{
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  int told       = 0;
  rmmd::session s(rmmd::session::options{.runtime_dir  = dir,
                                         .reconnect    = 300ms,
                                         .on_reconnect = [&](reconnect_info const&) { ++told; }});
  rmmd::host_memory_resource mr(s);
  auto* p = mr.allocate_sync(buffer_bytes, 256);
  fill(p, buffer_bytes, 3);
  kill_daemon(*first);
  testing::internal::CaptureStderr();
  try {
    (void)mr.allocate_sync(4096, 256);
    ADD_FAILURE() << "allocate succeeded with no daemon";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("daemon is gone"));
  }
  auto const said = testing::internal::GetCapturedStderr();
  EXPECT_THAT(said, HasSubstr("none came back at " + dir.string() + " within 300 ms"));
  // A daemon that comes later finds the session over: no more tries.
  auto second = start_rmmd(dir);
  EXPECT_THROW((void)mr.allocate_sync(4096, 256), rmmd::session_error);
  EXPECT_EQ(told, 0);
  EXPECT_EQ(s.reconnects(), 0u);
  EXPECT_EQ(first_mismatch(p, buffer_bytes, 3), -1);
  testing::internal::CaptureStderr();
  mr.deallocate_sync(p, buffer_bytes, 256);  // freed here: the daemon that lent it is gone
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// ---- IdleRestart --------------------------------------------------------

constexpr char const* kept_name = "idle/kept";

/// One public call, the first a session makes after the restart: through a
/// C++ session, or a C ABI one (the other left empty).
struct idle_call {
  std::string name;
  std::function<void(rmmd::session const&)> cpp{};
  std::function<rmmd_status(rmmd_session_t)> c{};
};

void PrintTo(idle_call const& call, std::ostream* os)
{
  *os << call.name;
}

::testing::AssertionResult c_ok(rmmd_status status)
{
  if (status == RMMD_SUCCESS) { return ::testing::AssertionSuccess(); }
  return ::testing::AssertionFailure()
         << rmmd_status_name(status) << ": " << rmmd_last_error_message();
}

/// A call as rmmctl makes it: a context, then the stub's method.
template <class Request, class Response>
void rmmctl_call(rmmd::session const& s,
                 grpc::Status (v1::Rmmd::Stub::*method)(grpc::ClientContext*,
                                                        Request const&,
                                                        Response*),
                 Request const& request = {})
{
  auto& impl = rmmd::detail::impl_of(s);
  Response reply;
  auto ctx    = impl.context();
  auto status = (impl.stub().*method)(ctx.get(), request, &reply);
  if (!status.ok()) { detail::throw_status(status, "rmmctl's call"); }
}

class IdleRestart : public ::testing::TestWithParam<idle_call> {
 protected:
  void SetUp() override
  {
    ASSERT_TRUE(daemon_.start());
    // A persistent buffer, which the new daemon serves again (the store
    // keeps its fd).
    rmmd::session producer(
        rmmd::session::options{.runtime_dir = daemon_.runtime_dir(), .reconnect = 0ms});
    auto made = shared_buffer::create(
        producer, kept_name, buffer_bytes, {.pool = producer.host_pool().name, .persistent = true});
    made.set_manifest(buffer_manifest{.labels = {{"model", "idle"}}});
    made.publish();
    ASSERT_TRUE(daemon_.wait_for_stored(1)) << ::testing::PrintToString(daemon_.stored_buffers());
  }

  void restart()
  {
    ASSERT_TRUE(daemon_.manager().kill_service(SIGKILL));
    ASSERT_TRUE(daemon_.start());
  }

  managed_rmmd daemon_{
      {"--backend", "host", "--host-pool-bytes", "64MiB", "--drain-timeout-ms", "0"}};
};

TEST_P(IdleRestart, TheFirstCallAfterTheRestartReconnects)
{
  auto const& call = GetParam();
  auto const dir   = daemon_.runtime_dir();
  testing::internal::CaptureStderr();
  std::uint32_t reconnects = 0;
  if (call.cpp) {
    rmmd::session s(
        rmmd::session::options{.runtime_dir = dir, .client_name = "idle", .reconnect = 120s});
    restart();
    try {
      call.cpp(s);
    } catch (std::exception const& e) {
      ADD_FAILURE() << call.name << " threw: " << e.what();
    }
    reconnects = s.reconnects();
  } else {
    rmmd_session_options o{};
    o.size         = sizeof(o);
    o.runtime_dir  = dir.c_str();
    o.client_name  = "idle";
    o.reconnect_ms = 120000;
    rmmd_session_t c{};
    ASSERT_TRUE(c_ok(rmmd_session_create(&o, &c)));
    restart();
    EXPECT_TRUE(c_ok(call.c(c))) << call.name;
    EXPECT_TRUE(c_ok(rmmd_session_reconnects(c, &reconnects)));
    EXPECT_TRUE(c_ok(rmmd_session_destroy(c)));
  }
  auto const said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(reconnects, 1u) << said;
  EXPECT_THAT(said, HasSubstr("reconnected to the daemon at " + dir.string()));
}

/// Makes, publishes and closes a host buffer `name`, with a manifest.
void create_publish(rmmd::session const& s, std::string const& name)
{
  auto made = shared_buffer::create(s, name, buffer_bytes, {.pool = s.host_pool().name});
  made.set_manifest(buffer_manifest{.labels = {{"model", "fresh"}}});
  made.publish();
}

std::vector<idle_call> cpp_calls()
{
  using session = rmmd::session const&;
  return {
      {.name = "session_allocate_free",
       .cpp  = [](session s) { s.free(s.allocate(s.host_pool().id, 4096, 256).id); }},
      {.name = "host_memory_resource",
       .cpp =
           [](session s) {
             rmmd::host_memory_resource mr(s);
             mr.deallocate_sync(mr.allocate_sync(4096, 256), 4096, 256);
           }},
      {.name = "session_report_usage",
       .cpp =
           [](session s) {
             static_cast<void>(s.report_usage({carved_usage{.pool_id = s.host_pool().id}}));
           }},
      {.name = "shared_buffer_create_publish",
       .cpp  = [](session s) { create_publish(s, "idle/new"); }},
      {.name = "shared_buffer_open",
       .cpp  = [](session s) { static_cast<void>(shared_buffer::open(s, kept_name)); }},
      {.name = "shared_buffer_open_with_options",
       .cpp =
           [](session s) {
             static_cast<void>(shared_buffer::open(
                 s, kept_name, open_options{.expect_labels = {{"model", "idle"}}}));
           }},
      {.name = "shared_buffer_open_by_labels",
       .cpp =
           [](session s) {
             static_cast<void>(shared_buffer::open_by_labels(s, {{"model", "idle"}}));
           }},
      {.name = "shared_buffer_list",
       .cpp =
           [](session s) {
             if (shared_buffer::list(s).size() != 1) { throw std::runtime_error("not listed"); }
           }},
      {.name = "shared_buffer_describe",
       .cpp  = [](session s) { static_cast<void>(shared_buffer::describe(s, kept_name)); }},
      {.name = "shared_buffer_remove",
       .cpp  = [](session s) { static_cast<void>(shared_buffer::remove(s, kept_name)); }},
      {.name = "ping",
       .cpp =
           [](session s) {
             if (auto st = rmmd::detail::impl_of(s).ping(); !st.ok()) {
               detail::throw_status(st, "ping");
             }
           }},
      {.name = "list_peers",
       .cpp =
           [](session s) {
             v1::ListPeersResponse peers;
             if (auto st = rmmd::detail::impl_of(s).list_peers(&peers); !st.ok()) {
               detail::throw_status(st, "peers");
             }
           }},
      {.name = "rmmctl_stats",
       .cpp =
           [](session s) {
             rmmctl_call<v1::GetStatsRequest, v1::Stats>(s, &v1::Rmmd::Stub::GetStats);
           }},
      {.name = "rmmctl_pools",
       .cpp =
           [](session s) {
             rmmctl_call<v1::ListPoolsRequest, v1::ListPoolsResponse>(s,
                                                                      &v1::Rmmd::Stub::ListPools);
           }},
      {.name = "rmmctl_sessions",
       .cpp =
           [](session s) {
             rmmctl_call<v1::ListSessionsRequest, v1::ListSessionsResponse>(
                 s, &v1::Rmmd::Stub::ListSessions);
           }},
      {.name = "rmmctl_buffers",
       .cpp =
           [](session s) {
             rmmctl_call<v1::ListBuffersRequest, v1::ListBuffersResponse>(
                 s, &v1::Rmmd::Stub::ListBuffers);
           }},
      {.name = "rmmctl_buffers_describe",
       .cpp =
           [](session s) {
             v1::DescribeBufferRequest request;
             request.set_name(kept_name);
             rmmctl_call(s, &v1::Rmmd::Stub::DescribeBuffer, request);
           }},
      {.name = "rmmctl_buffers_delete",
       .cpp =
           [](session s) {
             v1::DeleteBufferRequest request;
             request.set_name(kept_name);
             rmmctl_call(s, &v1::Rmmd::Stub::DeleteBuffer, request);
           }},
      {.name = "rmmctl_trim",
       .cpp =
           [](session s) {
             rmmctl_call<v1::TrimRequest, v1::TrimResponse>(s, &v1::Rmmd::Stub::Trim);
           }},
      {.name = "rmmctl_health",
       .cpp =
           [](session s) {
             rmmctl_call<v1::HealthRequest, v1::HealthResponse>(s, &v1::Rmmd::Stub::Health);
           }},
  };
}

/// Frees `json` and says whether the call succeeded. `json` by reference: it
/// is read once the call (the other argument, evaluated in either order) has
/// written it.
rmmd_status took_json(rmmd_status status, char* const& json)
{
  rmmd_string_free(json);
  return status;
}

/// The kept buffer, opened with options (the fingerprint guard).
rmmd_status c_open_with(rmmd_session_t c)
{
  char const* keys[]   = {"model"};
  char const* values[] = {"idle"};
  rmmd_open_options o{};
  o.size          = sizeof(o);
  o.expect_keys   = keys;
  o.expect_values = values;
  o.expect_count  = 1;
  rmmd_buffer_t b{};
  auto const status = rmmd_buffer_open_with(c, kept_name, &o, &b);
  rmmd_buffer_destroy(b);
  return status;
}

rmmd_status c_open_by_labels(rmmd_session_t c)
{
  char const* keys[]   = {"model"};
  char const* values[] = {"idle"};
  rmmd_buffer_t b{};
  auto const status = rmmd_buffer_open_by_labels(c, keys, values, 1, nullptr, &b);
  rmmd_buffer_destroy(b);
  return status;
}

rmmd_status c_create_publish(rmmd_session_t c)
{
  rmmd_buffer_options o{};
  o.size   = sizeof(o);
  o.pool   = "host";
  o.device = -1;
  rmmd_buffer_t b{};
  if (auto s = rmmd_buffer_create(c, "idle/new", buffer_bytes, &o, &b); s != RMMD_SUCCESS) {
    return s;
  }
  auto status = rmmd_buffer_set_manifest_json(b, R"({"labels":[{"key":"model","value":"c"}]})");
  if (status == RMMD_SUCCESS) { status = rmmd_buffer_publish(b); }
  rmmd_buffer_destroy(b);
  return status;
}

rmmd_status c_allocate(rmmd_session_t c)
{
  rmmd_resource_options o{};
  o.size   = sizeof(o);
  o.kind   = RMMD_RESOURCE_HOST;
  o.device = -1;
  rmmd_resource_t r{};
  if (auto s = rmmd_resource_create(c, &o, &r); s != RMMD_SUCCESS) { return s; }
  void* p{};
  auto status = rmmd_allocate(r, 4096, 256, nullptr, &p);
  if (status == RMMD_SUCCESS) { status = rmmd_deallocate(r, p, 4096, 256, nullptr); }
  rmmd_resource_destroy(r);
  return status;
}

std::vector<idle_call> c_calls()
{
  return {
      {.name = "c_session_stats_json",
       .c =
           [](rmmd_session_t c) {
             char* json{};
             return took_json(rmmd_session_stats_json(c, &json), json);
           }},
      {.name = "c_allocate", .c = c_allocate},
      {.name = "c_buffer_create_publish", .c = c_create_publish},
      {.name = "c_buffer_open",
       .c =
           [](rmmd_session_t c) {
             rmmd_buffer_t b{};
             auto const status = rmmd_buffer_open(c, kept_name, 0, &b);
             rmmd_buffer_destroy(b);
             return status;
           }},
      {.name = "c_buffer_open_with", .c = c_open_with},
      {.name = "c_buffer_open_by_labels", .c = c_open_by_labels},
      {.name = "c_buffer_delete",
       .c    = [](rmmd_session_t c) { return rmmd_buffer_delete(c, kept_name, nullptr); }},
      {.name = "c_buffer_list_json",
       .c =
           [](rmmd_session_t c) {
             char* json{};
             return took_json(rmmd_buffer_list_json(c, nullptr, nullptr, nullptr, 0, &json), json);
           }},
      {.name = "c_buffer_describe_json",
       .c =
           [](rmmd_session_t c) {
             char* json{};
             return took_json(rmmd_buffer_describe_json(c, kept_name, &json), json);
           }},
      {.name = "c_peers_json",
       .c =
           [](rmmd_session_t c) {
             char* json{};
             return took_json(rmmd_peers_json(c, &json), json);
           }},
  };
}

std::vector<idle_call> every_call()
{
  auto all = cpp_calls();
  auto c   = c_calls();
  all.insert(all.end(), c.begin(), c.end());
  return all;
}

INSTANTIATE_TEST_SUITE_P(EveryCall,
                         IdleRestart,
                         ::testing::ValuesIn(every_call()),
                         [](::testing::TestParamInfo<idle_call> const& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace rmmd::test
