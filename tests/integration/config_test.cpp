// The configuration file seen from outside: `rmmd --check-config`, a daemon
// started on a file (and flags over it), and the files in deploy/ (the
// example configuration, the systemd unit).

#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/daemon_process.hpp"

#include <rmmd/error.hpp>

#include <cuda_runtime_api.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace fs = std::filesystem;

struct outcome {
  int status{};
  std::string out;  // stdout and stderr
};

/// Runs rmmd with `args` to its end, stdout and stderr together.
outcome run_rmmd(std::vector<std::string> args)
{
  args.insert(args.begin(), program_path("rmmd").string());
  child_process p(std::move(args), {}, {.merge_stderr = true});
  p.close_stdin();
  auto out    = p.read_all();
  auto status = p.wait();
  return {status.value_or(-1), out};
}

/// A file of the source tree, or nullopt where the tests run from a bundle.
std::optional<fs::path> source_file(std::string const& relative)
{
  fs::path path = fs::path(RMMD_SOURCE_DIR) / relative;
  if (!fs::exists(path)) { return std::nullopt; }
  return path;
}

TEST(CheckConfig, AGoodFileIsSummarised)
{
  scratch_dir dir;
  auto path = dir.write("good.conf",
                        "pools { name: \"staging\" backend: HOST capacity_bytes: 8388608 }\n"
                        "quotas { per_session_bytes: 1048576 }\n");
  auto r    = run_rmmd({"--check-config", path.string()});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, StartsWith(path.string() + ": OK\n"));
  EXPECT_THAT(r.out, HasSubstr("pool staging: host memory, 8388608 bytes"));
  EXPECT_THAT(r.out, HasSubstr("per session 1048576 bytes"));
}

TEST(CheckConfig, EveryErrorIsPrintedWithFileLineAndColumn)
{
  scratch_dir dir;
  auto path = dir.write("bad.conf",
                        "# two pools with one name\n"
                        "pools { name: \"a\" backend: HOST }\n"
                        "pools { name: \"a\" backend: CUDA limit_bytes: 10\n"
                        "        release_threshold_bytes: 20 }\n"
                        "allowed_users: \"no-such-user-rmmd\"\n");
  auto r    = run_rmmd({"--check-config", path.string()});
  EXPECT_EQ(r.status, 1);
  auto const f = path.string();
  EXPECT_EQ(r.out,
            f +
                ":3:9: pool name \"a\" is already used by the pool at line 2; pool names must be "
                "unique\n" +
                f +
                ":4:9: pool \"a\": release_threshold_bytes (20) is larger than limit_bytes "
                "(10); lower the threshold or raise the limit\n" +
                f +
                ":5:1: allowed_users: no user named \"no-such-user-rmmd\" on this system; give "
                "an existing user name or its uid in allowed_uids\n" +
                f + ": 3 error(s); rmmd would not start with this file\n");
}

TEST(CheckConfig, ASyntaxErrorNamesItsLine)
{
  scratch_dir dir;
  auto path = dir.write("syntax.conf", "log_level: INFO\npools { name: \"x\" backend: GPU }\n");
  auto r    = run_rmmd({"--check-config", path.string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out,
              StartsWith(path.string() +
                         ":2:32: Unknown enumeration value of \"GPU\" for field \"backend\"."));
}

TEST(CheckConfig, AMissingFileNamedExplicitlyIsAnError)
{
  scratch_dir dir;
  auto r = run_rmmd({"--check-config", (dir.path() / "absent.conf").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("absent.conf: cannot read the configuration file: No such file"));
}

TEST(CheckConfig, WithoutAFileItChecksTheOneTheDaemonWouldRead)
{
  scratch_dir dir;
  auto path = dir.write("rmmd.conf", "hello_timeout_ms: 0\n");
  auto r    = run_rmmd({"--config", path.string(), "--check-config"});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, StartsWith(path.string() + ":1:1: hello_timeout_ms 0 is out of range"));
  if (fs::exists("/etc/rmmd/rmmd.conf")) {
    GTEST_SKIP() << "/etc/rmmd/rmmd.conf exists here: the missing-default case cannot be shown";
  }
  auto defaults = run_rmmd({"--check-config"});
  EXPECT_EQ(defaults.status, 0) << defaults.out;
  EXPECT_THAT(
      defaults.out,
      StartsWith("/etc/rmmd/rmmd.conf: no such file; rmmd runs with the built-in defaults"));
}

TEST(Startup, ABadFileStopsTheDaemonWithItsErrors)
{
  scratch_dir dir;
  auto path = dir.write("rmmd.conf", "\nsocket_mode: \"0060\"\n");
  auto r    = run_rmmd({"--runtime-dir", dir.path().string(), "--config", path.string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr(path.string() + ":2:1: socket_mode \"0060\" must give the owner"));
  EXPECT_THAT(r.out, HasSubstr("not starting"));
}

TEST(Startup, AMissingFileNamedByConfigStopsTheDaemon)
{
  scratch_dir dir;
  auto r = run_rmmd(
      {"--runtime-dir", dir.path().string(), "--config", (dir.path() / "nope.conf").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("nope.conf: cannot read the configuration file"));
}

TEST(Startup, TheFileSetsTheDaemonUpAndFlagsOverrideSingleFields)
{
  scratch_dir dir;
  auto const* group = ::getgrnam("nogroup");
  std::string group_line =
      group != nullptr ? "socket_group: \"nogroup\"\n" : std::string();  // Debian's; else skip
  auto path = dir.write("rmmd.conf",
                        "pools { name: \"staging\" backend: HOST capacity_bytes: 8388608 }\n"
                        "pools { name: \"scratch\" backend: HOST capacity_bytes: 4194304 }\n"
                        "quotas { per_session_bytes: 1048576 }\n"
                        "socket_mode: \"0600\"\n" +
                            group_line);
  logged_daemon daemon({"--config", path.string(), "--session-quota-bytes", "65536"});
  auto s = daemon.open_session();
  ASSERT_EQ(s.pools().size(), 2u);  // as configured: no built-in host pool, no GPU pools
  EXPECT_EQ(s.pools()[0].name, "staging");
  EXPECT_EQ(s.pools()[1].name, "scratch");
  auto stats = stats_of(s);
  EXPECT_EQ(stats.pools(0).pool().capacity_bytes(), 8388608u);
  // The flag's quota (64 KiB), not the file's (1 MiB).
  EXPECT_THROW((void)s.allocate(s.pools()[0].id, 128 * 1024, 0), rmm::out_of_memory);
  (void)s.allocate(s.pools()[0].id, 64 * 1024, 0);
  for (auto const* name : {"rmmd.sock", "rmmd-session.sock"}) {
    struct stat st {};
    ASSERT_EQ(::stat((daemon.runtime_dir() / name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u) << name;
    if (group != nullptr) { EXPECT_EQ(st.st_gid, group->gr_gid) << name; }
  }
}

TEST(Startup, HostPoolFlagsApplyToTheFirstHostPool)
{
  scratch_dir dir;
  auto path =
      dir.write("rmmd.conf", "pools { name: \"staging\" backend: HOST capacity_bytes: 8388608 }\n");
  logged_daemon daemon(
      {"--config", path.string(), "--host-pool-name", "renamed", "--host-pool-bytes", "2MiB"});
  auto s = daemon.open_session();
  ASSERT_EQ(s.pools().size(), 1u);
  EXPECT_EQ(s.pools()[0].name, "renamed");
  EXPECT_EQ(stats_of(s).pools(0).pool().capacity_bytes(), 2u * 1024 * 1024);
}

TEST(Deploy, TheExampleConfigurationIsValid)
{
  auto example = source_file("deploy/rmmd.conf.example");
  if (!example) { GTEST_SKIP() << "no source tree here (a bundle): deploy/ is not present"; }
  auto r = run_rmmd({"--check-config", example->string()});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(": OK"));
}

TEST(Deploy, TheExampleConfigurationRunsTheDaemonWithAPoolOnEveryGpu)
{
  auto example = source_file("deploy/rmmd.conf.example");
  if (!example) { GTEST_SKIP() << "no source tree here (a bundle): deploy/ is not present"; }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) {
    cudaGetLastError();
    gpus = 0;
  }
  logged_daemon daemon({"--config", example->string()});
  auto s = daemon.open_session();
  // The host pool, then gpu0 .. gpuN-1 (none here without a GPU).
  ASSERT_EQ(s.pools().size(), 1u + static_cast<std::size_t>(gpus)) << daemon.log();
  EXPECT_EQ(s.pools()[0].name, "host");
  for (int d = 0; d < gpus; ++d) {
    EXPECT_EQ(s.pools()[1 + d].name, "gpu" + std::to_string(d));
    EXPECT_EQ(s.pools()[1 + d].device, d);
  }
  EXPECT_EQ(stats_of(s).pools(0).pool().capacity_bytes(), std::size_t{1} << 30);
}

TEST(Deploy, SystemdAcceptsTheUnit)
{
  auto unit = source_file("deploy/systemd/rmmd.service");
  if (!unit) { GTEST_SKIP() << "no source tree here (a bundle): deploy/ is not present"; }
  auto analyze = fs::path("/usr/bin/systemd-analyze");
  if (!fs::exists(analyze)) {
    GTEST_SKIP() << "systemd-analyze is not installed (scripts/setup.sh installs systemd)";
  }
  // verify checks that every Exec*= program exists: point them at the build.
  std::ifstream in(*unit);
  std::stringstream text;
  text << in.rdbuf();
  auto unit_text              = text.str();
  std::string const installed = "/usr/bin/rmmd";
  ASSERT_NE(unit_text.find("ExecStart=" + installed), std::string::npos);
  for (auto at = unit_text.find(installed); at != std::string::npos;
       at      = unit_text.find(installed, at + 1)) {
    unit_text.replace(at, installed.size(), program_path("rmmd").string());
  }
  scratch_dir dir;
  auto copy = dir.write("rmmd.service", unit_text);
  child_process verify(
      {analyze.string(), "verify", "--man=no", copy.string()}, {}, {.merge_stderr = true});
  verify.close_stdin();
  auto out = verify.read_all();
  EXPECT_EQ(verify.wait(), 0) << out;
  EXPECT_EQ(out, "") << "systemd-analyze verify has remarks on the unit";
  for (std::string const& line :
       {std::string("Type=notify"),
        std::string("RuntimeDirectory=rmmd"),
        std::string("StateDirectory=rmmd"),
        std::string("FileDescriptorStoreMax="),
        "ExecStartPre=" + program_path("rmmd").string() + " --check-config",
        std::string("ExecReload=/bin/kill -HUP $MAINPID"),
        std::string("Restart=on-failure"),
        std::string("StartLimitIntervalSec=0")}) {  // a failed unit drops the fd store
    EXPECT_THAT(unit_text, HasSubstr(line));
  }
}

TEST(Deploy, TheSysusersFileMakesTheRmmdUserAndGroup)
{
  auto sysusers = source_file("deploy/sysusers.d/rmmd.conf");
  if (!sysusers) { GTEST_SKIP() << "no source tree here (a bundle): deploy/ is not present"; }
  auto tool = fs::path("/usr/bin/systemd-sysusers");
  if (!fs::exists(tool)) { GTEST_SKIP() << "systemd-sysusers is not installed"; }
  // Into an empty root of our own: the real /etc is not touched.
  scratch_dir root;
  fs::create_directories(root.path() / "etc");
  child_process p({tool.string(), "--root", root.path().string(), sysusers->string()},
                  {},
                  {.merge_stderr = true});
  p.close_stdin();
  auto out = p.read_all();
  ASSERT_EQ(p.wait(), 0) << out;
  std::ifstream passwd(root.path() / "etc/passwd"), group(root.path() / "etc/group");
  std::stringstream users, groups;
  users << passwd.rdbuf();
  groups << group.rdbuf();
  EXPECT_THAT(users.str(), HasSubstr("rmmd:x:"));
  EXPECT_THAT(groups.str(), HasSubstr("rmmd:x:"));
}

}  // namespace
}  // namespace rmmd::test
