// rmmctl against the real daemon (host pool): every command as a table and as
// --json, --watch, and the exit codes and messages when there is no daemon or
// the caller may not do what it asks.

#include "tests/tools/daemon_process.hpp"

#include <google/protobuf/util/json_util.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <sstream>

namespace rmmd::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// rmmctl's exit codes (client/rmmctl/daemon_connection.hpp, docs/operations.md).
constexpr int exit_ok = 0, exit_failed = 1, exit_usage = 2, exit_not_running = 3, exit_denied = 4;

constexpr uid_t nobody = 65534;

struct ctl_result {
  int status{-1};
  std::string out;  ///< stdout, and stderr too when asked
};

/// Runs rmmctl with `args`; `as_nobody` runs it as uid/gid 65534 (the test
/// runs as root for that) through setpriv.
ctl_result rmmctl(std::vector<std::string> args,
                  bool merge_stderr            = false,
                  bool as_nobody               = false,
                  std::vector<std::string> env = {})
{
  std::vector<std::string> argv;
  if (as_nobody) {
    argv = {"/usr/bin/setpriv",
            "--reuid=" + std::to_string(nobody),
            "--regid=" + std::to_string(nobody),
            "--clear-groups",
            "--"};
  }
  argv.push_back(program_path("rmmctl").string());
  argv.insert(argv.end(), args.begin(), args.end());
  child_process p(argv, env, {.merge_stderr = merge_stderr});
  p.close_stdin();
  ctl_result r;
  r.out    = p.read_all();
  r.status = p.wait().value_or(-1);
  return r;
}

std::vector<std::string> in(daemon_process const& d, std::vector<std::string> args)
{
  args.insert(args.begin(), {"--runtime-dir", d.runtime_dir().string()});
  return args;
}

template <typename Message>
Message parse_json(std::string const& text)
{
  Message m;
  auto status = google::protobuf::util::JsonStringToMessage(text, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << text;
  return m;
}

std::vector<std::string> lines_of(std::string const& text)
{
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) { out.push_back(line); }
  return out;
}

/// A daemon with one client ("worker") holding 1 MiB and 64 KiB, as a node
/// would have.
class Rmmctl : public ::testing::Test {
 protected:
  void SetUp() override
  {
    big_   = worker_.allocate(pool_, 1 << 20, 0);
    small_ = worker_.allocate(pool_, 64 << 10, 0);
  }

  // The host pool only, so the tables are the same on a GPU node.
  daemon_process daemon_{{"--host-pool-bytes", "64MiB", "--backend", "host"}};
  rmmd::session worker_ = daemon_.open_session("worker");
  std::uint32_t pool_   = worker_.host_pool().id;
  rmmd::lease big_, small_;
};

TEST_F(Rmmctl, StatsTableAndJson)
{
  auto table = rmmctl(in(daemon_, {"stats"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  EXPECT_THAT(table.out,
              AllOf(HasSubstr("POOL"),
                    HasSubstr("HIGH WATER"),
                    HasSubstr("host"),
                    HasSubstr("64.00 MiB"),
                    HasSubstr("1.06 MiB"),
                    HasSubstr("worker")));
  EXPECT_THAT(table.out, Not(HasSubstr("rmmctl")));  // its own session is left out

  auto json = rmmctl(in(daemon_, {"stats", "--json"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto stats = parse_json<v1::Stats>(json.out);
  ASSERT_EQ(stats.pools_size(), 1);
  EXPECT_EQ(stats.pools(0).pool().name(), "host");
  EXPECT_EQ(stats.pools(0).in_use_bytes(), (1u << 20) + (64u << 10));
  EXPECT_EQ(stats.pools(0).allocation_count(), 2u);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).client_name(), "worker");
  EXPECT_EQ(stats.sessions(0).session_id(), worker_.id());
}

TEST_F(Rmmctl, PoolsTableAndJson)
{
  worker_.free(big_.id);  // the high-water mark stays where it was
  auto table = rmmctl(in(daemon_, {"pools"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  auto rows = lines_of(table.out);
  ASSERT_EQ(rows.size(), 2u) << table.out;
  EXPECT_THAT(rows[0],
              AllOf(HasSubstr("HANDLES"),
                    HasSubstr("RELEASE THRESHOLD"),
                    HasSubstr("TOTAL ALLOCS"),
                    HasSubstr("DRIVER RESERVED")));
  EXPECT_THAT(rows[1],
              AllOf(HasSubstr("host"),
                    HasSubstr("host-offset"),
                    HasSubstr("64.00 KiB"),
                    HasSubstr("1.06 MiB")));

  auto json = rmmctl(in(daemon_, {"pools", "--json"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto pools = parse_json<v1::ListPoolsResponse>(json.out);
  ASSERT_EQ(pools.pools_size(), 1);
  auto const& p = pools.pools(0);
  EXPECT_EQ(p.pool().backend(), v1::BACKEND_HOST);
  EXPECT_EQ(p.pool().device(), -1);
  ASSERT_EQ(p.pool().handle_types_size(), 1);
  EXPECT_EQ(p.pool().handle_types(0), v1::HANDLE_TYPE_HOST_OFFSET);
  EXPECT_EQ(p.pool().capacity_bytes(), 64u << 20);
  EXPECT_EQ(p.in_use_bytes(), 64u << 10);
  EXPECT_EQ(p.high_water_bytes(), (1u << 20) + (64u << 10));
  EXPECT_EQ(p.allocation_count(), 1u);
  EXPECT_EQ(p.total_allocations(), 2u);
  EXPECT_FALSE(p.has_release_threshold_bytes());  // host pools have none
  EXPECT_FALSE(p.has_backend_reserved_bytes());
}

TEST_F(Rmmctl, SessionsTableAndJson)
{
  auto table = rmmctl(in(daemon_, {"sessions"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  auto rows = lines_of(table.out);
  ASSERT_EQ(rows.size(), 2u) << table.out;  // the header and the worker, not rmmctl
  EXPECT_THAT(
      rows[1],
      AllOf(HasSubstr("worker"), HasSubstr(std::to_string(::getpid())), HasSubstr("1.06 MiB")));

  auto json = rmmctl(in(daemon_, {"sessions", "--json"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto sessions = parse_json<v1::ListSessionsResponse>(json.out);
  ASSERT_EQ(sessions.sessions_size(), 1);
  auto const& s = sessions.sessions(0);
  EXPECT_EQ(s.pid(), ::getpid());
  EXPECT_EQ(s.uid(), ::getuid());
  EXPECT_EQ(s.bytes(), (1u << 20) + (64u << 10));
  EXPECT_EQ(s.allocation_count(), 2u);
  EXPECT_GT(s.started_unix_ms(), 0);
}

TEST_F(Rmmctl, HealthTableAndJson)
{
  auto table = rmmctl(in(daemon_, {"health"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  EXPECT_THAT(table.out,
              AllOf(HasSubstr("STATUS    serving"),
                    HasSubstr("POOLS     1"),
                    HasSubstr("SESSIONS  1"),
                    HasSubstr("METRICS   off"),
                    HasSubstr("PID       " + std::to_string(daemon_.process().pid()))));

  auto json = rmmctl(in(daemon_, {"health", "--json"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto h = parse_json<v1::HealthResponse>(json.out);
  EXPECT_EQ(h.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_FALSE(h.version().empty());
  EXPECT_THAT(table.out, HasSubstr("VERSION   " + h.version()));
  EXPECT_EQ(h.pool_count(), 1u);
  EXPECT_EQ(h.session_count(), 1u);  // health opens no session of its own
  EXPECT_EQ(h.pid(), daemon_.process().pid());
  EXPECT_TRUE(h.metrics_address().empty());
  EXPECT_GT(h.started_unix_ms(), 0);
}

TEST_F(Rmmctl, TrimTableAndJson)
{
  auto table = rmmctl(in(daemon_, {"trim"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  auto rows = lines_of(table.out);
  ASSERT_EQ(rows.size(), 2u) << table.out;
  EXPECT_THAT(rows[0], HasSubstr("RELEASED"));
  EXPECT_THAT(rows[1], AllOf(HasSubstr("host"), HasSubstr("0 B")));

  auto json = rmmctl(in(daemon_, {"trim", "--json", "--pool", "host"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto t = parse_json<v1::TrimResponse>(json.out);
  ASSERT_EQ(t.pools_size(), 1);
  EXPECT_EQ(t.pools(0).name(), "host");
  EXPECT_EQ(t.pools(0).released_bytes(), 0u);  // host pools give pages back on free already
  // Trimming takes nothing a client holds.
  EXPECT_EQ(in_use(daemon_.stats()), (1u << 20) + (64u << 10));

  auto by_id = rmmctl(in(daemon_, {"trim", "--pool", std::to_string(pool_)}));
  EXPECT_EQ(by_id.status, exit_ok) << by_id.out;
  auto unknown = rmmctl(in(daemon_, {"trim", "--pool", "gpu7"}), true);
  EXPECT_EQ(unknown.status, exit_usage);
  EXPECT_THAT(unknown.out, HasSubstr("--pool gpu7: no such pool; this daemon has host (0)"));
}

TEST_F(Rmmctl, WatchRepeatsFramesWithoutClearingAPipe)
{
  auto table = rmmctl(in(daemon_, {"health", "--watch", "0.05", "--count", "3"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  EXPECT_EQ(table.out.find('\033'), std::string::npos);  // stdout is a pipe: no escapes
  std::size_t frames = 0;
  for (auto const& line : lines_of(table.out)) {
    if (line.starts_with("rmmctl health every 0.05s")) { ++frames; }
  }
  EXPECT_EQ(frames, 3u) << table.out;

  // JSON frames are JSON Lines: one document per line.
  auto json = rmmctl(in(daemon_, {"pools", "--json", "--watch", "0.05", "--count", "2"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto docs = lines_of(json.out);
  ASSERT_EQ(docs.size(), 2u) << json.out;
  for (auto const& doc : docs) {
    EXPECT_EQ(parse_json<v1::ListPoolsResponse>(doc).pools(0).in_use_bytes(),
              (1u << 20) + (64u << 10));
  }
}

TEST_F(Rmmctl, FindsTheDaemonThroughRmmdRuntimeDir)
{
  auto r = rmmctl(
      {"health", "--json"}, false, false, {"RMMD_RUNTIME_DIR=" + daemon_.runtime_dir().string()});
  ASSERT_EQ(r.status, exit_ok) << r.out;
  EXPECT_EQ(parse_json<v1::HealthResponse>(r.out).pid(), daemon_.process().pid());
}

TEST(RmmctlUsage, BadCommandLinesAreUsageErrors)
{
  EXPECT_EQ(rmmctl({}, true).status, exit_usage);
  EXPECT_EQ(rmmctl({"frobnicate"}, true).status, exit_usage);
  EXPECT_EQ(rmmctl({"stats", "--watch", "-1"}, true).status, exit_usage);
  EXPECT_EQ(rmmctl({"stats", "--count", "2"}, true).status, exit_usage);  // needs --watch
  auto trim = rmmctl({"trim", "--watch", "1"}, true);
  EXPECT_EQ(trim.status, exit_usage);
  EXPECT_THAT(trim.out, HasSubstr("--watch does not apply to trim"));
  EXPECT_EQ(rmmctl({"--help"}).status, exit_ok);
}

TEST(RmmctlUsage, OtherFailuresAreExitCode1)
{
  // A socket path longer than a Unix socket address can hold.
  auto r = rmmctl({"--runtime-dir", "/tmp/" + std::string(200, 'x'), "stats"}, true);
  EXPECT_EQ(r.status, exit_failed) << r.out;
  EXPECT_THAT(r.out, HasSubstr("runtime directory path too long"));
}

/// A runtime directory with no daemon in it, removed at the end.
struct empty_runtime_dir {
  empty_runtime_dir()
  {
    char tmpl[] = "/tmp/rmmctl-test-XXXXXX";
    path        = ::mkdtemp(tmpl);
  }
  ~empty_runtime_dir()
  {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  /// A socket file that nothing listens on, as a daemon killed with SIGKILL
  /// leaves behind.
  void stale_socket(std::string const& name, int type) const
  {
    int fd = ::socket(AF_UNIX, type, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    auto p          = (path / name).string();
    std::strncpy(addr.sun_path, p.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);  // bound, never listened: connect() is refused
  }
  std::filesystem::path path;
};

TEST(RmmctlNoDaemon, EveryCommandSaysSoWithExitCode3)
{
  empty_runtime_dir dir;
  for (std::string command : {"stats", "pools", "sessions", "trim"}) {
    auto r = rmmctl({"--runtime-dir", dir.path.string(), command}, true);
    EXPECT_EQ(r.status, exit_not_running) << command << ": " << r.out;
    EXPECT_THAT(
        r.out,
        AllOf(HasSubstr("no daemon is listening at " + (dir.path / "rmmd-session.sock").string()),
              HasSubstr("No such file or directory"),
              HasSubstr("is rmmd running?")))
        << command;
  }
  auto health = rmmctl({"--runtime-dir", dir.path.string(), "health"}, true);
  EXPECT_EQ(health.status, exit_not_running) << health.out;
  EXPECT_THAT(
      health.out,
      HasSubstr("rmmd is not running: there is no socket at " + (dir.path / "rmmd.sock").string()));
}

TEST(RmmctlNoDaemon, AStaleSocketIsConnectionRefusedWithExitCode3)
{
  empty_runtime_dir dir;
  dir.stale_socket("rmmd.sock", SOCK_STREAM);
  dir.stale_socket("rmmd-session.sock", SOCK_SEQPACKET);
  auto health = rmmctl({"--runtime-dir", dir.path.string(), "health"}, true);
  EXPECT_EQ(health.status, exit_not_running) << health.out;
  EXPECT_THAT(health.out,
              HasSubstr("nothing accepts connections at " + (dir.path / "rmmd.sock").string() +
                        " (connection refused"));
  auto stats = rmmctl({"--runtime-dir", dir.path.string(), "stats"}, true);
  EXPECT_EQ(stats.status, exit_not_running) << stats.out;
  EXPECT_THAT(stats.out, HasSubstr("Connection refused"));
}

TEST(RmmctlNoDaemon, ADaemonThatStoppedIsNotRunning)
{
  daemon_process daemon;
  auto const dir = daemon.runtime_dir().string();
  ASSERT_EQ(rmmctl({"--runtime-dir", dir, "health"}).status, exit_ok);
  ASSERT_EQ(daemon.stop(), 0);
  EXPECT_EQ(rmmctl({"--runtime-dir", dir, "stats"}, true).status, exit_not_running);
  EXPECT_EQ(rmmctl({"--runtime-dir", dir, "health"}, true).status, exit_not_running);
}

TEST(RmmctlPermission, AUidTheDaemonDoesNotAllowGetsExitCode4)
{
  auto other = std::to_string(::getuid() == 4242 ? 4243 : 4242);
  daemon_process daemon({"--allow-uid", other});
  auto const dir = daemon.runtime_dir().string();
  for (std::string command : {"stats", "pools", "sessions", "trim"}) {
    auto r = rmmctl({"--runtime-dir", dir, command}, true);
    EXPECT_EQ(r.status, exit_denied) << command << ": " << r.out;
    EXPECT_THAT(r.out,
                AllOf(HasSubstr("refused the session"),
                      HasSubstr("uid " + std::to_string(::getuid())),
                      HasSubstr("is not allowed to use this daemon")))
        << command;
  }
  // Health needs no session: it still answers.
  EXPECT_EQ(rmmctl({"--runtime-dir", dir, "health"}).status, exit_ok);
}

/// What only root can set up: running rmmctl as another uid.
bool can_run_as_nobody(std::string* why)
{
  if (::geteuid() != 0) {
    *why = "the test runs as uid " + std::to_string(::geteuid()) +
           "; running rmmctl as another uid needs root";
    return false;
  }
  if (::access("/usr/bin/setpriv", X_OK) != 0) {
    *why = "/usr/bin/setpriv (util-linux) is missing";
    return false;
  }
  // The build tree (or the libraries rmmctl loads) may sit below a directory
  // other users cannot enter, e.g. /root.
  auto probe = rmmctl({"--help"}, true, true);
  if (probe.status != 0) {
    *why = "uid 65534 cannot run " + program_path("rmmctl").string() +
           " (is a parent directory closed to other users?): " + probe.out;
    return false;
  }
  return true;
}

TEST(RmmctlPermission, SocketsTheCallerCannotOpenGetExitCode4)
{
  std::string why;
  if (!can_run_as_nobody(&why)) { GTEST_SKIP() << why; }
  daemon_process daemon;  // runtime directory 0700, sockets 0660, owned by root
  auto const dir = daemon.runtime_dir().string();
  auto stats     = rmmctl({"--runtime-dir", dir, "stats"}, true, true);
  EXPECT_EQ(stats.status, exit_denied) << stats.out;
  EXPECT_THAT(stats.out,
              AllOf(HasSubstr("no permission to connect to " + dir + "/rmmd-session.sock"),
                    HasSubstr("rmmd group")));
  auto health = rmmctl({"--runtime-dir", dir, "health"}, true, true);
  EXPECT_EQ(health.status, exit_denied) << health.out;
  EXPECT_THAT(health.out,
              AllOf(HasSubstr("permission denied connecting to " + dir + "/rmmd.sock"),
                    HasSubstr("uid 65534"),
                    HasSubstr("`rmmd` group")));
}

TEST(RmmctlPermission, TrimIsForRootAndTheDaemonsUidOnly)
{
  std::string why;
  if (!can_run_as_nobody(&why)) { GTEST_SKIP() << why; }
  // The daemon (root) lets root and nobody open sessions; the sockets are
  // opened up so nobody can reach them.
  daemon_process daemon({"--allow-uid", "0," + std::to_string(nobody)});
  auto const dir = daemon.runtime_dir();
  std::filesystem::permissions(dir, std::filesystem::perms(0755));
  for (auto name : {"rmmd.sock", "rmmd-session.sock"}) {
    std::filesystem::permissions(dir / name, std::filesystem::perms(0666));
  }
  auto stats = rmmctl({"--runtime-dir", dir.string(), "stats"}, true, true);
  EXPECT_EQ(stats.status, exit_ok) << stats.out;  // looking is for everyone allowed
  auto trim = rmmctl({"--runtime-dir", dir.string(), "trim"}, true, true);
  EXPECT_EQ(trim.status, exit_denied) << trim.out;
  EXPECT_THAT(trim.out,
              HasSubstr("trim: uid 65534 may not trim pools; only root (uid 0) and the "
                        "daemon's own uid 0 may"));
  EXPECT_EQ(rmmctl({"--runtime-dir", dir.string(), "trim"}).status, exit_ok);  // root may
}

}  // namespace
}  // namespace rmmd::test
