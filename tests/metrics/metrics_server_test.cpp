// The HTTP endpoint on its own: a real listening socket on localhost, scraped
// with cpp-httplib's client; and the address syntax.

#include "daemon/metrics/metrics_server.hpp"
#include "daemon/metrics/prometheus_text.hpp"

#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

namespace rmmd::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ParseListenAddress, AcceptsHostPortForms)
{
  auto a = parse_listen_address("127.0.0.1:9400");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9400);
  auto b = parse_listen_address("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  auto c = parse_listen_address(":9400");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "127.0.0.1");  // localhost unless told otherwise
  auto d = parse_listen_address("localhost:1");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->host, "localhost");
}

TEST(ParseListenAddress, RefusesMalformedOnesSayingWhy)
{
  struct bad {
    char const* text;
    char const* says;
  };
  for (auto const& b : {bad{"9400", "no ':PORT'"},
                        bad{"host:", "port must be a number"},
                        bad{"host:65536", "port must be a number"},
                        bad{"host:x1", "port must be a number"},
                        bad{"::1:9400", "IPv6 address must be written in brackets"},
                        bad{"[::1:9400", "needs [ and ]"}}) {
    auto r = parse_listen_address(b.text);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(b.says)) << b.text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("expected HOST:PORT"));
  }
}

TEST(MetricsServer, ServesTheScrapeAtSlashMetricsOnly)
{
  std::atomic<int> scrapes{0};
  metrics_server server("127.0.0.1:0", [&] {
    ++scrapes;
    return std::string("# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n");
  });
  ASSERT_THAT(server.address(), HasSubstr("127.0.0.1:"));
  auto const port = std::stoi(server.address().substr(server.address().rfind(':') + 1));
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  auto r = client.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), prometheus_content_type);
  EXPECT_EQ(r->body, "# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n");
  EXPECT_EQ(scrapes.load(), 1);
  auto missing = client.Get("/");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("/metrics"));
  EXPECT_EQ(scrapes.load(), 1);
}

TEST(MetricsServer, APortInUseIsAnErrorNamingTheAddress)
{
  metrics_server first("127.0.0.1:0", [] { return std::string(); });
  try {
    metrics_server second(first.address(), [] { return std::string(); });
    FAIL() << "a second server bound " << first.address();
  } catch (std::runtime_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot listen for metrics on " + first.address()));
  }
  EXPECT_THROW(metrics_server("nonsense", [] { return std::string(); }), std::invalid_argument);
}

TEST(MetricsServer, StopsRightAfterStarting)
{
  for (int i = 0; i < 20; ++i) {
    metrics_server server("127.0.0.1:0", [] { return std::string(); });
  }
}

}  // namespace
}  // namespace rmmd::metrics
