// The real daemon under SIGTERM (graceful drain) and SIGHUP (reload), with
// real client sessions; it tells the test what it did through its log and
// sd_notify, which the test waits on.

#include "harness/raw_session.hpp"
#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/test_clients.hpp"

#include <rmmd/error.hpp>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "rmmd/v1/rmmd.grpc.pb.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t KiB = 1024;

/// A session socket connection made by hand, its hello sent, whether or not
/// the daemon has taken it yet.
int connect_and_say_hello(std::filesystem::path const& runtime_dir)
{
  int const fd = harness::connect_session_socket(runtime_dir);
  v1::SessionHello hello;
  hello.set_protocol_version(1);
  hello.set_client_name("queued");
  auto const bytes = hello.SerializeAsString();
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    auto const error = errno;
    ::close(fd);
    throw std::system_error(error, std::generic_category(), "send the hello");
  }
  return fd;
}

/// True once opening a session fails because no daemon listens any more.
bool new_sessions_refused(logged_daemon const& daemon)
{
  try {
    (void)daemon.open_session("late");
    return false;
  } catch (rmmd::session_error const&) {
    return true;
  }
}

TEST(Drain, ALiveClientKeepsWorkingUntilItLeavesAndNewSessionsAreRefused)
{
  logged_daemon daemon({"--backend", "host", "--drain-timeout-ms", "20000"});
  auto client      = std::make_optional(daemon.open_session("worker"));
  auto const pool  = client->host_pool().id;
  auto const first = client->allocate(pool, 4 * KiB, 0);

  daemon.process().kill(SIGTERM);
  auto const stopping = daemon.wait_notify("STOPPING=1");
  ASSERT_TRUE(stopping);
  // systemd's stop timeout is stretched to the deadline plus 10 s.
  EXPECT_THAT(*stopping, HasSubstr("EXTEND_TIMEOUT_USEC=30000000"));
  EXPECT_TRUE(eventually([&] { return new_sessions_refused(daemon); }));

  // The live session carries on: it allocates, frees and reads stats.
  auto const second = client->allocate(pool, 8 * KiB, 0);
  client->free(first.id);
  EXPECT_EQ(in_use(stats_of(*client), pool), 8 * KiB);
  EXPECT_FALSE(daemon.process().wait(std::chrono::milliseconds(0)).has_value());
  EXPECT_TRUE(daemon.wait_notify("STATUS=draining: 1 session(s) left"));
  client->free(second.id);

  // Once it leaves, the daemon stops at once, long before the deadline.
  auto const left = clock_type::now();
  client.reset();
  EXPECT_EQ(daemon.process().wait(std::chrono::seconds(15)), 0);
  EXPECT_LT(clock_type::now() - left, std::chrono::seconds(10));
  EXPECT_TRUE(daemon.wait_log("stopped"));
  EXPECT_THAT(daemon.log(), HasSubstr("waiting up to 20000 ms for 1 session(s) to end"));
}

TEST(Drain, TheDeadlineEndsSessionsThatStay)
{
  logged_daemon daemon({"--backend", "host", "--drain-timeout-ms", "300"});
  // Not reconnecting (that would wait for a daemon to come back first).
  rmmd::session client(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                              .client_name = "stays",
                                              .reconnect   = std::chrono::milliseconds(0)});
  auto const pool = client.host_pool().id;
  (void)client.allocate(pool, 4 * KiB, 0);
  daemon.process().kill(SIGTERM);
  EXPECT_EQ(daemon.process().wait(std::chrono::seconds(15)), 0);
  EXPECT_TRUE(daemon.wait_log("drain deadline passed with 1 session(s) open"));
  try {
    (void)client.allocate(pool, 4 * KiB, 0);
    FAIL() << "allocate succeeded after the daemon stopped";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("allocate 4096 bytes"));
  }
}

TEST(Drain, AnIdleDaemonStopsPromptlyWhileAClientChannelIsOpen)
{
  // gRPC's Shutdown(deadline) waits out the whole deadline while any client
  // keeps a channel open; the daemon must not.
  logged_daemon daemon({"--backend", "host", "--drain-timeout-ms", "20000"});
  auto channel = grpc::CreateChannel("unix:" + (daemon.runtime_dir() / "rmmd.sock").string(),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  v1::Stats stats;
  // No token: refused, but the channel is now connected and stays open.
  ASSERT_EQ(v1::Rmmd::NewStub(channel)->GetStats(&ctx, {}, &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto const start = clock_type::now();
  daemon.process().kill(SIGTERM);
  EXPECT_EQ(daemon.process().wait(std::chrono::seconds(15)), 0);
  EXPECT_LT(clock_type::now() - start, std::chrono::seconds(3));
}

TEST(Drain, ConnectionsQueuedWhenTheDrainBeginsAreAnsweredNotReset)
{
  // Stopped, the daemon takes no connection: these wait in the socket's
  // backlog, hellos sent, more than its loop takes in one turn (64), and the
  // SIGTERM finds them there once it runs again. Each is welcomed (taken
  // before the drain began) or refused as draining; none may find only a
  // closed socket, as clients did when the drain closed the backlog.
  logged_daemon daemon({"--backend", "host", "--drain-timeout-ms", "20000"});
  daemon.process().kill(SIGSTOP);
  constexpr int queued = 120;  // the backlog holds 128
  std::vector<int> fds;
  try {
    for (int i = 0; i < queued; ++i) { fds.push_back(connect_and_say_hello(daemon.runtime_dir())); }
  } catch (...) {
    daemon.process().kill(SIGCONT);
    for (int fd : fds) { ::close(fd); }
    throw;
  }
  daemon.process().kill(SIGTERM);
  daemon.process().kill(SIGCONT);
  int welcomed = 0;
  int refused  = 0;
  for (int fd : fds) {
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string buffer(1 << 16, '\0');
    auto const n     = ::recv(fd, buffer.data(), buffer.size(), 0);
    auto const error = errno;
    ::close(fd);  // a welcomed session ends here
    EXPECT_GT(n, 0) << "a queued connection ended without an answer: "
                    << (n < 0 ? std::strerror(error) : "end of file");
    if (n <= 0) { continue; }
    v1::SessionWelcome welcome;
    if (!welcome.ParseFromArray(buffer.data(), static_cast<int>(n))) {
      ADD_FAILURE() << "a queued connection's answer is no SessionWelcome";
      continue;
    }
    if (!welcome.has_error()) {
      ++welcomed;
      continue;
    }
    ++refused;
    EXPECT_THAT(welcome.error().message(), HasSubstr("draining"));
  }
  EXPECT_EQ(welcomed + refused, queued);
  EXPECT_EQ(daemon.process().wait(std::chrono::seconds(15)), 0);
}

TEST(Drain, ASecondSigtermEndsTheDrain)
{
  logged_daemon daemon({"--backend", "host", "--drain-timeout-ms", "60000"});
  auto client = daemon.open_session("stays");
  daemon.process().kill(SIGTERM);
  ASSERT_TRUE(daemon.wait_notify("STOPPING=1"));
  daemon.process().kill(SIGTERM);
  EXPECT_EQ(daemon.process().wait(std::chrono::seconds(15)), 0);
  EXPECT_TRUE(daemon.wait_log("Terminated again: closing 1 session(s) now"));
}

TEST(Status, TheStatusLineFollowsTheSessionCount)
{
  logged_daemon daemon({"--backend", "host"});
  auto client = daemon.open_session("counted");
  EXPECT_TRUE(daemon.wait_notify("STATUS=serving 1 pool(s), 1 session(s)"));
}

/// A daemon started on a configuration file the test rewrites and reloads.
class Reload : public ::testing::Test {
 protected:
  static std::string config(std::string const& extra)
  {
    return "pools { name: \"host\" backend: HOST capacity_bytes: 16777216 }\n" + extra;
  }
  void start(std::string const& text)
  {
    path_   = dir_.write("rmmd.conf", text);
    daemon_ = std::make_unique<logged_daemon>(std::vector<std::string>{"--config", path_.string()});
  }
  /// Rewrites the file, sends SIGHUP and waits for the daemon's verdict line.
  std::optional<std::string> reload(std::string const& text, std::string_view verdict)
  {
    dir_.write("rmmd.conf", text);
    daemon_->process().kill(SIGHUP);
    return daemon_->wait_log(verdict);
  }

  scratch_dir dir_;
  std::filesystem::path path_;
  std::unique_ptr<logged_daemon> daemon_;
};

TEST_F(Reload, ALoweredQuotaRefusesTheNextAllocationAndTheSessionSurvives)
{
  start(config("quotas { per_session_bytes: 1048576 }\n"));
  auto client     = daemon_->open_session("holder");
  auto const pool = client.host_pool().id;
  auto const held = client.allocate(pool, 512 * KiB, 0);

  ASSERT_TRUE(reload(config("quotas { per_session_bytes: 262144 }\n"), "reloaded"))
      << daemon_->log();
  EXPECT_TRUE(daemon_->wait_notify("READY=1"));  // systemd's reload is over
  try {
    (void)client.allocate(pool, 4 * KiB, 0);
    FAIL() << "an allocation over the lowered quota succeeded";
  } catch (rmm::out_of_memory const& e) {
    EXPECT_THAT(e.what(), HasSubstr("quota of 262144 bytes"));
  }
  // What it held stays held, and stays its own to free.
  EXPECT_EQ(in_use(stats_of(client), pool), 512 * KiB);
  client.free(held.id);
  (void)client.allocate(pool, 256 * KiB, 0);
  auto other = daemon_->open_session("newcomer");
  EXPECT_THROW((void)other.allocate(pool, 256 * KiB + 4 * KiB, 0), rmm::out_of_memory);
}

TEST_F(Reload, NewAllowedIdsApplyToNewSessionsOnly)
{
  start(config(""));
  auto client     = daemon_->open_session("before");
  auto const pool = client.host_pool().id;
  auto other      = std::to_string(::getuid() == 4242 ? 4243 : 4242);
  ASSERT_TRUE(reload(config("allowed_uids: " + other + "\n"), "reloaded")) << daemon_->log();
  EXPECT_THROW((void)daemon_->open_session("after"), rmmd::permission_error);
  (void)client.allocate(pool, 4 * KiB, 0);  // the open session is not dropped
}

TEST_F(Reload, ABadFileIsRejectedWithItsLineAndTheOldSettingsStay)
{
  start(config("quotas { per_session_bytes: 1048576 }\n"));
  auto client     = daemon_->open_session("holder");
  auto const pool = client.host_pool().id;
  auto line =
      reload(config("quotas { per_session_bytes: 4096 }\nsocket_mode: \"0999\"\n"), "is rejected");
  ASSERT_TRUE(line) << daemon_->log();
  EXPECT_THAT(daemon_->log(),
              HasSubstr(path_.string() + ":3:1: socket_mode \"0999\" is not an octal"));
  // Still the old quota (1 MiB, not 4 KiB), still alive, still serving.
  (void)client.allocate(pool, 512 * KiB, 0);
  (void)daemon_->open_session("still-serving");
  EXPECT_FALSE(daemon_->process().wait(std::chrono::milliseconds(0)).has_value());
  // A syntax error is rejected the same way.
  ASSERT_TRUE(reload(config("quotas { per_session_bytes: 4096 \n"), "is rejected"));
  EXPECT_THAT(daemon_->log(), HasSubstr(path_.string() + ":3:1: "));
  (void)client.allocate(pool, 256 * KiB, 0);
}

TEST_F(Reload, PoolChangesNeedARestartAndTheRestIsApplied)
{
  start(config(""));
  auto client = daemon_->open_session("holder");
  auto line   = reload(
      "pools { name: \"host\" backend: HOST capacity_bytes: 33554432 }\n"
        "quotas { per_session_bytes: 8192 }\n",
      "reloaded");
  ASSERT_TRUE(line) << daemon_->log();
  EXPECT_THAT(*line,
              HasSubstr("applied quotas.per_session_bytes=8192; needs a restart (ignored until "
                        "then): pools"));
  EXPECT_EQ(stats_of(client).pools(0).pool().capacity_bytes(), 16777216u);
  EXPECT_THROW((void)client.allocate(client.host_pool().id, 16 * KiB, 0), rmm::out_of_memory);
}

TEST_F(Reload, TheLogLevelChanges)
{
  start(config("log_level: ERROR\n"));
  {
    auto quiet = daemon_->open_session("quiet");  // "session N opened" is an info line
  }
  ASSERT_TRUE(reload(config("log_level: INFO\n"), "reloaded")) << daemon_->log();
  EXPECT_THAT(daemon_->log(), ::testing::Not(HasSubstr("session 1 opened")));
  auto loud = daemon_->open_session("loud");
  EXPECT_TRUE(daemon_->wait_log("opened"));
}

/// Another process's allocation of `bytes` from the host pool: its first
/// line, "allocated MS" or "refused MS MESSAGE".
std::string allocate_in_another_process(logged_daemon const& daemon, std::size_t bytes)
{
  auto c      = allocating_client(daemon.runtime_dir(), bytes);
  auto answer = c->read_line(30s).value_or("(nothing)");
  c->close_stdin();
  EXPECT_EQ(c->wait(), 0);
  return answer;
}

/// The file of the test below, before (`after` false) and after the reload:
/// every reloadable field differs, and one restart-only field
/// (hello_timeout_ms).
std::string every_field(bool after, uid_t me, uid_t other)
{
  auto pick = [&](auto before, auto then) { return std::to_string(after ? then : before); };
  return "pools { name: \"host\" backend: HOST capacity_bytes: 50331648 }\n"
         "allowed_uids: [" +
         std::to_string(me) + (after ? ", " + std::to_string(other) : "") +
         "]\n"
         "allowed_gids: [4242" +
         std::string(after ? ", 4243" : "") +
         "]\n"
         "quotas { per_session_bytes: " +
         pick(67108864, 16777216) + " per_uid_bytes: " + pick(1073741824, 2147483648) +
         " uid_overrides { uid: " + std::to_string(other) + " bytes: " + pick(1048576, 2097152) +
         " } }\n"
         "admission { max_pending_per_uid: " +
         pick(16, 8) + " max_pending_total: " + pick(256, 128) +
         " max_sessions_per_uid: " + pick(1024, 512) + " max_sessions_total: " + pick(16384, 8192) +
         " }\n"
         "drain_timeout_ms: " +
         pick(5000, 1234) +
         "\n"
         "hello_timeout_ms: " +
         pick(2000, 3000) +
         "\n"
         "reclaim_timeout_ms: " +
         pick(0, 10000) +
         "\n"
         "pack_up_to_bytes: " +
         pick(65536, 4096) +
         "\n"
         "metrics_top_sessions: " +
         pick(10, 3) +
         "\n"
         "log_level: " +
         (after ? "INFO" : "ERROR") + "\n";
}

TEST_F(Reload, EveryReloadableFieldIsAppliedAndNamedAndARestartOnlyOneIsNamed)
{
  constexpr std::size_t MiB = 1024 * KiB;
  uid_t const me            = ::getuid();
  uid_t const other         = me == 4244 ? 4245 : 4244;
  start(every_field(false, me, other));
  auto holder = daemon_->open_session("holder");

  // reclaim_timeout_ms 0: a request only idle slabs could serve is refused at once.
  auto idle =
      idle_client(daemon_->runtime_dir(), 12, 4 * MiB);  // the 48 MiB pool, full of idle slabs
  auto const refused = allocate_in_another_process(*daemon_, 8 * MiB);
  EXPECT_THAT(refused, ::testing::StartsWith("refused ")) << refused;
  EXPECT_EQ(stats_of(holder).pools(0).reclaim_waits(), 0u);

  auto line = reload(every_field(true, me, other), "reloaded");
  ASSERT_TRUE(line) << daemon_->log();
  for (auto const& applied :
       {"allowed_uids/allowed_users=[" + std::to_string(me) + "," + std::to_string(other) + "]",
        std::string("allowed_gids/allowed_groups=[4242,4243]"),
        std::string("quotas.per_session_bytes=16777216"),
        std::string("quotas.per_uid_bytes=2147483648"),
        "quotas.uid_overrides={" + std::to_string(other) + ":2097152}",
        std::string("admission.max_pending_per_uid=8"),
        std::string("admission.max_pending_total=128"),
        std::string("admission.max_sessions_per_uid=512"),
        std::string("admission.max_sessions_total=8192"),
        std::string("drain_timeout_ms=1234"),
        std::string("reclaim_timeout_ms=10000"),
        std::string("pack_up_to_bytes=4096"),
        std::string("metrics_top_sessions=3"),
        std::string("log_level=info")}) {
    EXPECT_THAT(*line, HasSubstr(applied)) << *line;
  }
  EXPECT_THAT(*line, HasSubstr("needs a restart (ignored until then): hello_timeout_ms")) << *line;

  // reclaim_timeout_ms 10000: the same request now waits for the idle slabs and is served.
  auto const served = allocate_in_another_process(*daemon_, 8 * MiB);
  EXPECT_THAT(served, ::testing::StartsWith("allocated ")) << served;
  auto const stats = stats_of(holder);
  EXPECT_EQ(stats.pools(0).reclaim_waits(), 1u);
  EXPECT_EQ(stats.pools(0).reclaim_served(), 1u);
  idle->close_stdin();
  EXPECT_EQ(idle->wait(), 0);

  // quotas.per_session_bytes, lowered to 16 MiB.
  EXPECT_THROW((void)holder.allocate(holder.host_pool().id, 17 * MiB, 0), rmm::out_of_memory);
  // log_level INFO: a new session is logged.
  auto newcomer = daemon_->open_session("newcomer");
  EXPECT_TRUE(daemon_->wait_log("opened"));
  // drain_timeout_ms 1234.
  daemon_->process().kill(SIGTERM);
  EXPECT_TRUE(daemon_->wait_log("waiting up to 1234 ms for 2 session(s) to end")) << daemon_->log();
}

}  // namespace
}  // namespace rmmd::test
