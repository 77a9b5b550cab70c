#include "daemon/service/rmmd_service.hpp"

#include "daemon/service/proto_convert.hpp"
#include "daemon/service/status_mapping.hpp"

namespace rmmd::service {

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
  auto session = caller(*context);
  if (!session.ok()) { return to_grpc_status(session.status()); }
  auto grant = core_.allocate(*session, request->pool_id(), request->size(), request->alignment());
  if (!grant.ok()) { return to_grpc_status(grant.status()); }
  response->set_allocation_id(grant->id);
  response->set_size(grant->block.bytes);
  if (grant->block.export_data.empty()) {
    response->mutable_host()->set_offset(grant->block.offset);
  } else {
    response->mutable_cuda()->set_export_data(grant->block.export_data.data(),
                                              grant->block.export_data.size());
  }
  return grpc::Status::OK;
}

grpc::Status rmmd_service::Free(grpc::ServerContext* context,
                                v1::FreeRequest const* request,
                                v1::FreeResponse*)
{
  auto session = caller(*context);
  if (!session.ok()) { return to_grpc_status(session.status()); }
  auto const& event = request->release_event();
  return to_grpc_status(
      core_.free(*session,
                 request->allocation_id(),
                 std::span(reinterpret_cast<std::byte const*>(event.data()), event.size())));
}

grpc::Status rmmd_service::ReportUsage(grpc::ServerContext* context,
                                       v1::UsageReport const* request,
                                       v1::UsageReply* response)
{
  auto session = caller(*context);
  if (!session.ok()) { return to_grpc_status(session.status()); }
  std::vector<core::carved_usage> usage;
  usage.reserve(static_cast<std::size_t>(request->pools_size()));
  for (auto const& p : request->pools()) {
    usage.push_back(core::carved_usage{
        .pool = p.pool_id(), .bytes = p.bytes(), .allocation_count = p.allocation_count()});
  }
  auto trim = core_.report_usage(*session, usage);
  if (!trim.ok()) { return to_grpc_status(trim.status()); }
  for (auto id : *trim) { response->add_trim_pool_ids(id); }
  return grpc::Status::OK;
}

grpc::Status rmmd_service::GetStats(grpc::ServerContext* context,
                                    v1::GetStatsRequest const*,
                                    v1::Stats* response)
{
  auto session = caller(*context);
  if (!session.ok()) { return to_grpc_status(session.status()); }
  to_proto(core_.stats(), response);
  return grpc::Status::OK;
}

grpc::Status rmmd_service::ListSessions(grpc::ServerContext* context,
                                        v1::ListSessionsRequest const*,
                                        v1::ListSessionsResponse* response)
{
  auto session = caller(*context);
  if (!session.ok()) { return to_grpc_status(session.status()); }
  for (auto const& s : core_.sessions()) { to_proto(s, response->add_sessions()); }
  return grpc::Status::OK;
}

}  // namespace rmmd::service
