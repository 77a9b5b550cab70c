#include "daemon/service/rmmd_service.hpp"

#include "daemon/service/proto_convert.hpp"
#include "daemon/service/status_mapping.hpp"

#include <unistd.h>

namespace rmmd::service {
namespace {

using metrics::rpc_method;

/// Runs one call's body, and counts its status code and time.
template <typename Body>
grpc::Status observed(metrics::request_metrics& requests, rpc_method method, Body&& body)
{
  auto const start    = std::chrono::steady_clock::now();
  grpc::Status status = body();
  requests.record(
      method, static_cast<int>(status.error_code()), std::chrono::steady_clock::now() - start);
  return status;
}

}  // namespace

std::string_view daemon_version() noexcept
{
  return RMMD_VERSION;
}

rmmd_service::rmmd_service(core::daemon_core& core) : core_(core) {}

absl::StatusOr<core::session_id> rmmd_service::caller(grpc::ServerContext const& context) const
{
  auto const& md = context.client_metadata();
  auto it        = md.find(grpc::string_ref(token_metadata_key.data(), token_metadata_key.size()));
  if (it == md.end()) { return core_.authenticate({}); }
  return core_.authenticate(std::string_view(it->second.data(), it->second.size()));
}

grpc::Status rmmd_service::Allocate(grpc::ServerContext* context,
                                    v1::AllocateRequest const* request,
                                    v1::AllocateResponse* response)
{
  return observed(requests_, rpc_method::allocate, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    auto grant =
        core_.allocate(*session, request->pool_id(), request->size(), request->alignment());
    if (!grant.ok()) { return to_grpc_status(grant.status()); }
    to_proto(*grant, response);
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::Free(grpc::ServerContext* context,
                                v1::FreeRequest const* request,
                                v1::FreeResponse*)
{
  return observed(requests_, rpc_method::free, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    return to_grpc_status(core_.free(*session, request->allocation_id()));
  });
}

grpc::Status rmmd_service::ReportUsage(grpc::ServerContext* context,
                                       v1::UsageReport const* request,
                                       v1::UsageReply* response)
{
  return observed(requests_, rpc_method::report_usage, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    std::vector<core::carved_usage> usage;
    usage.reserve(static_cast<std::size_t>(request->pools_size()));
    for (auto const& p : request->pools()) {
      usage.push_back(core::carved_usage{.pool              = p.pool_id(),
                                         .bytes             = p.bytes(),
                                         .allocation_count  = p.allocation_count(),
                                         .slab_bytes        = p.slab_bytes(),
                                         .reclaimable_bytes = p.reclaimable_bytes()});
    }
    auto trim = core_.report_usage(*session, usage);
    if (!trim.ok()) { return to_grpc_status(trim.status()); }
    for (auto id : *trim) { response->add_trim_pool_ids(id); }
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::GetStats(grpc::ServerContext* context,
                                    v1::GetStatsRequest const* request,
                                    v1::Stats* response)
{
  return observed(requests_, rpc_method::get_stats, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    auto const top = request->has_top_sessions()
                         ? std::optional<std::size_t>(request->top_sessions())
                         : std::nullopt;
    to_proto(core_.stats(top), response);
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::ListSessions(grpc::ServerContext* context,
                                        v1::ListSessionsRequest const* request,
                                        v1::ListSessionsResponse* response)
{
  return observed(requests_, rpc_method::list_sessions, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    if (request->has_top_sessions()) {
      to_proto(core_.top_sessions(request->top_sessions()), response);
      return grpc::Status::OK;
    }
    auto all = core_.sessions();
    response->set_session_count(all.size());
    for (auto const& s : all) { to_proto(s, response->add_sessions()); }
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::ListPools(grpc::ServerContext* context,
                                     v1::ListPoolsRequest const*,
                                     v1::ListPoolsResponse* response)
{
  return observed(requests_, rpc_method::list_pools, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    for (auto const& p : core_.stats(0).pools) { to_proto(p, response->add_pools()); }
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::Trim(grpc::ServerContext* context,
                                v1::TrimRequest const* request,
                                v1::TrimResponse* response)
{
  return observed(requests_, rpc_method::trim, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    std::vector<core::pool_id> pools(request->pool_ids().begin(), request->pool_ids().end());
    auto trimmed = core_.trim(*session, pools);
    if (!trimmed.ok()) { return to_grpc_status(trimmed.status()); }
    for (auto const& t : *trimmed) { to_proto(t, response->add_pools()); }
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::Health(grpc::ServerContext*,
                                  v1::HealthRequest const*,
                                  v1::HealthResponse* response)
{
  return observed(requests_, rpc_method::health, [&] {
    response->set_status(core_.draining() ? v1::SERVING_STATUS_DRAINING
                                          : v1::SERVING_STATUS_SERVING);
    response->set_version(std::string(daemon_version()));
    response->set_started_unix_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(started_wall_.time_since_epoch())
            .count());
    response->set_uptime_seconds(
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                       std::chrono::steady_clock::now() - started_)
                                       .count()));
    response->set_pool_count(static_cast<std::uint32_t>(core_.pools().size()));
    response->set_session_count(static_cast<std::uint32_t>(core_.session_count()));
    response->set_pid(static_cast<std::int32_t>(::getpid()));
    response->set_metrics_address(metrics_address_);
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::CreateBuffer(grpc::ServerContext* context,
                                        v1::CreateBufferRequest const* request,
                                        v1::BufferGrant* response)
{
  return observed(requests_, rpc_method::create_buffer, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    auto grant = core_.create_buffer(
        *session, request->name(), request->pool_id(), request->size(), from_proto(*request));
    if (!grant.ok()) { return to_grpc_status(grant.status()); }
    to_proto(*grant, response);
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::PublishBuffer(grpc::ServerContext* context,
                                         v1::PublishBufferRequest const* request,
                                         v1::PublishBufferResponse*)
{
  return observed(requests_, rpc_method::publish_buffer, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    return to_grpc_status(core_.publish_buffer(*session, request->buffer_id()));
  });
}

grpc::Status rmmd_service::OpenBuffer(grpc::ServerContext* context,
                                      v1::OpenBufferRequest const* request,
                                      v1::BufferGrant* response)
{
  return observed(requests_, rpc_method::open_buffer, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    // Wait no longer than asked, than the caller waits for the answer, or
    // than max_open_wait.
    auto const now = std::chrono::steady_clock::now();
    auto wait      = std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(request->wait_ms()), max_open_wait);
    auto const left = context->deadline() - std::chrono::system_clock::now();
    if (left < wait) { wait = std::max<std::chrono::steady_clock::duration>(left, {}); }
    auto grant = core_.open_buffer(*session, request->name(), now + wait);
    if (!grant.ok()) { return to_grpc_status(grant.status()); }
    to_proto(*grant, response);
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::CloseBuffer(grpc::ServerContext* context,
                                       v1::CloseBufferRequest const* request,
                                       v1::CloseBufferResponse*)
{
  return observed(requests_, rpc_method::close_buffer, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    return to_grpc_status(core_.close_buffer(*session, request->buffer_id()));
  });
}

grpc::Status rmmd_service::DeleteBuffer(grpc::ServerContext* context,
                                        v1::DeleteBufferRequest const* request,
                                        v1::DeleteBufferResponse* response)
{
  return observed(requests_, rpc_method::delete_buffer, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    auto holders = core_.delete_buffer(*session, request->name());
    if (!holders.ok()) { return to_grpc_status(holders.status()); }
    response->set_holders(static_cast<std::uint32_t>(*holders));
    return grpc::Status::OK;
  });
}

grpc::Status rmmd_service::ListBuffers(grpc::ServerContext* context,
                                       v1::ListBuffersRequest const*,
                                       v1::ListBuffersResponse* response)
{
  return observed(requests_, rpc_method::list_buffers, [&] {
    auto session = caller(*context);
    if (!session.ok()) { return to_grpc_status(session.status()); }
    auto buffers = core_.list_buffers(*session);
    if (!buffers.ok()) { return to_grpc_status(buffers.status()); }
    for (auto const& b : *buffers) { to_proto(b, response->add_buffers()); }
    return grpc::Status::OK;
  });
}

metrics::daemon_snapshot rmmd_service::metrics_snapshot() const
{
  return metrics::daemon_snapshot{
      .version = std::string(daemon_version()),
      .uptime_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(),
      .draining      = core_.draining(),
      .stats         = core_.stats(),
      .requests      = requests_.snapshot(),
      .session_calls = session_calls_.snapshot()};
}

}  // namespace rmmd::service
