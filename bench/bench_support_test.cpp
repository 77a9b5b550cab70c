// rmmd_bench's support code, on any machine (no GPU): the JSON it writes,
// its percentiles, its child processes (deadlines, handed fds, cleanup) and
// the real daemon started and stopped the way the bench does it.

#include "bench/bench_support.hpp"

#include <rmmd/session.hpp>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <system_error>

namespace rmmd::bench {
namespace {

google::protobuf::Struct parse(std::string const& text)
{
  google::protobuf::Struct out;
  auto status = google::protobuf::util::JsonStringToMessage(text, &out);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << text;
  return out;
}

TEST(BenchJson, WritesValidJsonThatReadsBack)
{
  json doc;
  doc["name"]   = "H100 \"SXM\"\n\ttab\\";
  doc["count"]  = std::size_t{10000};
  doc["p50_us"] = 1.25;
  doc["nan"]    = std::numeric_limits<double>::quiet_NaN();
  doc["none"]   = std::optional<double>{};
  doc["some"]   = std::optional<double>{2.5};
  doc["ok"]     = true;
  doc["empty"]  = json::array{};
  json rows;
  rows.push_back(json::object{{"size_bytes", 256}, {"control", std::string("\x01")}});
  rows.push_back(json::object{});
  doc["rows"]  = std::move(rows);
  doc["count"] = 3;  // replaces, keeps one member

  auto s = parse(doc.dump()).fields();
  EXPECT_EQ(s.at("name").string_value(), "H100 \"SXM\"\n\ttab\\");
  EXPECT_EQ(s.at("count").number_value(), 3);
  EXPECT_EQ(s.at("p50_us").number_value(), 1.25);
  EXPECT_TRUE(s.at("nan").has_null_value());
  EXPECT_TRUE(s.at("none").has_null_value());
  EXPECT_EQ(s.at("some").number_value(), 2.5);
  EXPECT_TRUE(s.at("ok").bool_value());
  EXPECT_EQ(s.at("empty").list_value().values_size(), 0);
  ASSERT_EQ(s.at("rows").list_value().values_size(), 2);
  auto const& row = s.at("rows").list_value().values(0).struct_value().fields();
  EXPECT_EQ(row.at("size_bytes").number_value(), 256);
  EXPECT_EQ(row.at("control").string_value(), "\x01");
}

TEST(BenchSummary, NearestRankPercentilesInMicroseconds)
{
  std::vector<double> ns(100);
  std::iota(ns.begin(), ns.end(), 1.0);  // 1..100 ns, shuffled order must not matter
  std::reverse(ns.begin(), ns.end());
  auto s = summarize(ns);
  EXPECT_EQ(s.count, 100u);
  EXPECT_DOUBLE_EQ(s.p50_us, 0.050);
  EXPECT_DOUBLE_EQ(s.p99_us, 0.099);
  EXPECT_DOUBLE_EQ(s.min_us, 0.001);
  EXPECT_DOUBLE_EQ(s.max_us, 0.100);
  EXPECT_DOUBLE_EQ(s.mean_us, 0.0505);
  auto one = summarize({7000.0});
  EXPECT_DOUBLE_EQ(one.p50_us, 7.0);
  EXPECT_DOUBLE_EQ(one.p99_us, 7.0);
  EXPECT_EQ(summarize({}).count, 0u);
}

TEST(BenchProcess, TalksOverStdinAndStdout)
{
  ::signal(SIGPIPE, SIG_IGN);  // as rmmd_bench does
  child_process p({"/bin/sh", "-c", "read x; echo got $x"});
  p.write_line("hello");
  EXPECT_EQ(p.read_line(steady::now() + 10s), "got hello");
  EXPECT_EQ(p.wait(steady::now() + 10s), 0);
  EXPECT_THROW(p.write_line("again"), std::system_error);  // nobody reads: an error, not SIGPIPE
}

TEST(BenchProcess, HandsFdsToTheChildUnderTheirNumbers)
{
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  {
    child_process p({"/bin/sh", "-c", "echo via-three >&3"}, {}, {.fds = {{3, fds[1]}}});
    EXPECT_EQ(p.wait(steady::now() + 10s), 0);
  }
  ::close(fds[1]);
  char buf[64]{};
  auto n = ::read(fds[0], buf, sizeof(buf) - 1);
  ::close(fds[0]);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0), "via-three\n");
}

TEST(BenchProcess, EnvironmentIsAdded)
{
  child_process p({"/bin/sh", "-c", "echo $RMMD_BENCH_TEST_VALUE"}, {"RMMD_BENCH_TEST_VALUE=42"});
  EXPECT_EQ(p.read_line(steady::now() + 10s), "42");
}

TEST(BenchProcess, ReadsAndWaitsEndAtTheirDeadlines)
{
  child_process p({"/bin/sh", "-c", "exec sleep 30"});
  auto t0 = steady::now();
  EXPECT_EQ(p.read_line(t0 + 100ms), std::nullopt);
  EXPECT_EQ(p.wait(steady::now() + 100ms), std::nullopt);
  EXPECT_LT(steady::now() - t0, 5s);
  p.kill(SIGKILL);
  EXPECT_EQ(p.wait(steady::now() + 10s), 128 + SIGKILL);
}

TEST(BenchProcess, DestructorAndKillAllLeaveNoChildRunning)
{
  pid_t pid;
  {
    child_process p({"/bin/sh", "-c", "exec sleep 30"});
    pid = p.pid();
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  EXPECT_NE(::kill(pid, 0), 0);  // killed and reaped, not a zombie

  child_process q({"/bin/sh", "-c", "exec sleep 30"});
  kill_all_children();
  EXPECT_EQ(q.wait(steady::now() + 10s), 128 + SIGKILL);
}

TEST(BenchDaemon, StartsTheRealDaemonReadyForSessionsAndReadsItsProc)
{
  std::filesystem::path dir;
  {
    daemon_process d(
        bench_daemon(RMMD_DAEMON_PATH, {"--backend=host", "--host-pool-bytes", "64MiB"}, 30s));
    dir = d.runtime_dir();
    EXPECT_TRUE(d.alive());
    rmmd::session s(rmmd::session::options{.runtime_dir = dir, .client_name = "bench-test"});
    EXPECT_GT(s.id(), 0u);
    EXPECT_GT(rss_bytes(d.pid()), 1u << 20);
    EXPECT_GE(cpu_seconds(d.pid()), 0.0);
    EXPECT_EQ(d.argv().at(1), "--runtime-dir");
  }
  EXPECT_FALSE(std::filesystem::exists(dir));  // stopped and cleaned up
}

TEST(BenchDaemon, ADaemonThatExitsAtStartUpIsReportedWithItsLog)
{
  try {
    daemon_process d(bench_daemon(RMMD_DAEMON_PATH, {"--backend=nonsense"}, 30s));
    FAIL() << "started";
  } catch (std::runtime_error const& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("exited with status"), std::string::npos) << what;
    EXPECT_NE(what.find("backend"), std::string::npos) << what;  // the daemon's own words
  }
}

TEST(BenchProc, ReadingAMissingProcessThrows)
{
  EXPECT_THROW(cpu_seconds(999'999'999), bench_error);
  EXPECT_THROW(rss_bytes(999'999'999), bench_error);
}

}  // namespace
}  // namespace rmmd::bench
