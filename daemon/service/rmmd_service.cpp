#include "daemon/service/rmmd_service.hpp"

#include "daemon/wire/core_calls.hpp"
#include "daemon/wire/status_mapping.hpp"

#include <absl/strings/str_format.h>

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

/// A call of an authenticated session: its body, given the caller's session,
/// returns the core's status; the caller's token failing, that one.
template <typename Body>
grpc::Status session_call(absl::StatusOr<core::session_id> const& session, Body&& body)
{
  if (!session.ok()) { return wire::to_grpc_status(session.status()); }
  return wire::to_grpc_status(body(*session));
}

}  // namespace

std::string_view daemon_version() noexcept
{
  return RMMD_VERSION;
}

rmmd_service::rmmd_service(core::daemon_core& core, metrics::request_metrics& requests)
    : core_(core), requests_(requests)
{
}

absl::StatusOr<core::session_id> rmmd_service::caller(grpc::ServerContext const& context) const
{
  auto const& md = context.client_metadata();
  auto it        = md.find(grpc::string_ref(token_metadata_key.data(), token_metadata_key.size()));
  if (it == md.end()) { return core_.sessions().authenticate({}); }
  return core_.sessions().authenticate(std::string_view(it->second.data(), it->second.size()));
}

grpc::Status rmmd_service::Allocate(grpc::ServerContext* context,
                                    v1::AllocateRequest const* request,
                                    v1::AllocateResponse* response)
{
  return observed(requests_, rpc_method::allocate, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::allocate(core_, session, *request, {}, response);
    });
  });
}

grpc::Status rmmd_service::Free(grpc::ServerContext* context,
                                v1::FreeRequest const* request,
                                v1::FreeResponse*)
{
  return observed(requests_, rpc_method::free, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::free(core_, session, *request);
    });
  });
}

grpc::Status rmmd_service::ReportUsage(grpc::ServerContext* context,
                                       v1::UsageReport const* request,
                                       v1::UsageReply* response)
{
  return observed(requests_, rpc_method::report_usage, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::report_usage(core_, session, *request, response);
    });
  });
}

grpc::Status rmmd_service::GetStats(grpc::ServerContext* context,
                                    v1::GetStatsRequest const* request,
                                    v1::Stats* response)
{
  return observed(requests_, rpc_method::get_stats, [&] {
    return session_call(caller(*context), [&](core::session_id) {
      wire::get_stats(core_, *request, response);
      return absl::OkStatus();
    });
  });
}

grpc::Status rmmd_service::ListSessions(grpc::ServerContext* context,
                                        v1::ListSessionsRequest const* request,
                                        v1::ListSessionsResponse* response)
{
  return observed(requests_, rpc_method::list_sessions, [&] {
    return session_call(caller(*context), [&](core::session_id) {
      wire::list_sessions(core_, *request, response);
      return absl::OkStatus();
    });
  });
}

grpc::Status rmmd_service::ListPools(grpc::ServerContext* context,
                                     v1::ListPoolsRequest const*,
                                     v1::ListPoolsResponse* response)
{
  return observed(requests_, rpc_method::list_pools, [&] {
    return session_call(caller(*context), [&](core::session_id) {
      wire::list_pools(core_, response);
      return absl::OkStatus();
    });
  });
}

grpc::Status rmmd_service::Trim(grpc::ServerContext* context,
                                v1::TrimRequest const* request,
                                v1::TrimResponse* response)
{
  return observed(requests_, rpc_method::trim, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::trim(core_, session, *request, response);
    });
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
    response->set_pool_count(static_cast<std::uint32_t>(core_.pools().list().size()));
    response->set_session_count(static_cast<std::uint32_t>(core_.sessions().session_count()));
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
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::create_buffer(core_, session, *request, {}, response);
    });
  });
}

grpc::Status rmmd_service::PublishBuffer(grpc::ServerContext* context,
                                         v1::PublishBufferRequest const* request,
                                         v1::PublishBufferResponse*)
{
  return observed(requests_, rpc_method::publish_buffer, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::publish_buffer(core_, session, *request);
    });
  });
}

grpc::Status rmmd_service::OpenBuffer(grpc::ServerContext* context,
                                      v1::OpenBufferRequest const* request,
                                      v1::BufferGrant* response)
{
  return observed(requests_, rpc_method::open_buffer, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      if (!request->peer().empty()) {
        if (remote_ == nullptr) {
          return absl::NotFoundError(absl::StrFormat(
              "open buffer '%s': no peer '%s' in peering.peers (peering is off on this node)",
              request->name(),
              request->peer()));
        }
        return remote_->open(session, *request, response);
      }
      // Wait no longer than asked, than the caller waits for the answer, or
      // than max_open_wait.
      auto const now = std::chrono::steady_clock::now();
      auto wait      = std::min<std::chrono::steady_clock::duration>(
          std::chrono::milliseconds(request->wait_ms()), max_open_wait);
      auto const left = context->deadline() - std::chrono::system_clock::now();
      if (left < wait) { wait = std::max<std::chrono::steady_clock::duration>(left, {}); }
      return wire::open_buffer(core_, session, *request, {}, response, now + wait);
    });
  });
}

grpc::Status rmmd_service::CloseBuffer(grpc::ServerContext* context,
                                       v1::CloseBufferRequest const* request,
                                       v1::CloseBufferResponse*)
{
  return observed(requests_, rpc_method::close_buffer, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::close_buffer(core_, session, *request);
    });
  });
}

grpc::Status rmmd_service::DeleteBuffer(grpc::ServerContext* context,
                                        v1::DeleteBufferRequest const* request,
                                        v1::DeleteBufferResponse* response)
{
  return observed(requests_, rpc_method::delete_buffer, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::delete_buffer(core_, session, *request, response);
    });
  });
}

grpc::Status rmmd_service::ListBuffers(grpc::ServerContext* context,
                                       v1::ListBuffersRequest const* request,
                                       v1::ListBuffersResponse* response)
{
  return observed(requests_, rpc_method::list_buffers, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      if (!request->peer().empty()) {
        if (remote_ == nullptr) {
          return absl::NotFoundError(absl::StrFormat(
              "list buffers: no peer '%s' in peering.peers (peering is off on this node)",
              request->peer()));
        }
        return remote_->list(*request, response);
      }
      return wire::list_buffers(core_, session, *request, response);
    });
  });
}

grpc::Status rmmd_service::SetBufferManifest(grpc::ServerContext* context,
                                             v1::SetBufferManifestRequest const* request,
                                             v1::SetBufferManifestResponse*)
{
  return observed(requests_, rpc_method::set_buffer_manifest, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::set_buffer_manifest(core_, session, *request);
    });
  });
}

grpc::Status rmmd_service::DescribeBuffer(grpc::ServerContext* context,
                                          v1::DescribeBufferRequest const* request,
                                          v1::DescribeBufferResponse* response)
{
  return observed(requests_, rpc_method::describe_buffer, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::describe_buffer(core_, session, *request, response);
    });
  });
}

grpc::Status rmmd_service::GetBufferManifest(grpc::ServerContext* context,
                                             v1::GetBufferManifestRequest const* request,
                                             v1::BufferManifest* response)
{
  return observed(requests_, rpc_method::get_buffer_manifest, [&] {
    return session_call(caller(*context), [&](core::session_id session) {
      return wire::get_buffer_manifest(core_, session, *request, response);
    });
  });
}

grpc::Status rmmd_service::ListPeers(grpc::ServerContext* context,
                                     v1::ListPeersRequest const*,
                                     v1::ListPeersResponse* response)
{
  return session_call(caller(*context), [&](core::session_id) {
    if (remote_ != nullptr) { remote_->list_peers(response); }
    return absl::OkStatus();
  });
}

}  // namespace rmmd::service
