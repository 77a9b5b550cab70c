#include "daemon/wire/calls.hpp"

#include "daemon/version.hpp"
#include "daemon/wire/proto_convert.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <unistd.h>

#include <chrono>
#include <optional>
#include <vector>

// What the daemon shows of itself: GetStats, ListSessions, ListPools, Health,
// ListPeers; and Ping, the session socket's round trip.

namespace rmmd::wire {
namespace {

void get_stats(core::daemon_core const& core, v1::GetStatsRequest const& request, v1::Stats* reply)
{
  auto const top = request.has_top_sessions() ? std::optional<std::size_t>(request.top_sessions())
                                              : std::nullopt;
  to_proto(core.pools().stats(top), reply);
}

void list_sessions(core::daemon_core const& core,
                   v1::ListSessionsRequest const& request,
                   v1::ListSessionsResponse* reply)
{
  if (request.has_top_sessions()) {
    to_proto(core.sessions().top_sessions(request.top_sessions()), reply);
    return;
  }
  auto all = core.sessions().list();
  reply->set_session_count(all.size());
  for (auto const& s : all) { to_proto(s, reply->add_sessions()); }
}

void list_pools(core::daemon_core const& core, v1::ListPoolsResponse* reply)
{
  for (auto const& p : core.pools().stats(0).pools) { to_proto(p, reply->add_pools()); }
}

absl::Status health(call_context const& c, v1::HealthRequest const&, v1::HealthResponse* response)
{
  response->set_status(c.core.draining() ? v1::SERVING_STATUS_DRAINING
                                         : v1::SERVING_STATUS_SERVING);
  response->set_version(std::string(daemon_version()));
  if (c.facts != nullptr) {
    response->set_started_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      c.facts->started_wall.time_since_epoch())
                                      .count());
    response->set_uptime_seconds(
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                       std::chrono::steady_clock::now() - c.facts->started)
                                       .count()));
    response->set_metrics_address(c.facts->metrics_address);
  }
  response->set_pool_count(static_cast<std::uint32_t>(c.core.pools().list().size()));
  response->set_session_count(static_cast<std::uint32_t>(c.core.sessions().session_count()));
  response->set_pid(static_cast<std::int32_t>(::getpid()));
  return absl::OkStatus();
}

}  // namespace

std::vector<call> daemon_calls()
{
  return {
      make_call<v1::GetStatsRequest, v1::Stats>(
          "GetStats",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            get_stats(c.core, request, reply);
            return absl::OkStatus();
          }),
      make_call<v1::ListSessionsRequest, v1::ListSessionsResponse>(
          "ListSessions",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            list_sessions(c.core, request, reply);
            return absl::OkStatus();
          }),
      make_call<v1::ListPoolsRequest, v1::ListPoolsResponse>(
          "ListPools",
          {},
          [](call_context const& c, auto const&, auto* reply) {
            list_pools(c.core, reply);
            return absl::OkStatus();
          }),
      make_call<v1::HealthRequest, v1::HealthResponse>("Health", {.needs_session = false}, &health),
      make_call<v1::ListPeersRequest, v1::ListPeersResponse>(
          "ListPeers",
          {},
          [](call_context const& c, auto const&, auto* reply) {
            if (c.remote != nullptr) { c.remote->list_peers(reply); }
            return absl::OkStatus();
          }),
      // Answered at once with an empty reply: a liveness check, and the round
      // trip that every call pays.
      make_call<v1::Ping, v1::Ping>(
          "Ping",
          {.grpc    = false,
           .session = on_session<&v1::SessionCall::ping, &v1::SessionReply::mutable_ping>("ping")},
          [](call_context const&, auto const&, auto*) { return absl::OkStatus(); }),
  };
}

}  // namespace rmmd::wire
