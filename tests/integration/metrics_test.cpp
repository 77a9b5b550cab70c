// The Prometheus endpoint of the real daemon: started with port 0, found
// through Health, scraped with cpp-httplib's client after real calls, and
// checked by promtool.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/shared_buffer.hpp>

#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

/// promtool on PATH, or empty.
std::string find_promtool()
{
  char const* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    auto candidate = std::filesystem::path(dir) / "promtool";
    if (::access(candidate.c_str(), X_OK) == 0) { return candidate.string(); }
  }
  return {};
}

/// The endpoint's address, from Health (the daemon picked the port).
std::string metrics_address_of(rmmd::session const& session)
{
  v1::HealthResponse h;
  auto ctx = rmmd::detail::impl_of(session).context();
  auto st  = rmmd::detail::impl_of(session).stub().Health(ctx.get(), {}, &h);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return h.metrics_address();
}

httplib::Result get(rmmd::session const& session, std::string const& path)
{
  auto const address = metrics_address_of(session);
  auto const colon   = address.rfind(':');
  httplib::Client client(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  client.set_connection_timeout(std::chrono::seconds(10));
  client.set_read_timeout(std::chrono::seconds(10));
  return client.Get(path);
}

/// The text of /metrics of the daemon that `session` is a session of.
std::string scrape(rmmd::session const& session)
{
  auto r = get(session, "/metrics");
  EXPECT_TRUE(r) << httplib::to_string(r.error());
  if (!r) { return {}; }
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  return r->body;
}

/// Samples of the family `name` in `text`.
std::size_t series_count(std::string const& text, std::string const& name)
{
  std::size_t n = 0;
  for (auto const& line : lines_of(text)) {
    if (line.starts_with(name + "{") || line.starts_with(name + " ")) { ++n; }
  }
  return n;
}

class Metrics : public ::testing::Test {
 protected:
  std::string metrics_address() const
  {
    return metrics_address_of(session_);
  }
  httplib::Result get(std::string const& path) const
  {
    return test::get(session_, path);
  }
  std::string scrape() const
  {
    return test::scrape(session_);
  }

  daemon_process daemon_{{"--host-pool-bytes", "64MiB", "--metrics-address", "127.0.0.1:0"}};
  // A client name that needs escaping in a label value.
  rmmd::session session_ = daemon_.open_session("say \"hi\" \\o/");
};

TEST_F(Metrics, TheEndpointListensOnLocalhostAtThePortHealthReports)
{
  auto const address = metrics_address();
  EXPECT_THAT(address, HasSubstr("127.0.0.1:"));
  EXPECT_NE(address, "127.0.0.1:0");
  auto missing = get("/");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("metrics are at /metrics"));
}

TEST_F(Metrics, ScrapeShowsPoolsSessionsUidsAndCallsByCode)
{
  auto pool = session_.host_pool().id;
  auto a    = session_.allocate(pool, 1 << 20, 0);
  auto b    = session_.allocate(pool, 2 << 20, 0);
  auto c    = session_.allocate(pool, 4096, 0);
  session_.free(a.id);
  EXPECT_THROW((void)session_.allocate(pool, 0, 0), rmmd::logic_error);  // INVALID_ARGUMENT
  EXPECT_THROW(session_.free(a.id), rmmd::logic_error);                  // NOT_FOUND
  EXPECT_THROW((void)session_.allocate(pool, 1ull << 40, 0), rmm::out_of_memory);

  auto const text = scrape();
  auto const held = std::to_string((2 << 20) + 4096);
  auto const uid  = std::to_string(::getuid());
  auto const me   = "session=\"" + std::to_string(session_.id()) + "\",uid=\"" + uid + "\",pid=\"" +
                  std::to_string(::getpid()) + "\"";
  for (auto const& line : std::vector<std::string>{
           "rmmd_sessions 1",
           "rmmd_draining 0",
           "rmmd_pool_info{pool=\"host\",pool_id=\"0\",backend=\"host\",device=\"-1\",gpu_uuid="
           "\"\","
           "pci_bus_id=\"\"} 1",
           "rmmd_pool_capacity_bytes{pool=\"host\"} " + std::to_string(64 << 20),
           "rmmd_pool_in_use_bytes{pool=\"host\"} " + held,
           "rmmd_pool_high_water_bytes{pool=\"host\"} " + std::to_string((3 << 20) + 4096),
           "rmmd_pool_live_allocations{pool=\"host\"} 2",
           "rmmd_pool_allocations_total{pool=\"host\"} 3",
           "rmmd_uid_bytes{uid=\"" + uid + "\"} " + held,
           "rmmd_uid_live_allocations{uid=\"" + uid + "\"} 2",
           "rmmd_uid_sessions{uid=\"" + uid + "\"} 1",
           // The session's calls travel on its session socket.
           "rmmd_session_calls_total{method=\"Allocate\",code=\"OK\"} 3",
           "rmmd_session_calls_total{method=\"Allocate\",code=\"INVALID_ARGUMENT\"} 1",
           "rmmd_session_calls_total{method=\"Allocate\",code=\"RESOURCE_EXHAUSTED\"} 1",
           "rmmd_session_calls_total{method=\"Free\",code=\"OK\"} 1",
           "rmmd_session_calls_total{method=\"Free\",code=\"NOT_FOUND\"} 1",
           "rmmd_session_call_duration_seconds_count{method=\"Allocate\"} 5",
           "rmmd_session_call_duration_seconds_bucket{method=\"Allocate\",le=\"+Inf\"} 5",
           "rmmd_session_call_duration_seconds_count{method=\"Free\"} 2",
           "rmmd_grpc_requests_total{method=\"Allocate\",code=\"OK\"} 0",
       }) {
    EXPECT_THAT(text, HasSubstr(line + "\n"));
  }
  // The session, with its client name escaped (\" and \\).
  EXPECT_THAT(text,
              AllOf(HasSubstr("rmmd_session_bytes{" + me),
                    HasSubstr("client=\"say \\\"hi\\\" \\\\o/\"} " + held + "\n"),
                    HasSubstr("rmmd_session_live_allocations{" + me)));
  EXPECT_THAT(text, HasSubstr("# TYPE rmmd_grpc_request_duration_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("rmmd_build_info{version=\""));
  session_.free(b.id);
  session_.free(c.id);
  EXPECT_THAT(scrape(), HasSubstr("rmmd_pool_in_use_bytes{pool=\"host\"} 0\n"));
}

TEST_F(Metrics, PromtoolAcceptsTheScrape)
{
  auto pool   = session_.host_pool().id;
  auto a      = session_.allocate(pool, 1 << 20, 0);
  auto shared = rmmd::shared_buffer::create(session_, "b", 4096, {.pool = "host"});
  EXPECT_THROW((void)session_.allocate(pool, 0, 0), rmmd::logic_error);
  auto const text = scrape();
  session_.free(a.id);
  auto const promtool = find_promtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool is not installed (Debian package `prometheus`; scripts/setup.sh "
                    "installs it)";
  }
  child_process check({promtool, "check", "metrics"}, {}, {.merge_stderr = true});
  for (auto const& line : lines_of(text)) { check.write_line(line); }
  check.close_stdin();
  auto const said = check.read_all();
  EXPECT_EQ(check.wait(), 0) << said << "\n--- the scrape:\n" << text;
  EXPECT_EQ(said, "") << text;
}

TEST_F(Metrics, SharedBuffersArePerPoolWithoutASeriesPerName)
{
  auto consumer = daemon_.open_session("consumer");
  auto weights =
      rmmd::shared_buffer::create(session_, "secret-team/model/w0", 1 << 20, {.pool = "host"});
  weights.publish();
  auto opened = rmmd::shared_buffer::open(consumer, "secret-team/model/w0");
  auto twice  = rmmd::shared_buffer::open(consumer, "secret-team/model/w0");  // one holder
  auto draft  = rmmd::shared_buffer::create(session_, "secret-team/draft", 4096, {.pool = "host"});
  // What the pool reserved for them, as the daemon reports it.
  v1::ListBuffersResponse listed;
  auto ctx = rmmd::detail::impl_of(session_).context();
  ASSERT_TRUE(rmmd::detail::impl_of(session_).stub().ListBuffers(ctx.get(), {}, &listed).ok());
  ASSERT_EQ(listed.buffers_size(), 2);
  auto const reserved = listed.buffers(0).reserved_bytes() + listed.buffers(1).reserved_bytes();
  EXPECT_GE(reserved, (1u << 20) + 4096);
  EXPECT_THROW((void)rmmd::shared_buffer::open(consumer, "secret-team/missing"),
               rmmd::not_found_error);

  auto const text = scrape();
  for (auto const& line : std::vector<std::string>{
           "# TYPE rmmd_pool_shared_buffers gauge",
           "# TYPE rmmd_pool_shared_bytes gauge",
           "# TYPE rmmd_pool_shared_buffer_holders gauge",
           "rmmd_pool_shared_buffers{pool=\"host\"} 2",
           "rmmd_pool_shared_bytes{pool=\"host\"} " + std::to_string(reserved),
           // The producer holds both, the consumer one (twice: it counts once).
           "rmmd_pool_shared_buffer_holders{pool=\"host\"} 3",
           // Part of what the pool lends; not allocations.
           "rmmd_pool_in_use_bytes{pool=\"host\"} " + std::to_string(reserved),
           "rmmd_pool_live_allocations{pool=\"host\"} 0",
           // The client library sends these on the session socket.
           "rmmd_session_calls_total{method=\"CreateBuffer\",code=\"OK\"} 2",
           "rmmd_session_calls_total{method=\"PublishBuffer\",code=\"OK\"} 1",
           "rmmd_session_calls_total{method=\"OpenBuffer\",code=\"OK\"} 2",
           "rmmd_session_calls_total{method=\"OpenBuffer\",code=\"NOT_FOUND\"} 1",
           "rmmd_grpc_requests_total{method=\"ListBuffers\",code=\"OK\"} 1",
       }) {
    EXPECT_THAT(text, HasSubstr(line + "\n"));
  }
  // Names are unbounded and may say more than an operator wants scraped:
  // no series carries one (rmmctl buffers lists them).
  EXPECT_THAT(text, Not(HasSubstr("secret-team"))) << text;
  EXPECT_THAT(text, Not(HasSubstr("buffer=\""))) << text;

  opened.close();
  twice.close();
  weights.close();
  draft.close();
  auto const after = scrape();
  for (auto const& line : std::vector<std::string>{
           "rmmd_pool_shared_buffers{pool=\"host\"} 0",
           "rmmd_pool_shared_bytes{pool=\"host\"} 0",
           "rmmd_pool_shared_buffer_holders{pool=\"host\"} 0",
           "rmmd_pool_in_use_bytes{pool=\"host\"} 0",
           "rmmd_session_calls_total{method=\"CloseBuffer\",code=\"OK\"} 4",
       }) {
    EXPECT_THAT(after, HasSubstr(line + "\n"));
  }
}

TEST(MetricsWithManySessions, OnlyTheTopSessionsHaveSeriesSoTheScrapeStaysBounded)
{
  daemon_process daemon({"--host-pool-bytes",
                         "64MiB",
                         "--metrics-address",
                         "127.0.0.1:0",
                         "--metrics-top-sessions",
                         "3"});
  // Sessions 1..n hold i * 4 KiB each: the last three opened hold the most.
  std::vector<rmmd::session> sessions;
  auto open_holding = [&](std::size_t n) {
    while (sessions.size() < n) {
      sessions.push_back(daemon.open_session("s" + std::to_string(sessions.size())));
      auto& s = sessions.back();
      (void)s.allocate(s.host_pool().id, sessions.size() * 4096, 0);
    }
  };
  open_holding(5);
  auto const few = scrape(sessions.front());
  open_holding(60);
  auto const many = scrape(sessions.front());

  EXPECT_EQ(lines_of(many).size(), lines_of(few).size())
      << "a scrape with 60 sessions has more lines than one with 5:\n"
      << many;
  EXPECT_EQ(series_count(many, "rmmd_session_bytes"), 3u) << many;
  EXPECT_EQ(series_count(many, "rmmd_session_live_allocations"), 3u) << many;
  for (std::size_t i : {57u, 58u, 59u}) {
    auto const& s = sessions[i];
    EXPECT_THAT(many, HasSubstr("rmmd_session_bytes{session=\"" + std::to_string(s.id()) + "\""));
  }
  auto const uid = std::to_string(::getuid());
  // 4 KiB * (1 + ... + 57) in the 57 sessions without series of their own.
  for (auto const& line : std::vector<std::string>{
           "rmmd_sessions 60",
           "rmmd_unlisted_sessions 57",
           "rmmd_unlisted_session_bytes " + std::to_string(4096 * 57 * 58 / 2),
           "rmmd_unlisted_session_live_allocations 57",
           "rmmd_uid_sessions{uid=\"" + uid + "\"} 60",
           "rmmd_uid_bytes{uid=\"" + uid + "\"} " + std::to_string(4096 * 60 * 61 / 2),
       }) {
    EXPECT_THAT(many, HasSubstr(line + "\n"));
  }
}

TEST(MetricsAddress, AMalformedAddressStopsTheDaemonSayingWhy)
{
  char tmpl[]               = "/tmp/rmmd-metrics-XXXXXX";
  std::filesystem::path dir = ::mkdtemp(tmpl);
  child_process rmmd({program_path("rmmd").string(),
                      "--runtime-dir",
                      dir.string(),
                      "--host-pool-bytes",
                      "1MiB",
                      "--metrics-address",
                      "localhost"},
                     {},
                     {.merge_stderr = true});
  rmmd.close_stdin();
  auto const said = rmmd.read_all();
  EXPECT_EQ(rmmd.wait(), 1) << said;
  EXPECT_THAT(
      said,
      AllOf(HasSubstr("metrics address 'localhost': no ':PORT'"), HasSubstr("expected HOST:PORT")));
  std::filesystem::remove_all(dir);
}

TEST(MetricsAddress, APortInUseStopsTheSecondDaemon)
{
  daemon_process first({"--host-pool-bytes", "1MiB", "--metrics-address", "127.0.0.1:0"});
  auto s = first.open_session();
  v1::HealthResponse h;
  auto ctx = rmmd::detail::impl_of(s).context();
  ASSERT_TRUE(rmmd::detail::impl_of(s).stub().Health(ctx.get(), {}, &h).ok());
  char tmpl[]               = "/tmp/rmmd-metrics-XXXXXX";
  std::filesystem::path dir = ::mkdtemp(tmpl);
  child_process second({program_path("rmmd").string(),
                        "--runtime-dir",
                        dir.string(),
                        "--host-pool-bytes",
                        "1MiB",
                        "--metrics-address",
                        h.metrics_address()},
                       {},
                       {.merge_stderr = true});
  second.close_stdin();
  auto const said = second.read_all();
  EXPECT_EQ(second.wait(), 1) << said;
  EXPECT_THAT(said, HasSubstr("cannot listen for metrics on " + h.metrics_address()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rmmd::test
