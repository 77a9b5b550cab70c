// rmmctl against the real daemon (host pool): every command as a table and as
// --json, --watch, and the exit codes and messages when there is no daemon or
// the caller may not do what it asks. Named shared buffers are made through
// the client library (rmmd::shared_buffer) and looked at with `rmmctl
// buffers`, `stats` and `pools`.

#include "tests/tools/daemon_process.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/shared_buffer.hpp>

#include <google/protobuf/util/json_util.h>

#include <absl/strings/str_replace.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

namespace rmmd::test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// rmmctl's exit codes (rmmctl/daemon_connection.hpp, docs/operations.md).
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

TEST_F(Rmmctl, PeersWithoutPeeringIsAnEmptyTableThatSaysPeeringIsOff)
{
  auto table = rmmctl(in(daemon_, {"peers"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  auto const lines = lines_of(table.out);
  ASSERT_EQ(lines.size(), 3u) << table.out;
  EXPECT_THAT(lines[0], StartsWith("node "));
  EXPECT_THAT(lines[1],
              AllOf(StartsWith("NODE"),
                    HasSubstr("DIRECTION"),
                    HasSubstr("STATE"),
                    HasSubstr("PROBE WE/THEY"),
                    HasSubstr("HOLDS WE HAVE"),
                    HasSubstr("BYTES THEY HOLD"),
                    HasSubstr("LAST CONTACT"),
                    HasSubstr("PROBLEM")));
  EXPECT_THAT(lines[2], StartsWith("(no peers: peering is off on this node"));

  auto json = rmmctl(in(daemon_, {"peers", "--json"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto peers = parse_json<v1::ListPeersResponse>(json.out);
  EXPECT_EQ(peers.peers_size(), 0);
  EXPECT_THAT(json.out, HasSubstr("\"peers\": []"));
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

/// The cells of a table's line: columns are two or more spaces apart, and no
/// cell holds two spaces in a row (a right-aligned first cell starts after
/// spaces).
std::vector<std::string> cells_of(std::string const& line)
{
  std::vector<std::string> out;
  std::size_t at = line.find_first_not_of(' ');
  while (at < line.size()) {
    auto end = line.find("  ", at);
    if (end == std::string::npos) { end = line.size(); }
    out.push_back(line.substr(at, end - at));
    at = line.find_first_not_of(' ', end);
  }
  return out;
}

/// The row of the table in `text` whose first cell is `name`, by column
/// header (each table's header is its first line; tables are a blank line
/// apart). Empty if there is no such row.
std::map<std::string, std::string> row_named(std::string const& text, std::string const& name)
{
  std::vector<std::string> header;
  bool next_is_header = true;
  for (auto const& line : lines_of(text)) {
    if (line.empty()) {
      next_is_header = true;
      continue;
    }
    if (next_is_header) {
      header         = cells_of(line);
      next_is_header = false;
      continue;
    }
    auto cells = cells_of(line);
    if (cells.empty() || cells[0] != name) { continue; }
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < cells.size() && i < header.size(); ++i) {
      row[header[i]] = cells[i];
    }
    return row;
  }
  return {};
}

/// A daemon with a producer and a consumer session, and the shared buffers
/// they make in its host pool.
class RmmctlBuffers : public ::testing::Test {
 protected:
  rmmd::shared_buffer create(std::string const& name, std::size_t bytes, bool persistent = false)
  {
    return rmmd::shared_buffer::create(
        producer_, name, bytes, {.pool = pool_name_, .persistent = persistent});
  }

  /// `rmmctl buffers --json`, parsed.
  v1::ListBuffersResponse list() const
  {
    auto r = rmmctl(in(daemon_, {"buffers", "--json"}));
    EXPECT_EQ(r.status, exit_ok) << r.out;
    return parse_json<v1::ListBuffersResponse>(r.out);
  }

  daemon_process daemon_{{"--host-pool-bytes", "64MiB", "--backend", "host"}};
  rmmd::session producer_ = daemon_.open_session("producer");
  rmmd::session consumer_ = daemon_.open_session("consumer");
  std::string pool_name_  = producer_.host_pool().name;
};

TEST_F(RmmctlBuffers, TableAndJsonShowEveryBufferSortedByName)
{
  // Published and held by both; still being written; persistent and held by
  // nobody.
  auto weights = create("team/model/w0", 1 << 20);
  weights.publish();
  auto opened = rmmd::shared_buffer::open(consumer_, "team/model/w0");
  auto draft  = create("team/a-draft", 4096);
  create("zeta/kept", 8192, true).publish();  // closed at once: it stays, unheld

  auto table = rmmctl(in(daemon_, {"buffers"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  auto rows = lines_of(table.out);
  ASSERT_EQ(rows.size(), 4u) << table.out;
  EXPECT_THAT(rows[0],
              AllOf(StartsWith("NAME"),
                    HasSubstr("POOL"),
                    HasSubstr("BYTES"),
                    HasSubstr("CREATOR UID"),
                    HasSubstr("CREATOR PID"),
                    HasSubstr("HOLDERS"),
                    HasSubstr("STATE"),
                    HasSubstr("PERSISTENT")));
  EXPECT_THAT(rows[1], StartsWith("team/a-draft "));
  EXPECT_THAT(rows[2], StartsWith("team/model/w0 "));
  EXPECT_THAT(rows[3], StartsWith("zeta/kept "));
  auto w_row = row_named(table.out, "team/model/w0");
  EXPECT_EQ(w_row["ID"], std::to_string(weights.id()));
  EXPECT_EQ(w_row["POOL"], pool_name_);
  EXPECT_EQ(w_row["BYTES"], "1.00 MiB");
  EXPECT_EQ(w_row["CREATOR UID"], std::to_string(::getuid()));
  EXPECT_EQ(w_row["CREATOR PID"], std::to_string(::getpid()));
  EXPECT_EQ(w_row["GID"], "-");
  EXPECT_EQ(w_row["HOLDERS"], "2");
  EXPECT_EQ(w_row["STATE"], "published");
  EXPECT_EQ(w_row["PERSISTENT"], "no");
  auto d_row = row_named(table.out, "team/a-draft");
  EXPECT_EQ(d_row["BYTES"], "4.00 KiB");
  EXPECT_EQ(d_row["HOLDERS"], "1");
  EXPECT_EQ(d_row["STATE"], "writing");
  auto k_row = row_named(table.out, "zeta/kept");
  EXPECT_EQ(k_row["BYTES"], "8.00 KiB");
  EXPECT_EQ(k_row["HOLDERS"], "0");
  EXPECT_EQ(k_row["STATE"], "published");
  EXPECT_EQ(k_row["PERSISTENT"], "yes");

  auto const buffers = list();
  ASSERT_EQ(buffers.buffers_size(), 3) << table.out;
  std::vector<std::string> names;
  for (auto const& b : buffers.buffers()) { names.push_back(b.name()); }
  EXPECT_THAT(names, ElementsAre("team/a-draft", "team/model/w0", "zeta/kept"));
  auto const& w = buffers.buffers(1);
  EXPECT_EQ(w.buffer_id(), weights.id());
  EXPECT_EQ(w.pool_id(), producer_.host_pool().id);
  EXPECT_EQ(w.pool_name(), pool_name_);
  EXPECT_EQ(w.size(), 1u << 20);
  EXPECT_GE(w.reserved_bytes(), 1u << 20);
  EXPECT_EQ(w.creator_uid(), ::getuid());
  EXPECT_EQ(w.creator_pid(), ::getpid());
  EXPECT_EQ(w.creator_session_id(), producer_.id());
  EXPECT_FALSE(w.has_gid());
  EXPECT_EQ(w.holders(), 2u);
  EXPECT_EQ(w.state(), v1::BUFFER_STATE_PUBLISHED);
  EXPECT_FALSE(w.persistent());
  EXPECT_GT(w.created_unix_ms(), 0);
  auto const& d = buffers.buffers(0);
  EXPECT_EQ(d.holders(), 1u);
  EXPECT_EQ(d.state(), v1::BUFFER_STATE_WRITING);
  auto const& k = buffers.buffers(2);
  EXPECT_EQ(k.holders(), 0u);
  EXPECT_EQ(k.state(), v1::BUFFER_STATE_PUBLISHED);
  EXPECT_TRUE(k.persistent());

  // The holders go: the buffers with them, but the persistent one.
  opened.close();
  weights.close();
  draft.close();
  auto const left = list();
  ASSERT_EQ(left.buffers_size(), 1);
  EXPECT_EQ(left.buffers(0).name(), "zeta/kept");
  auto const now = rmmctl(in(daemon_, {"buffers"}));
  EXPECT_EQ(lines_of(now.out).size(), 2u) << now.out;
}

TEST_F(RmmctlBuffers, NoBuffersSaysSo)
{
  auto table = rmmctl(in(daemon_, {"buffers"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  EXPECT_THAT(table.out, HasSubstr("(no buffers)\n"));
  EXPECT_EQ(list().buffers_size(), 0);
}

TEST_F(RmmctlBuffers, WatchRepeatsTheList)
{
  create("watched", 4096).publish();  // gone again: not persistent, nobody holds it
  auto kept = create("watched", 4096);
  auto json = rmmctl(in(daemon_, {"buffers", "--json", "--watch", "0.05", "--count", "2"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto docs = lines_of(json.out);
  ASSERT_EQ(docs.size(), 2u) << json.out;
  for (auto const& doc : docs) {
    auto frame = parse_json<v1::ListBuffersResponse>(doc);
    ASSERT_EQ(frame.buffers_size(), 1) << doc;
    EXPECT_EQ(frame.buffers(0).buffer_id(), kept.id());
  }
  auto table = rmmctl(in(daemon_, {"buffers", "--watch", "0.05", "--count", "2"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  std::size_t frames = 0;
  for (auto const& line : lines_of(table.out)) {
    if (line.starts_with("rmmctl buffers every 0.05s")) { ++frames; }
  }
  EXPECT_EQ(frames, 2u) << table.out;
}

TEST_F(RmmctlBuffers, DeleteTakesTheNameAndSaysWhoStillHoldsIt)
{
  auto held = create("kv/block7", 64 << 10);
  held.publish();
  auto opened              = rmmd::shared_buffer::open(consumer_, "kv/block7");
  auto const in_use_before = in_use(daemon_.stats(), producer_.host_pool().id);

  auto deleted = rmmctl(in(daemon_, {"buffers", "delete", "kv/block7"}));
  ASSERT_EQ(deleted.status, exit_ok) << deleted.out;
  EXPECT_EQ(deleted.out,
            "deleted 'kv/block7' (the name is free again); its memory goes back when its 2 "
            "holders close it\n");
  // The name is gone at once, the memory is not: both still read it.
  auto after = list();
  ASSERT_EQ(after.buffers_size(), 1);
  EXPECT_EQ(after.buffers(0).state(), v1::BUFFER_STATE_DELETED);
  EXPECT_EQ(after.buffers(0).holders(), 2u);
  EXPECT_EQ(row_named(rmmctl(in(daemon_, {"buffers"})).out, "kv/block7")["STATE"], "deleted");
  EXPECT_EQ(in_use(daemon_.stats(), producer_.host_pool().id), in_use_before);
  EXPECT_THROW((void)rmmd::shared_buffer::open(consumer_, "kv/block7"), rmmd::not_found_error);

  // Twice: NOT_FOUND, the daemon's error, exit code 1.
  auto again = rmmctl(in(daemon_, {"buffers", "delete", "kv/block7"}), true);
  EXPECT_EQ(again.status, exit_failed) << again.out;
  EXPECT_THAT(again.out,
              AllOf(HasSubstr("rmmctl: buffers delete: delete buffer 'kv/block7'"),
                    HasSubstr("no buffer has this name")));
  // A name against the rule: INVALID_ARGUMENT, exit code 1, with the rule.
  auto bad = rmmctl(in(daemon_, {"buffers", "delete", "/etc/passwd"}), true);
  EXPECT_EQ(bad.status, exit_failed) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("delete buffer '/etc/passwd'"));

  // The last holder's close gives the memory back.
  opened.close();
  EXPECT_EQ(list().buffers(0).holders(), 1u);
  held.close();
  EXPECT_EQ(list().buffers_size(), 0);
  EXPECT_EQ(in_use(daemon_.stats(), producer_.host_pool().id), 0u);

  // A persistent buffer nobody holds goes at once; --json gives the reply.
  create("kept", 4096, true).publish();
  auto json = rmmctl(in(daemon_, {"buffers", "delete", "kept", "--json"}));
  ASSERT_EQ(json.status, exit_ok) << json.out;
  EXPECT_EQ(parse_json<v1::DeleteBufferResponse>(json.out).holders(), 0u);
  create("kept", 4096, true).publish();
  auto table = rmmctl(in(daemon_, {"buffers", "delete", "kept"}));
  EXPECT_EQ(table.out,
            "deleted 'kept' (the name is free again); no session held it, so its memory is back "
            "in its pool\n");
  EXPECT_EQ(in_use(daemon_.stats(), producer_.host_pool().id), 0u);
}

TEST_F(RmmctlBuffers, StatsPoolsAndSessionsShowSharedBytes)
{
  auto weights = create("w", 1 << 20);
  weights.publish();
  auto opened         = rmmd::shared_buffer::open(consumer_, "w");
  auto again          = rmmd::shared_buffer::open(consumer_, "w");  // one holder, twice
  auto draft          = create("draft", 4096);
  auto const reserved = [&] {
    std::uint64_t sum  = 0;
    auto const buffers = list();
    for (auto const& b : buffers.buffers()) { sum += b.reserved_bytes(); }
    return sum;
  }();

  auto stats = daemon_.rmmctl_stats();
  ASSERT_EQ(stats.pools_size(), 1);
  auto const& p = stats.pools(0);
  EXPECT_EQ(p.shared_buffers(), 2u);
  EXPECT_EQ(p.shared_bytes(), reserved);
  EXPECT_EQ(p.shared_holders(), 3u);      // the producer twice (two buffers), the consumer once
  EXPECT_EQ(p.in_use_bytes(), reserved);  // shared bytes are part of what the pool lends
  EXPECT_EQ(p.allocation_count(), 0u);    // but not allocations
  for (auto const& s : stats.sessions()) {
    if (s.session_id() == producer_.id()) {
      EXPECT_EQ(s.shared_bytes(), reserved);
      EXPECT_EQ(s.buffers_held(), 2u);
      EXPECT_EQ(s.bytes(), 0u);
    } else if (s.session_id() == consumer_.id()) {
      EXPECT_EQ(s.shared_bytes(), 0u);  // it created none: its quota is not charged
      EXPECT_EQ(s.buffers_held(), 1u);
    }
  }

  auto const shared = "1.00 MiB in 2";  // 1 MiB + 4 KiB
  auto table        = rmmctl(in(daemon_, {"stats"}));
  ASSERT_EQ(table.status, exit_ok) << table.out;
  EXPECT_THAT(table.out, AllOf(HasSubstr("SHARED"), HasSubstr("BUFFERS")));
  EXPECT_EQ(row_named(table.out, pool_name_)["SHARED"], shared) << table.out;
  auto producer_row = row_named(table.out, std::to_string(producer_.id()));
  EXPECT_EQ(producer_row["SHARED"], "1.00 MiB") << table.out;
  EXPECT_EQ(producer_row["BUFFERS"], "2") << table.out;
  EXPECT_EQ(row_named(table.out, std::to_string(consumer_.id()))["BUFFERS"], "1") << table.out;
  auto pools = rmmctl(in(daemon_, {"pools"}));
  ASSERT_EQ(pools.status, exit_ok) << pools.out;
  EXPECT_EQ(row_named(pools.out, pool_name_)["SHARED"], shared) << pools.out;
  auto sessions = rmmctl(in(daemon_, {"sessions", "--json"}));
  ASSERT_EQ(sessions.status, exit_ok) << sessions.out;
  auto const listed = parse_json<v1::ListSessionsResponse>(sessions.out);
  for (auto const& s : listed.sessions()) {
    if (s.session_id() == consumer_.id()) { EXPECT_EQ(s.buffers_held(), 1u); }
  }
  auto sessions_table = rmmctl(in(daemon_, {"sessions"}));
  auto consumer_row   = row_named(sessions_table.out, std::to_string(consumer_.id()));
  EXPECT_EQ(consumer_row["SHARED"], "0 B") << sessions_table.out;
  EXPECT_EQ(consumer_row["BUFFERS"], "1") << sessions_table.out;

  opened.close();
  again.close();
  weights.close();
  draft.close();
  auto none = daemon_.rmmctl_stats();
  EXPECT_EQ(none.pools(0).shared_buffers(), 0u);
  EXPECT_EQ(none.pools(0).shared_bytes(), 0u);
  EXPECT_EQ(none.pools(0).shared_holders(), 0u);
  EXPECT_EQ(row_named(rmmctl(in(daemon_, {"stats"})).out, pool_name_)["SHARED"], "-");
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
  EXPECT_EQ(rmmctl({"buffers", "delete"}, true).status, exit_usage);  // NAME is required
  EXPECT_EQ(rmmctl({"buffers", "delete", "a", "b"}, true).status, exit_usage);
  EXPECT_EQ(rmmctl({"buffers", "frobnicate", "a"}, true).status, exit_usage);
  auto watch_delete = rmmctl({"buffers", "delete", "a", "--watch", "1"}, true);
  EXPECT_EQ(watch_delete.status, exit_usage);
  EXPECT_THAT(watch_delete.out, HasSubstr("--watch does not apply to buffers delete"));
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
  for (std::string command : {"stats", "pools", "sessions", "trim", "buffers"}) {
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

/// Buffers in the output of `rmmctl buffers --json`.
int list_size(ctl_result const& r)
{
  EXPECT_EQ(r.status, exit_ok) << r.out;
  return parse_json<v1::ListBuffersResponse>(r.out).buffers_size();
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

TEST(RmmctlPermission, BuffersAreDeletedByTheCreatorsUidAndRootOnly)
{
  std::string why;
  if (!can_run_as_nobody(&why)) { GTEST_SKIP() << why; }
  daemon_process daemon({"--host-pool-bytes",
                         "64MiB",
                         "--backend",
                         "host",
                         "--allow-uid",
                         "0," + std::to_string(nobody)});
  auto const dir = daemon.runtime_dir();
  std::filesystem::permissions(dir, std::filesystem::perms(0755));
  for (auto name : {"rmmd.sock", "rmmd-session.sock"}) {
    std::filesystem::permissions(dir / name, std::filesystem::perms(0666));
  }
  auto root       = daemon.open_session("root's");
  auto const pool = root.host_pool().name;
  auto mine       = rmmd::shared_buffer::create(root, "root/only", 4096, {.pool = pool});
  auto for_nobody = rmmd::shared_buffer::create(
      root, "shared/with-nogroup", 4096, {.pool = pool, .gid = gid_t{nobody}});
  mine.publish();
  for_nobody.publish();

  // Nobody sees only what it may open: the buffer of its gid.
  auto listed = rmmctl({"--runtime-dir", dir.string(), "buffers", "--json"}, false, true);
  ASSERT_EQ(listed.status, exit_ok) << listed.out;
  auto seen = parse_json<v1::ListBuffersResponse>(listed.out);
  ASSERT_EQ(seen.buffers_size(), 1) << listed.out;
  EXPECT_EQ(seen.buffers(0).name(), "shared/with-nogroup");
  EXPECT_EQ(seen.buffers(0).gid(), nobody);
  auto table = rmmctl({"--runtime-dir", dir.string(), "buffers"}, false, true);
  EXPECT_EQ(row_named(table.out, "shared/with-nogroup")["GID"], std::to_string(nobody))
      << table.out;

  // Opening is not deleting: exit code 4 for the buffer it may open, and
  // nothing changes. The one it may not open is not there for it: exit code
  // 1, as for a name no buffer has, in the same words.
  auto r = rmmctl(
      {"--runtime-dir", dir.string(), "buffers", "delete", "shared/with-nogroup"}, true, true);
  EXPECT_EQ(r.status, exit_denied) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr("uid 65534 may not delete it; only its creator's uid 0 and root may"));
  auto hidden =
      rmmctl({"--runtime-dir", dir.string(), "buffers", "delete", "root/only"}, true, true);
  auto missing =
      rmmctl({"--runtime-dir", dir.string(), "buffers", "delete", "root/none"}, true, true);
  EXPECT_EQ(hidden.status, exit_failed) << hidden.out;
  EXPECT_EQ(absl::StrReplaceAll(hidden.out, {{"root/only", "NAME"}}),
            absl::StrReplaceAll(missing.out, {{"root/none", "NAME"}}));
  EXPECT_EQ(list_size(rmmctl({"--runtime-dir", dir.string(), "buffers", "--json"})), 2);
  auto by_root = rmmctl({"--runtime-dir", dir.string(), "buffers", "delete", "root/only"});
  EXPECT_EQ(by_root.status, exit_ok) << by_root.out;
}

}  // namespace
}  // namespace rmmd::test
