// A busy node on the real daemon: many sessions, listed
// by rmmctl and the stats call a bounded number at a time (those holding the
// most first); a /metrics scrape that does not grow with them; and a session
// holding 100,000 leases that gives everything back when it closes. The
// sessions and leases are made by hand on the session socket
// (harness/raw_session.hpp): real connections, without a client
// library's imports. How fast this goes is the bench's to show (section h).

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "harness/raw_session.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/text.hpp"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::test {
namespace {

using harness::raw_session;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int exit_ok = 0, exit_usage = 2;

struct ctl_result {
  int status{-1};
  std::string out;  ///< stdout and stderr
};

ctl_result rmmctl(daemon_process const& d, std::vector<std::string> args)
{
  std::vector<std::string> argv{
      program_path("rmmctl").string(), "--runtime-dir", d.runtime_dir().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  child_process p(argv, {}, {.merge_stderr = true});
  p.close_stdin();
  ctl_result r;
  r.out    = p.read_all();
  r.status = p.wait().value_or(-1);
  return r;
}

/// The first column of a table's rows (the header and notes left out).
std::vector<std::string> first_column(std::string const& table)
{
  std::vector<std::string> out;
  for (auto const& line : lines_of(table)) {
    if (line.empty() || line.find("SESSION") != std::string::npos || line.starts_with("...") ||
        line.starts_with("(")) {
      continue;
    }
    std::string first;
    std::istringstream(line) >> first;  // right-aligned: after the padding
    out.push_back(first);
  }
  return out;
}

/// Waits, with a deadline, until `pool`'s figures are `bytes` in `count`
/// allocations; false if they never were.
bool pool_reaches(daemon_process const& d,
                  std::uint32_t pool,
                  std::uint64_t bytes,
                  std::uint64_t count)
{
  return eventually(
      [&] {
        auto const s = d.stats();
        for (auto const& p : s.pools()) {
          if (p.pool().id() == pool) {
            return p.in_use_bytes() == bytes && p.allocation_count() == count;
          }
        }
        return false;
      },
      std::chrono::seconds(20));
}

/// Thirty sessions; session i (from 1) holds i leases of 4 KiB.
class ManySessions : public ::testing::Test {
 protected:
  void SetUp() override
  {
    for (int i = 1; i <= 30; ++i) {
      auto& s = sessions_.emplace_back(daemon_.runtime_dir(), "holder-" + std::to_string(i));
      s.allocate(s.pool_of(harness::raw_backend::host), 4096, static_cast<std::size_t>(i));
    }
  }

  std::string id_of(int holding) const
  {
    return std::to_string(sessions_.at(static_cast<std::size_t>(holding - 1)).id());
  }

  daemon_process daemon_{{"--host-pool-bytes", "64MiB", "--backend", "host"}};
  std::vector<raw_session> sessions_;
};

TEST_F(ManySessions, RmmctlSessionsListsThoseHoldingTheMostAndSaysHowManyMoreThereAre)
{
  auto top = rmmctl(daemon_, {"sessions", "--top", "3"});
  ASSERT_EQ(top.status, exit_ok) << top.out;
  EXPECT_EQ(first_column(top.out), (std::vector<std::string>{id_of(30), id_of(29), id_of(28)}))
      << top.out;
  // 27 more, holding 4 KiB x (1 + ... + 27) in 378 allocations.
  EXPECT_THAT(top.out,
              HasSubstr("... and 27 more sessions holding 1.48 MiB in 378 allocations (--top N "
                        "lists more, --all every one)"));

  // By default 20; rmmctl's own session is never listed nor counted.
  auto plain = rmmctl(daemon_, {"sessions"});
  ASSERT_EQ(plain.status, exit_ok) << plain.out;
  auto const rows = first_column(plain.out);
  ASSERT_EQ(rows.size(), 20u) << plain.out;
  EXPECT_EQ(rows.front(), id_of(30));
  EXPECT_EQ(rows.back(), id_of(11));
  EXPECT_THAT(plain.out, HasSubstr("... and 10 more sessions holding"));

  // --all: every session, by id, and no line about others.
  auto all = rmmctl(daemon_, {"sessions", "--all"});
  ASSERT_EQ(all.status, exit_ok) << all.out;
  auto const every = first_column(all.out);
  ASSERT_EQ(every.size(), 30u) << all.out;
  EXPECT_EQ(every.front(), id_of(1));
  EXPECT_EQ(every.back(), id_of(30));
  EXPECT_THAT(all.out, Not(HasSubstr("more session")));

  auto json = rmmctl(daemon_, {"sessions", "--json", "--top", "2"});
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto const reply = parse_json<v1::ListSessionsResponse>(json.out);
  ASSERT_EQ(reply.sessions_size(), 2);
  EXPECT_EQ(std::to_string(reply.sessions(0).session_id()), id_of(30));
  EXPECT_EQ(reply.sessions(0).allocation_count(), 30u);
  EXPECT_EQ(reply.sessions(0).bytes(), 30u * 4096);
  EXPECT_EQ(std::to_string(reply.sessions(1).session_id()), id_of(29));
  EXPECT_EQ(reply.session_count(), 30u);
  EXPECT_EQ(reply.unlisted_session_allocations(), 28u * 29 / 2);
  EXPECT_EQ(reply.unlisted_session_bytes(), 4096u * 28 * 29 / 2);
}

TEST_F(ManySessions, RmmctlStatsListsTheTopSessionsToo)
{
  auto top = rmmctl(daemon_, {"stats", "--top", "2"});
  ASSERT_EQ(top.status, exit_ok) << top.out;
  EXPECT_THAT(top.out, HasSubstr("... and 28 more sessions holding"));
  auto json = rmmctl(daemon_, {"stats", "--json", "--top", "1"});
  ASSERT_EQ(json.status, exit_ok) << json.out;
  auto const stats = parse_json<v1::Stats>(json.out);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(std::to_string(stats.sessions(0).session_id()), id_of(30));
  EXPECT_EQ(stats.session_count(), 30u);
  ASSERT_EQ(stats.pools_size(), 1);
  EXPECT_EQ(stats.pools(0).allocation_count(), 30u * 31 / 2);
  auto all = rmmctl(daemon_, {"stats", "--json", "--all"});
  ASSERT_EQ(all.status, exit_ok) << all.out;
  EXPECT_EQ(parse_json<v1::Stats>(all.out).sessions_size(), 30);
}

TEST_F(ManySessions, BadTopOptionsAreUsageErrors)
{
  for (auto const& args : std::vector<std::vector<std::string>>{{"sessions", "--top", "0"},
                                                                {"sessions", "--top", "x"},
                                                                {"sessions", "--top", "-3"},
                                                                {"stats", "--top", "2", "--all"},
                                                                {"pools", "--top", "2"}}) {
    auto r = rmmctl(daemon_, args);
    EXPECT_EQ(r.status, exit_usage) << args[0] << " " << args[1] << ": " << r.out;
  }
}

TEST_F(ManySessions, TheStatsCallListsTheTopSessionsOnlyWhenAsked)
{
  auto observer = daemon_.open_session("observer");
  auto& impl    = rmmd::detail::impl_of(observer);
  v1::GetStatsRequest request;
  request.set_top_sessions(4);
  v1::Stats top;
  auto ctx    = impl.context();
  auto status = impl.stub().GetStats(ctx.get(), request, &top);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(top.sessions_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::to_string(top.sessions(i).session_id()), id_of(30 - i));
  }
  EXPECT_EQ(top.session_count(), 31u);  // the observer counts
  EXPECT_EQ(top.unlisted_session_allocations(), 26u * 27 / 2);

  // Not asked: every session, by id.
  v1::Stats all;
  auto ctx2 = impl.context();
  status    = impl.stub().GetStats(ctx2.get(), v1::GetStatsRequest{}, &all);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(all.sessions_size(), 31);
  for (int i = 1; i < all.sessions_size(); ++i) {
    EXPECT_LT(all.sessions(i - 1).session_id(), all.sessions(i).session_id());
  }
  EXPECT_EQ(all.session_count(), 31u);
  EXPECT_EQ(all.unlisted_session_bytes(), 0u);

  v1::ListSessionsRequest none;
  none.set_top_sessions(0);
  v1::ListSessionsResponse listed;
  auto ctx3 = impl.context();
  status    = impl.stub().ListSessions(ctx3.get(), none, &listed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(listed.sessions_size(), 0);
  EXPECT_EQ(listed.session_count(), 31u);
  EXPECT_EQ(listed.unlisted_session_allocations(), 30u * 31 / 2);
}

std::size_t samples_of(std::string const& text, std::string const& family)
{
  std::size_t n = 0;
  for (auto const& line : lines_of(text)) {
    if (line.starts_with(family + "{") || line.starts_with(family + " ")) { ++n; }
  }
  return n;
}

TEST(ManySessionsMetrics, AScrapeStaysTheSameSizeWithThreeHundredSessions)
{
  daemon_process daemon{
      {"--host-pool-bytes", "64MiB", "--backend", "host", "--metrics-address", "127.0.0.1:0"}};
  auto observer = daemon.open_session("observer");
  v1::HealthResponse health;
  auto ctx = rmmd::detail::impl_of(observer).context();
  ASSERT_TRUE(rmmd::detail::impl_of(observer).stub().Health(ctx.get(), {}, &health).ok());
  auto const address = health.metrics_address();
  auto const colon   = address.rfind(':');
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  http.set_read_timeout(std::chrono::seconds(20));
  auto scrape = [&] {
    auto r = http.Get("/metrics");
    EXPECT_TRUE(r) << httplib::to_string(r.error());
    return r ? r->body : std::string();
  };

  std::vector<raw_session> sessions;
  for (int i = 0; i < 20; ++i) {
    auto& s = sessions.emplace_back(daemon.runtime_dir(), "many");
    s.allocate(s.pool_of(harness::raw_backend::host), 256, 1);
  }
  auto const with_twenty = scrape();
  for (int i = 20; i < 300; ++i) {
    auto& s = sessions.emplace_back(daemon.runtime_dir(), "many");
    s.allocate(s.pool_of(harness::raw_backend::host), 256, 1);
  }
  auto const with_three_hundred = scrape();
  // Ten sessions with series of their own (the default), the rest summed.
  EXPECT_EQ(samples_of(with_three_hundred, "rmmd_session_bytes"), 10u);
  EXPECT_THAT(with_three_hundred, HasSubstr("\nrmmd_unlisted_sessions 291\n"));
  EXPECT_THAT(with_three_hundred, HasSubstr("\nrmmd_unlisted_session_live_allocations 290\n"));
  // The text grows only by the digits of the counters, not per session.
  EXPECT_LT(with_three_hundred.size(), with_twenty.size() + 1024)
      << with_twenty.size() << " bytes with 20 sessions, " << with_three_hundred.size()
      << " with 300";
}

TEST(ManyLeases, ASessionHolding100000LeasesGivesEverythingBackWhenItCloses)
{
  daemon_process daemon{{"--host-pool-bytes", "64MiB", "--backend", "host"}};
  auto other         = daemon.open_session("other");
  auto const pool    = other.host_pool().id;
  auto const kept    = other.allocate(pool, 1 << 20, 0);
  constexpr auto n   = std::size_t{100000};
  constexpr auto per = std::uint64_t{256};
  {
    raw_session holder(daemon.runtime_dir(), "holder");
    auto ids = holder.allocate(holder.pool_of(harness::raw_backend::host), per, n);
    ASSERT_EQ(ids.size(), n);
    auto const stats = daemon.stats();
    EXPECT_EQ(in_use(stats, pool), (1u << 20) + n * per);
    EXPECT_EQ(stats.pools(0).allocation_count(), n + 1);
  }  // the connection closes: the daemon frees the session's leases
  EXPECT_TRUE(pool_reaches(daemon, pool, 1 << 20, 1));
  // The other session's lease is untouched, and what came back is one free
  // range again: the rest of the pool in one allocation.
  auto const rest = other.allocate(pool, (std::size_t{64} << 20) - (1 << 20), 0);
  EXPECT_TRUE(pool_reaches(daemon, pool, std::uint64_t{64} << 20, 2));
  other.free(rest.id);
  other.free(kept.id);
  EXPECT_TRUE(pool_reaches(daemon, pool, 0, 0));
}

}  // namespace
}  // namespace rmmd::test
