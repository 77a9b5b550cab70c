// The Prometheus text, rendered from hand-made snapshots: names, HELP/TYPE,
// label escaping, histograms; and the call counters that feed it, named by
// the call table.

#include "daemon/metrics/prometheus_text.hpp"
#include "daemon/metrics/admission_metrics.hpp"
#include "daemon/metrics/request_metrics.hpp"
#include "daemon/wire/calls.hpp"
#include "tests/tools/text.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::metrics {
namespace {

using rmmd::test::lines_of;

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

daemon_snapshot sample_snapshot()
{
  daemon_snapshot s;
  s.version        = "9.8.7";
  s.uptime_seconds = 12.5;
  s.draining       = true;
  core::pool_stats host;
  host.pool.id             = 0;
  host.pool.name           = "host";
  host.pool.backend        = {.name = "host", .space = core::memory_space::host};
  host.pool.device         = -1;
  host.pool.capacity_bytes = 1 << 20;
  host.in_use_bytes        = 4096;
  host.high_water_bytes    = 8192;
  host.allocation_count    = 1;
  host.total_allocations   = 3;
  host.shared_buffers      = 2;
  host.shared_bytes        = 8192;
  host.shared_holders      = 5;
  core::pool_stats gpu;
  gpu.pool.id                = 1;
  gpu.pool.name              = "gpu0";
  gpu.pool.backend           = {.name = "cuda", .space = core::memory_space::device};
  gpu.pool.device            = 0;
  gpu.pool.gpu_uuid          = "GPU-5f3c2b1a-0000-1111-2222-333344445555";
  gpu.pool.pci_bus_id        = "0000:3b:00.0";
  gpu.pool.capacity_bytes    = 1 << 30;
  gpu.backend_reserved_bytes = 1 << 25;
  gpu.tenants = {{.tenant = "uid 1000", .in_use_bytes = 4096, .backend_reserved_bytes = 1 << 24},
                 {.tenant = "uid 1001", .in_use_bytes = 0, .backend_reserved_bytes = 1 << 24}};
  gpu.backend_used_bytes      = 1 << 24;
  gpu.release_threshold_bytes = 1 << 23;
  s.stats.pools               = {host, gpu};
  core::session_info a;
  a.id                 = 7;
  a.peer               = {.pid = 100, .uid = 1000, .gid = 1000};
  a.command            = "python3";
  a.client_name        = "say \"hi\"\\now\nnext";
  a.bytes              = 4096;
  a.allocation_count   = 1;
  core::session_info b = a;
  b.id                 = 8;
  b.client_name        = "plain";
  b.bytes              = 100;
  b.allocation_count   = 2;
  s.stats.sessions     = {a, b};
  // Each transport's methods as the daemon names them: from the call table.
  request_metrics requests(wire::call_names(wire::transport::grpc));
  requests.record("Allocate", 0, 20us);  // first bucket
  requests.record("Allocate", 0, 25us);  // le is inclusive: first bucket too
  requests.record("Allocate", 3, 2ms);   // INVALID_ARGUMENT
  requests.record("Free", 0, 10s);       // above every bound
  requests.record("Free", 99, 1us);      // not a code: UNKNOWN
  s.requests = requests.snapshot();
  request_metrics session_calls(wire::call_names(wire::transport::session_socket));
  session_calls.record("Allocate", 0, 40us);
  session_calls.record("Free", 5, 3us);        // NOT_FOUND
  session_calls.record("OpenBuffer", 9, 4us);  // FAILED_PRECONDITION
  session_calls.record("BlocksDropped", 0, 2us);
  s.session_calls = session_calls.snapshot();
  return s;
}

TEST(EscapeLabelValue, EscapesBackslashQuoteAndLineFeed)
{
  EXPECT_EQ(escape_label_value("plain"), "plain");
  EXPECT_EQ(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(escape_label_value(""), "");
}

TEST(RequestMetrics, CountsByMethodAndCodeAndBucketsLatency)
{
  auto const s      = sample_snapshot().requests;
  auto const* alloc = s.find("Allocate");
  auto const* freed = s.find("Free");
  ASSERT_TRUE(alloc != nullptr && freed != nullptr);
  EXPECT_EQ(alloc->calls[0], 2u);
  EXPECT_EQ(alloc->calls[3], 1u);
  EXPECT_EQ(freed->calls[0], 1u);
  EXPECT_EQ(freed->calls[2], 1u);  // code 99 counted as UNKNOWN
  EXPECT_EQ(alloc->latency.buckets[0], 2u);
  EXPECT_EQ(alloc->latency.buckets[6], 1u);  // 2 ms: (1 ms, 2.5 ms]
  EXPECT_EQ(alloc->latency.count(), 3u);
  EXPECT_NEAR(alloc->latency.sum_seconds, 45e-6 + 2e-3, 1e-9);
  EXPECT_EQ(freed->latency.buckets.back(), 1u);  // 10 s: only +Inf
  EXPECT_EQ(status_code_name(16), "UNAUTHENTICATED");
  EXPECT_EQ(status_code_name(-1), "UNKNOWN");
}

TEST(RequestMetrics, CountsOnlyTheMethodsItNames)
{
  request_metrics calls({"Allocate", "Free"});
  EXPECT_EQ(calls.slot("Free"), 1u);
  EXPECT_FALSE(calls.slot("GetStats"));
  calls.record("GetStats", 0, 1us);  // not counted here: nothing
  calls.record(*calls.slot("Free"), 0, 1us);
  auto const s = calls.snapshot();
  ASSERT_EQ(s.methods.size(), 2u);
  EXPECT_EQ(s.methods[0].method, "Allocate");
  EXPECT_EQ(s.methods[1].calls[0], 1u);
  EXPECT_EQ(s.find("GetStats"), nullptr);
}

// Dashboards and alerts read these label values: the call table must keep
// naming every one of them, on the transport it was counted on.
TEST(RequestMetrics, TheCallTableKeepsTheMethodLabels)
{
  auto const grpc    = wire::call_names(wire::transport::grpc);
  auto const session = wire::call_names(wire::transport::session_socket);
  for (std::string name : {"Allocate",
                           "Free",
                           "GetStats",
                           "ListSessions",
                           "ListPools",
                           "Trim",
                           "Health",
                           "ReportUsage",
                           "CreateBuffer",
                           "PublishBuffer",
                           "OpenBuffer",
                           "WaitBufferLease",
                           "CloseBuffer",
                           "DeleteBuffer",
                           "ListBuffers",
                           "SetBufferManifest",
                           "DescribeBuffer",
                           "GetBufferManifest"}) {
    EXPECT_THAT(grpc, ::testing::Contains(name));
  }
  for (std::string name : {"Allocate",
                           "Free",
                           "CreateBuffer",
                           "PublishBuffer",
                           "OpenBuffer",
                           "CloseBuffer",
                           "BlocksDropped"}) {
    EXPECT_THAT(session, ::testing::Contains(name));
  }
  EXPECT_THAT(grpc, Not(::testing::Contains("BlocksDropped")));
  // A standby's wait is held by the daemon: gRPC only.
  EXPECT_THAT(session, Not(::testing::Contains("WaitBufferLease")));
}

TEST(RenderPrometheus, EveryFamilyHasHelpAndTypeBeforeItsSamples)
{
  auto const text = render_prometheus(sample_snapshot());
  std::map<std::string, std::string> type_of;
  std::set<std::string> helped;
  for (auto const& line : lines_of(text)) {
    ASSERT_FALSE(line.empty());
    if (line.starts_with("# HELP ")) {
      helped.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.starts_with("# TYPE ")) {
      auto rest = line.substr(7);
      auto name = rest.substr(0, rest.find(' '));
      EXPECT_TRUE(helped.contains(name)) << "TYPE before HELP: " << line;
      EXPECT_FALSE(type_of.contains(name)) << "family declared twice: " << name;
      type_of[name] = rest.substr(rest.find(' ') + 1);
      continue;
    }
    auto name = line.substr(0, line.find_first_of("{ "));
    EXPECT_TRUE(name.starts_with("rmmd_")) << line;
    auto family = name;
    for (std::string suffix : {"_bucket", "_sum", "_count"}) {
      if (!type_of.contains(family) && family.ends_with(suffix)) {
        family = family.substr(0, family.size() - suffix.size());
      }
    }
    ASSERT_TRUE(type_of.contains(family)) << "sample without TYPE: " << line;
    if (type_of[family] == "counter") { EXPECT_TRUE(family.ends_with("_total")) << family; }
  }
  EXPECT_EQ(type_of["rmmd_grpc_request_duration_seconds"], "histogram");
  EXPECT_EQ(type_of["rmmd_grpc_requests_total"], "counter");
  EXPECT_EQ(type_of["rmmd_pool_allocations_total"], "counter");
  EXPECT_EQ(type_of["rmmd_pool_shared_buffers"], "gauge");
  EXPECT_EQ(type_of["rmmd_pool_shared_bytes"], "gauge");
  EXPECT_EQ(type_of["rmmd_pool_shared_buffer_holders"], "gauge");
}

TEST(RenderPrometheus, ShowsThePoolsSessionsUidsAndDaemon)
{
  auto const text = render_prometheus(sample_snapshot());
  for (std::string line : {
           "rmmd_build_info{version=\"9.8.7\"} 1",
           "rmmd_uptime_seconds 12.5",
           "rmmd_draining 1",
           "rmmd_sessions 2",
           "rmmd_pool_info{pool=\"host\",pool_id=\"0\",backend=\"host\",device=\"-1\",gpu_uuid="
           "\"\","
           "pci_bus_id=\"\"} 1",
           "rmmd_pool_info{pool=\"gpu0\",pool_id=\"1\",backend=\"cuda\",device=\"0\","
           "gpu_uuid=\"GPU-5f3c2b1a-0000-1111-2222-333344445555\",pci_bus_id=\"0000:3b:00.0\"} 1",
           "rmmd_pool_capacity_bytes{pool=\"host\"} 1048576",
           "rmmd_pool_in_use_bytes{pool=\"host\"} 4096",
           "rmmd_pool_high_water_bytes{pool=\"host\"} 8192",
           "rmmd_pool_live_allocations{pool=\"host\"} 1",
           "rmmd_pool_allocations_total{pool=\"host\"} 3",
           "rmmd_pool_reserved_bytes{pool=\"gpu0\"} 33554432",
           "rmmd_pool_used_bytes{pool=\"gpu0\"} 16777216",
           "rmmd_pool_release_threshold_bytes{pool=\"gpu0\"} 8388608",
           "rmmd_pool_shared_buffers{pool=\"host\"} 2",
           "rmmd_pool_shared_bytes{pool=\"host\"} 8192",
           "rmmd_pool_shared_buffer_holders{pool=\"host\"} 5",
           "rmmd_pool_shared_buffers{pool=\"gpu0\"} 0",  // every pool, none or not
           "rmmd_session_bytes{session=\"7\",uid=\"1000\",pid=\"100\",command=\"python3\","
           "client=\"say \\\"hi\\\"\\\\now\\nnext\"} 4096",
           "rmmd_session_live_allocations{session=\"8\",uid=\"1000\",pid=\"100\",command="
           "\"python3\",client=\"plain\"} 2",
           "rmmd_uid_bytes{uid=\"1000\"} 4196",
           "rmmd_uid_live_allocations{uid=\"1000\"} 3",
           "rmmd_uid_sessions{uid=\"1000\"} 2",
           "rmmd_tenant_pool_in_use_bytes{pool=\"gpu0\",tenant=\"uid 1000\"} 4096",
           "rmmd_tenant_pool_in_use_bytes{pool=\"gpu0\",tenant=\"uid 1001\"} 0",
           "rmmd_tenant_pool_backend_reserved_bytes{pool=\"gpu0\",tenant=\"uid 1001\"} 16777216",
       }) {
    EXPECT_THAT(text, HasSubstr(line + "\n"));
  }
  // A host pool has no driver figures: no series rather than a made-up 0.
  EXPECT_THAT(text, Not(HasSubstr("rmmd_pool_reserved_bytes{pool=\"host\"}")));
  EXPECT_THAT(text, Not(HasSubstr("rmmd_pool_release_threshold_bytes{pool=\"host\"}")));
}

/// A snapshot of `count` sessions of `uids` users; session i holds i KiB in i
/// allocations (session 0 holds nothing).
daemon_snapshot many_sessions(std::size_t count, std::size_t uids)
{
  daemon_snapshot s;
  s.version = "1";
  for (std::size_t i = 0; i < count; ++i) {
    core::session_info info;
    info.id               = static_cast<core::session_id>(i + 1);
    info.peer.uid         = static_cast<uid_t>(1000 + i % uids);
    info.peer.pid         = static_cast<pid_t>(10000 + i);
    info.command          = "worker";
    info.client_name      = "c" + std::to_string(i);
    info.bytes            = i * 1024;
    info.allocation_count = i;
    s.stats.sessions.push_back(info);
  }
  return s;
}

/// Lines of `text` that are samples of the family `name` (with labels or not).
std::size_t series_count(std::string const& text, std::string const& name)
{
  std::size_t n = 0;
  for (auto const& line : lines_of(text)) {
    if (line.starts_with(name + "{") || line.starts_with(name + " ")) { ++n; }
  }
  return n;
}

TEST(RenderPrometheus, OnlyTheTopSessionsByBytesHaveSeriesTheRestAreSummed)
{
  auto const text = render_prometheus(many_sessions(20, 2), render_options{.top_sessions = 3});
  EXPECT_EQ(series_count(text, "rmmd_session_bytes"), 3u);
  EXPECT_EQ(series_count(text, "rmmd_session_live_allocations"), 3u);
  // Sessions 20, 19 and 18 (ids; i = 19, 18, 17) hold the most.
  for (std::string line : {
           "rmmd_session_bytes{session=\"20\",uid=\"1001\",pid=\"10019\",command=\"worker\","
           "client=\"c19\"} 19456",
           "rmmd_session_bytes{session=\"19\",uid=\"1000\",pid=\"10018\",command=\"worker\","
           "client=\"c18\"} 18432",
           "rmmd_session_live_allocations{session=\"18\",uid=\"1001\",pid=\"10017\","
           "command=\"worker\",client=\"c17\"} 17",
           // The other 17 (i = 0..16): 136 KiB in 136 allocations.
           "rmmd_unlisted_sessions 17",
           "rmmd_unlisted_session_bytes 139264",
           "rmmd_unlisted_session_live_allocations 136",
           // The uids still count every session.
           "rmmd_uid_sessions{uid=\"1000\"} 10",
           "rmmd_uid_sessions{uid=\"1001\"} 10",
           "rmmd_uid_bytes{uid=\"1000\"} 92160",
           "rmmd_sessions 20",
       }) {
    EXPECT_THAT(text, HasSubstr(line + "\n"));
  }
  EXPECT_THAT(text, Not(HasSubstr("session=\"17\"")));
}

TEST(RenderPrometheus, TheNumberOfSeriesDoesNotGrowWithTheNumberOfSessions)
{
  auto const few  = render_prometheus(many_sessions(20, 4));
  auto const many = render_prometheus(many_sessions(5000, 4));
  EXPECT_EQ(lines_of(many).size(), lines_of(few).size())
      << "a scrape with 5000 sessions has more lines than one with 20";
  EXPECT_EQ(series_count(many, "rmmd_session_bytes"), 10u);  // the default top_sessions
  EXPECT_THAT(many, HasSubstr("rmmd_unlisted_sessions 4990\n"));
  EXPECT_THAT(many, HasSubstr("rmmd_sessions 5000\n"));
  // Only wider numbers (ids, pids, sums) make it longer.
  EXPECT_LT(many.size(), few.size() + 1024)
      << "20 sessions: " << few.size() << " bytes; 5000 sessions: " << many.size() << " bytes";
}

TEST(RenderPrometheus, TopSessionsZeroShowsNoSessionSeries)
{
  auto const text = render_prometheus(many_sessions(5, 1), render_options{.top_sessions = 0});
  EXPECT_EQ(series_count(text, "rmmd_session_bytes"), 0u);
  EXPECT_EQ(series_count(text, "rmmd_session_live_allocations"), 0u);
  // The families are still declared, and the sums cover every session.
  EXPECT_THAT(text, HasSubstr("# TYPE rmmd_session_bytes gauge\n"));
  EXPECT_THAT(text, HasSubstr("rmmd_unlisted_sessions 5\n"));
  EXPECT_THAT(text, HasSubstr("rmmd_unlisted_session_bytes 10240\n"));
  EXPECT_THAT(text, HasSubstr("rmmd_uid_bytes{uid=\"1000\"} 10240\n"));
}

TEST(RenderPrometheus, SharedBytesAreChargedToTheCreatorsUidWithoutASession)
{
  auto snapshot                         = many_sessions(2, 1);
  snapshot.stats.uid_shared_bytes[1000] = 8 << 20;
  snapshot.stats.uid_shared_bytes[2000] = 1 << 20;  // its creator's session has ended
  auto const text                       = render_prometheus(snapshot, render_options{});
  EXPECT_THAT(text, HasSubstr("# TYPE rmmd_uid_shared_bytes gauge\n"));
  EXPECT_THAT(text, HasSubstr("rmmd_uid_shared_bytes{uid=\"1000\"} 8388608\n"));
  EXPECT_THAT(text, HasSubstr("rmmd_uid_shared_bytes{uid=\"2000\"} 1048576\n"));
  EXPECT_EQ(series_count(text, "rmmd_uid_bytes"), 1u);  // leases: uid 1000's sessions only
}

TEST(RenderPrometheus, TiesInBytesKeepTheOldestSessions)
{
  auto snapshot = many_sessions(6, 1);
  for (auto& i : snapshot.stats.sessions) {
    i.bytes            = 4096;
    i.allocation_count = 1;
  }
  auto const text = render_prometheus(snapshot, render_options{.top_sessions = 2});
  EXPECT_THAT(text, HasSubstr("rmmd_session_bytes{session=\"1\","));
  EXPECT_THAT(text, HasSubstr("rmmd_session_bytes{session=\"2\","));
  EXPECT_EQ(series_count(text, "rmmd_session_bytes"), 2u);
}

TEST(RenderPrometheus, ShowsRestartsReadoptedBuffersAndUnaccountedGpuMemory)
{
  auto s             = sample_snapshot();
  s.stats.restart    = {.restarts             = 3,
                        .adopted_buffers      = 2,
                        .adopted_bytes        = 1 << 21,
                        .dropped              = 1,
                        .keeping              = true,
                        .reconnected_sessions = 4};
  s.stats.gpu_memory = {{.gpu_uuid          = "GPU-5f3c2b1a-0000-1111-2222-333344445555",
                         .device            = 0,
                         .driver_used_bytes = 1 << 26,
                         .ledger_bytes      = 1 << 25,
                         .unaccounted_bytes = 1 << 25}};
  auto const text    = render_prometheus(s);
  for (auto const& line :
       {"rmmd_restarts_total 3",
        "rmmd_readopted_buffers 2",
        "rmmd_readopted_bytes 2097152",
        "rmmd_restart_dropped 1",
        "rmmd_keeping_buffers 1",
        "rmmd_reconnected_sessions_total 4",
        "rmmd_gpu_driver_used_bytes{gpu_uuid=\"GPU-5f3c2b1a-0000-1111-2222-333344445555\","
        "device=\"0\"} 67108864",
        "rmmd_gpu_unaccounted_bytes{gpu_uuid=\"GPU-5f3c2b1a-0000-1111-2222-333344445555\","
        "device=\"0\"} 33554432"}) {
    EXPECT_THAT(text, HasSubstr(std::string(line) + "\n"));
  }
}

TEST(RenderPrometheus, WriteLeasesGrantsWaitsTimeoutsAndTheTakeoverHistogram)
{
  auto s   = sample_snapshot();
  s.leases = {.held = 2, .waiters = 3, .grants = 7, .waits = 5, .wait_timeouts = 1};
  s.leases.takeover_buckets[3]  = 2;  // <= 1 ms
  s.leases.takeover_buckets[12] = 1;  // above 1 s
  s.leases.takeover_seconds_sum = 1.5;
  auto const text               = render_prometheus(s);
  for (std::string line : {
           "# TYPE rmmd_buffer_leases_held gauge",
           "rmmd_buffer_leases_held 2",
           "rmmd_buffer_lease_waiters 3",
           "# TYPE rmmd_buffer_lease_grants_total counter",
           "rmmd_buffer_lease_grants_total 7",
           "rmmd_buffer_lease_waits_total 5",
           "rmmd_buffer_lease_wait_timeouts_total 1",
           "# TYPE rmmd_buffer_lease_takeover_seconds histogram",
           "rmmd_buffer_lease_takeover_seconds_bucket{le=\"0.0005\"} 0",
           "rmmd_buffer_lease_takeover_seconds_bucket{le=\"0.001\"} 2",
           "rmmd_buffer_lease_takeover_seconds_bucket{le=\"1\"} 2",
           "rmmd_buffer_lease_takeover_seconds_bucket{le=\"+Inf\"} 3",
           "rmmd_buffer_lease_takeover_seconds_sum 1.5",
           "rmmd_buffer_lease_takeover_seconds_count 3",
       }) {
    EXPECT_THAT(text, HasSubstr(line + "\n"));
  }
}

TEST(RenderPrometheus, CallsByCodeAndCumulativeHistograms)
{
  auto const text = render_prometheus(sample_snapshot());
  for (std::string line : {
           "rmmd_grpc_requests_total{method=\"Allocate\",code=\"OK\"} 2",
           "rmmd_grpc_requests_total{method=\"Allocate\",code=\"INVALID_ARGUMENT\"} 1",
           "rmmd_grpc_requests_total{method=\"Free\",code=\"OK\"} 1",
           "rmmd_grpc_requests_total{method=\"Free\",code=\"UNKNOWN\"} 1",
           "rmmd_grpc_requests_total{method=\"Health\",code=\"OK\"} 0",  // OK is always there
           "rmmd_grpc_request_duration_seconds_bucket{method=\"Allocate\",le=\"2.5e-05\"} 2",
           "rmmd_grpc_request_duration_seconds_bucket{method=\"Allocate\",le=\"0.001\"} 2",
           "rmmd_grpc_request_duration_seconds_bucket{method=\"Allocate\",le=\"0.0025\"} 3",
           "rmmd_grpc_request_duration_seconds_bucket{method=\"Allocate\",le=\"+Inf\"} 3",
           "rmmd_grpc_request_duration_seconds_count{method=\"Allocate\"} 3",
           "rmmd_grpc_request_duration_seconds_sum{method=\"Allocate\"} 0.002045",
           "rmmd_grpc_request_duration_seconds_bucket{method=\"Free\",le=\"2.5\"} 1",
           "rmmd_grpc_request_duration_seconds_bucket{method=\"Free\",le=\"+Inf\"} 2",
           // Session-socket calls: their own families, for the calls the
           // session socket carries (Allocate, Free, four buffer calls and BlocksDropped).
           "rmmd_session_calls_total{method=\"Allocate\",code=\"OK\"} 1",
           "rmmd_session_calls_total{method=\"Free\",code=\"OK\"} 0",
           "rmmd_session_calls_total{method=\"Free\",code=\"NOT_FOUND\"} 1",
           "rmmd_session_call_duration_seconds_bucket{method=\"Allocate\",le=\"2.5e-05\"} 0",
           "rmmd_session_call_duration_seconds_bucket{method=\"Allocate\",le=\"5e-05\"} 1",
           "rmmd_session_call_duration_seconds_count{method=\"Free\"} 1",
           "rmmd_session_calls_total{method=\"CreateBuffer\",code=\"OK\"} 0",
           "rmmd_session_calls_total{method=\"PublishBuffer\",code=\"OK\"} 0",
           "rmmd_session_calls_total{method=\"OpenBuffer\",code=\"FAILED_PRECONDITION\"} 1",
           "rmmd_session_calls_total{method=\"CloseBuffer\",code=\"OK\"} 0",
           "rmmd_session_calls_total{method=\"BlocksDropped\",code=\"OK\"} 1",
           "rmmd_grpc_requests_total{method=\"DeleteBuffer\",code=\"OK\"} 0",
           "rmmd_grpc_requests_total{method=\"ListBuffers\",code=\"OK\"} 0",
       }) {
    EXPECT_THAT(text, HasSubstr(line + "\n"));
  }
  // Codes that never happened.
  EXPECT_THAT(text, Not(HasSubstr("rmmd_grpc_requests_total{method=\"Free\",code=\"NOT_FOUND\"}")));
  EXPECT_THAT(text, Not(HasSubstr("rmmd_session_calls_total{method=\"GetStats\"")));
  // A histogram from a method's first answer on.
  EXPECT_THAT(text, Not(HasSubstr("rmmd_grpc_request_duration_seconds_bucket{method=\"Health\"")));
  EXPECT_THAT(text, Not(HasSubstr("rmmd_grpc_request_duration_seconds_count{method=\"Health\"")));
  // DeleteBuffer and ListBuffers travel on gRPC only.
  EXPECT_THAT(text, Not(HasSubstr("rmmd_session_calls_total{method=\"DeleteBuffer\"")));
  EXPECT_THAT(text, Not(HasSubstr("rmmd_session_calls_total{method=\"ListBuffers\"")));
}

TEST(RenderPrometheus, AdmissionRefusalsByLimitAndWaitingConnections)
{
  admission_metrics admission;
  admission.refused(admission_limit::max_pending_per_uid);
  admission.refused(admission_limit::max_pending_per_uid);
  admission.refused(admission_limit::max_sessions_total);
  admission.set_pending(5);
  auto snapshot      = sample_snapshot();
  snapshot.admission = admission.snapshot();
  auto const text    = render_prometheus(snapshot);
  // One series per limit, always (rates start at 0); never one per uid.
  for (std::string line : {
           "# TYPE rmmd_admission_refusals_total counter",
           "rmmd_admission_refusals_total{limit=\"max_pending_per_uid\"} 2",
           "rmmd_admission_refusals_total{limit=\"max_pending_total\"} 0",
           "rmmd_admission_refusals_total{limit=\"max_sessions_per_uid\"} 0",
           "rmmd_admission_refusals_total{limit=\"max_sessions_total\"} 1",
           "# TYPE rmmd_session_socket_pending_connections gauge",
           "rmmd_session_socket_pending_connections 5",
       }) {
    EXPECT_THAT(text, HasSubstr(line + "\n"));
  }
}

}  // namespace
}  // namespace rmmd::metrics
