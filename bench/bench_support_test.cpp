// rmmd_bench's support code, on any machine (no GPU): the JSON it writes
// (and the files of earlier runs read back), its percentiles, its child
// processes (deadlines, handed fds, cleanup) and the real daemon started and
// stopped the way the bench does it.

#include "bench/bench_support.hpp"

#include <rmmd/session.hpp>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace rmmd::bench {
namespace {

google::protobuf::Struct parse(std::string const& text)
{
  google::protobuf::Struct out;
  auto status = google::protobuf::util::JsonStringToMessage(text, &out);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << text;
  return out;
}

results::Run parse_run(std::string const& text)
{
  results::Run out;
  auto status = google::protobuf::util::JsonStringToMessage(text, &out);  // unknown names fail
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << text;
  return out;
}

std::string read_file(std::filesystem::path const& path)
{
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(BenchJson, WritesValidJsonThatReadsBackWithItsValues)
{
  results::Run run;
  run.set_schema("rmmd-bench/1");
  run.set_command("rmmd_bench --out \"x y.json\"\n\ttab\\ \x01");
  run.set_quick(false);
  run.mutable_config()->set_pairs(2000);
  run.mutable_config()->set_worker_seconds(0.5);
  run.mutable_gpu()->set_name("NVIDIA H100 80GB HBM3");
  run.mutable_gpu()->set_memory_bytes(85017493504.0);  // above 2^32
  auto& measured = *run.add_pairs();
  measured.set_resource("rmmd_fast");
  measured.set_size_bytes(256);
  measured.set_pairs(2000);
  measured.set_cut_short_by_budget(false);
  measured.set_p50_us(1.25);
  measured.set_pairs_per_s(std::numeric_limits<double>::quiet_NaN());
  measured.set_ratio_to_baseline_p50(std::numeric_limits<double>::infinity());
  measured.mutable_target()->set_target("<= 1.5 x");
  measured.mutable_target()->set_pass(true);
  auto& failed = *run.add_pairs();
  failed.set_resource("rmmd_direct");
  failed.set_size_bytes(64u << 20);
  failed.set_error("Allocate failed");
  auto& step = *run.mutable_direct_steps()->add_sizes();
  step.set_size_bytes(256);
  step.mutable_export_()->set_p50_us(48.5);
  step.mutable_import()->set_p50_us(83.7);
  run.add_targets()->set_what("fast p50 / cuda_async p50 at 256 B");
  run.set_seconds(412.5);

  auto const text = results_json(run);
  EXPECT_TRUE(std::isnan(run.pairs(0).pairs_per_s()));  // `run` itself is unchanged

  // Back into the message: every value as set, the non-finite ones left out.
  auto back     = parse_run(text);
  auto expected = run;
  expected.mutable_pairs(0)->clear_pairs_per_s();
  expected.mutable_pairs(0)->clear_ratio_to_baseline_p50();
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(expected, back)) << diff;

  // Its form: names as in the proto, numbers as JSON numbers (no 64-bit
  // integers written as strings), plain fields always, optional ones when set.
  auto doc = parse(text).fields();
  EXPECT_EQ(doc.at("command").string_value(), run.command());
  EXPECT_TRUE(doc.at("quick").has_bool_value());
  EXPECT_EQ(doc.at("errors").list_value().values_size(), 0);
  EXPECT_EQ(doc.at("config").struct_value().fields().at("pairs").number_value(), 2000);
  EXPECT_EQ(doc.at("config").struct_value().fields().at("kill_trials").number_value(), 0);
  EXPECT_EQ(doc.at("gpu").struct_value().fields().at("memory_bytes").number_value(), 85017493504.0);
  EXPECT_EQ(doc.at("seconds").number_value(), 412.5);
  EXPECT_FALSE(doc.contains("setup_and_reclaim"));  // a section that did not run
  auto const& rows = doc.at("pairs").list_value();
  ASSERT_EQ(rows.values_size(), 2);
  auto const& m = rows.values(0).struct_value().fields();
  EXPECT_EQ(m.at("size_bytes").number_value(), 256);
  EXPECT_EQ(m.at("p50_us").number_value(), 1.25);
  EXPECT_TRUE(m.at("cut_short_by_budget").has_bool_value());
  EXPECT_TRUE(m.at("target").struct_value().fields().at("pass").bool_value());
  EXPECT_FALSE(m.contains("pairs_per_s"));  // NaN: left out
  EXPECT_FALSE(m.contains("ratio_to_baseline_p50"));
  EXPECT_FALSE(m.contains("error"));
  auto const& f = rows.values(1).struct_value().fields();
  EXPECT_EQ(f.at("error").string_value(), "Allocate failed");
  EXPECT_EQ(f.at("size_bytes").number_value(), 64 << 20);
  EXPECT_FALSE(f.contains("p50_us"));
  EXPECT_FALSE(f.contains("cut_short_by_budget"));
  auto const& s = doc.at("direct_steps").struct_value().fields().at("sizes").list_value().values(0);
  EXPECT_EQ(
      s.struct_value().fields().at("export").struct_value().fields().at("p50_us").number_value(),
      48.5);
  EXPECT_EQ(
      s.struct_value().fields().at("import").struct_value().fields().at("p50_us").number_value(),
      83.7);
  EXPECT_FALSE(doc.contains("sharing"));  // section f did not run
}

// Section f's figures: 4 GiB is a plain JSON number (a double, not a 64-bit
// integer written as a string), and a failed cell keeps its names.
TEST(BenchJson, SharingCellsWriteSizesAsNumbers)
{
  results::Run run;
  run.add_sections("f");
  auto& sharing = *run.mutable_sharing();
  sharing.set_reps(200);
  auto& cell = *sharing.add_cells();
  cell.set_method("rmmd");
  cell.set_size_bytes(4294967296.0);
  cell.set_consumers(8);
  cell.mutable_open()->set_p50_us(120.5);
  cell.set_host_copy_over_open_p50(1500);
  auto& failed = *sharing.add_cells();
  failed.set_method("cuda_ipc");
  failed.set_size_bytes(64 << 20);
  failed.set_consumers(1);
  failed.set_error("cudaIpcOpenMemHandle failed");

  auto const text = results_json(run);
  auto back       = parse_run(text);
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(run, back)) << diff;

  auto doc = parse(text).fields();
  EXPECT_EQ(doc.at("sections").list_value().values(0).string_value(), "f");
  auto const& cells = doc.at("sharing").struct_value().fields().at("cells").list_value();
  ASSERT_EQ(cells.values_size(), 2);
  auto const& c = cells.values(0).struct_value().fields();
  EXPECT_TRUE(c.at("size_bytes").has_number_value());
  EXPECT_EQ(c.at("size_bytes").number_value(), 4294967296.0);
  EXPECT_EQ(c.at("open").struct_value().fields().at("p50_us").number_value(), 120.5);
  EXPECT_FALSE(c.contains("close"));  // not measured: absent
  auto const& f = cells.values(1).struct_value().fields();
  EXPECT_EQ(f.at("method").string_value(), "cuda_ipc");
  EXPECT_EQ(f.at("error").string_value(), "cudaIpcOpenMemHandle failed");
  EXPECT_FALSE(f.contains("reps"));
}

// The committed results files, some written by a hand-written JSON writer:
// every name in them is one of bench_results.proto's, and written again by
// results_json they hold the same members with the same values.
void drop_lists_added_empty(google::protobuf::Struct& rewritten,
                            google::protobuf::Struct const& old)
{
  auto& fields = *rewritten.mutable_fields();
  for (auto it = fields.begin(); it != fields.end();) {
    auto const was = old.fields().find(it->first);
    auto& value    = it->second;
    if (was == old.fields().end()) {
      bool const empty_list = value.has_list_value() && value.list_value().values_size() == 0;
      it                    = empty_list ? fields.erase(it) : std::next(it);
      continue;
    }
    if (value.has_struct_value() && was->second.has_struct_value()) {
      drop_lists_added_empty(*value.mutable_struct_value(), was->second.struct_value());
    } else if (value.has_list_value() && was->second.has_list_value() &&
               value.list_value().values_size() == was->second.list_value().values_size()) {
      for (int i = 0; i < value.list_value().values_size(); ++i) {
        auto& item       = *value.mutable_list_value()->mutable_values(i);
        auto const& prev = was->second.list_value().values(i);
        if (item.has_struct_value() && prev.has_struct_value()) {
          drop_lists_added_empty(*item.mutable_struct_value(), prev.struct_value());
        }
      }
    }
    ++it;
  }
}

TEST(BenchJson, TheResultsOfEarlierRunsReadBackAndWriteTheSame)
{
  int files = 0;
  for (auto const& entry : std::filesystem::directory_iterator(RMMD_BENCH_RESULTS_DIR)) {
    if (entry.path().extension() != ".json") { continue; }
    SCOPED_TRACE(entry.path().string());
    ++files;
    auto const old_text = read_file(entry.path());
    auto const run      = parse_run(old_text);
    // Files from before --sections ran a to e; later ones list what they ran.
    std::vector<std::string> sections(run.sections().begin(), run.sections().end());
    if (sections.empty()) { sections = {"a", "b", "b2", "c", "d", "e"}; }
    auto const ran = [&](std::string const& section) {
      return std::find(sections.begin(), sections.end(), section) != sections.end();
    };
    if (ran("a")) { EXPECT_GT(run.pairs_size(), 0); }
    if (ran("b")) { EXPECT_GT(run.direct_steps().sizes_size(), 0); }
    if (ran("f")) { EXPECT_GT(run.sharing().cells_size(), 0); }
    std::string diff;
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&diff);
    auto const old_doc = parse(old_text);
    auto rewritten     = parse(results_json(run));
    // A file from before a section or a repeated field existed (run2 has no
    // b2, older a8 cells no round_ratios) lacks its list, which results_json
    // writes empty: the only difference allowed.
    drop_lists_added_empty(rewritten, old_doc);
    EXPECT_TRUE(differ.Compare(old_doc, rewritten)) << diff;
  }
  EXPECT_GT(files, 0) << "no .json in " << RMMD_BENCH_RESULTS_DIR;
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
