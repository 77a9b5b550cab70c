#include "daemon/peering/peer_service.hpp"

#include "daemon/log.hpp"
#include "daemon/version.hpp"
#include "daemon/wire/proto_convert.hpp"
#include "daemon/wire/status_mapping.hpp"

#include <absl/strings/str_format.h>

namespace rmmd::peering {
namespace {

/// Holds in one request: more is not a daemon's renewal but a flood.
constexpr int max_ids_per_call = 1 << 20;

grpc::Status too_many(char const* what, int n)
{
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrFormat("%s: %d hold ids in one call; at most %d", what, n, max_ids_per_call));
}

}  // namespace

std::string caller_identity(grpc::ServerContext const& context)
{
  auto auth = context.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) { return {}; }
  auto values = auth->FindPropertyValues("x509_subject");
  if (values.empty()) { return {}; }
  return std::string(values.front().data(), values.front().size());
}

void to_proto(fabric_probe const& in, v1::FabricProbe* out)
{
  out->set_fabric_handle(in.fabric_handle.data(), in.fabric_handle.size());
  out->set_bytes(in.bytes);
  out->set_pattern(in.pattern);
  out->set_gpu_uuid(in.gpu_uuid);
  out->set_problem(in.problem);
}

fabric_probe from_proto(v1::FabricProbe const& in)
{
  auto const* p = reinterpret_cast<std::byte const*>(in.fabric_handle().data());
  return fabric_probe{.fabric_handle = std::vector<std::byte>(p, p + in.fabric_handle().size()),
                      .bytes         = in.bytes(),
                      .pattern       = in.pattern(),
                      .gpu_uuid      = in.gpu_uuid(),
                      .problem       = in.problem()};
}

peer_service::peer_service(std::string node_name,
                           std::uint64_t incarnation,
                           probe_exchange const& probes,
                           remote_hold_ledger& ledger,
                           std::vector<config::peer_grant_settings> grants,
                           std::vector<config::peer_node_settings> const& peers)
    : node_name_(std::move(node_name)),
      incarnation_(incarnation),
      probes_(probes),
      ledger_(ledger),
      grants_(std::make_shared<std::vector<config::peer_grant_settings> const>(std::move(grants)))
{
  for (auto const& p : peers) {
    if (!p.identity.empty()) { peer_identities_.push_back(p.identity); }
  }
}

void peer_service::set_grants(std::vector<config::peer_grant_settings> grants)
{
  auto next = std::make_shared<std::vector<config::peer_grant_settings> const>(std::move(grants));
  std::lock_guard lock(grants_mutex_);
  grants_ = std::move(next);
}

std::shared_ptr<std::vector<config::peer_grant_settings> const> peer_service::grants() const
{
  std::lock_guard lock(grants_mutex_);
  return grants_;
}

grpc::Status peer_service::Hello(grpc::ServerContext* context,
                                 v1::PeerHello const* request,
                                 v1::PeerWelcome* response)
{
  auto const identity = caller_identity(*context);
  if (auto s = check_hello(*grants(), peer_identities_, identity); !s.ok()) {
    log::warn("peering: refused a Hello from %s (node '%s'): %s",
              context->peer(),
              request->node_name(),
              s.message());
    return wire::to_grpc_status(s);
  }
  if (request->incarnation() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "hello: incarnation 0; a daemon sends a random nonzero one");
  }
  auto theirs = from_proto(request->probe());
  probe_verdict verdict;
  if (theirs.fabric_handle.empty()) {
    verdict = {
        .ok      = false,
        .problem = "it exports no probe: " +
                   (theirs.problem.empty() ? std::string("(no reason given)") : theirs.problem)};
  } else {
    verdict = probes_.import(theirs);
  }
  ledger_.hello(identity,
                request->node_name(),
                context->peer(),
                request->incarnation(),
                verdict.ok,
                verdict.problem);
  log::info("peer '%s' (node '%s' at %s) said hello; its probe: %s",
            identity.empty() ? std::string("(plaintext)") : identity,
            request->node_name(),
            context->peer(),
            verdict.ok ? std::string("imported and read back") : verdict.problem);
  response->set_node_name(node_name_);
  response->set_incarnation(incarnation_);
  to_proto(probes_.ours, response->mutable_probe());
  response->mutable_your_probe()->set_ok(verdict.ok);
  response->mutable_your_probe()->set_problem(verdict.problem);
  response->set_version(std::string(daemon_version()));
  response->set_hold_lease_ms(static_cast<std::uint32_t>(ledger_.lease().count()));
  return grpc::Status::OK;
}

grpc::Status peer_service::OpenRemoteBuffer(grpc::ServerContext* context,
                                            v1::RemoteOpenRequest const* request,
                                            v1::RemoteGrant* response)
{
  auto const identity = caller_identity(*context);
  auto checked        = check_remote_open(*grants(), identity, *request);
  if (!checked.ok()) { return wire::to_grpc_status(checked.status()); }
  auto grant = ledger_.open(identity,
                            request->incarnation(),
                            *checked,
                            remote_holder{.session = request->holder_session_id(),
                                          .uid     = request->holder_uid(),
                                          .pid     = request->holder_pid()});
  if (!grant.ok()) { return wire::to_grpc_status(grant.status()); }
  auto const& g = grant->grant;
  response->set_hold_id(grant->hold);
  response->set_size(g.size);
  response->set_allocation_bytes(g.block.block.bytes);
  response->set_fabric_handle(g.block.fabric_handle.data(), g.block.fabric_handle.size());
  response->set_access(g.access == core::buffer_access::read_write ? v1::BUFFER_ACCESS_READ_WRITE
                                                                   : v1::BUFFER_ACCESS_READ);
  if (g.manifest && !g.manifest->empty()) {
    wire::to_proto(*g.manifest, response->mutable_manifest());
  }
  response->set_gpu_uuid(grant->gpu_uuid);
  response->set_hold_lease_ms(static_cast<std::uint32_t>(ledger_.lease().count()));
  if (auto const* anchor = probes_.anchor_of(grant->gpu_uuid)) {
    auto* a = response->mutable_anchor();
    a->set_gpu_uuid(anchor->gpu_uuid);
    a->set_allocation_bytes(anchor->bytes);
    a->set_fabric_handle(anchor->fabric_handle.data(), anchor->fabric_handle.size());
  }
  return grpc::Status::OK;
}

grpc::Status peer_service::RenewHolds(grpc::ServerContext* context,
                                      v1::RenewHoldsRequest const* request,
                                      v1::RenewHoldsResponse* response)
{
  if (request->hold_ids_size() > max_ids_per_call) {
    return too_many("renew holds", request->hold_ids_size());
  }
  std::vector<std::uint64_t> ids(request->hold_ids().begin(), request->hold_ids().end());
  if (request->has_your_probe()) {
    ledger_.their_verdict(caller_identity(*context),
                          request->incarnation(),
                          request->your_probe().ok(),
                          request->your_probe().problem());
  }
  auto unknown = ledger_.renew(caller_identity(*context), request->incarnation(), ids);
  if (!unknown.ok()) { return wire::to_grpc_status(unknown.status()); }
  for (auto id : *unknown) { response->add_unknown_hold_ids(id); }
  return grpc::Status::OK;
}

grpc::Status peer_service::CloseHolds(grpc::ServerContext* context,
                                      v1::CloseHoldsRequest const* request,
                                      v1::CloseHoldsResponse*)
{
  if (request->hold_ids_size() > max_ids_per_call) {
    return too_many("close holds", request->hold_ids_size());
  }
  std::vector<std::uint64_t> ids(request->hold_ids().begin(), request->hold_ids().end());
  return wire::to_grpc_status(
      ledger_.close(caller_identity(*context), request->incarnation(), ids));
}

grpc::Status peer_service::ListRemoteBuffers(grpc::ServerContext* context,
                                             v1::ListRemoteBuffersRequest const* request,
                                             v1::ListRemoteBuffersResponse* response)
{
  auto const identity = caller_identity(*context);
  auto checked        = check_remote_list(*grants(), identity, *request);
  if (!checked.ok()) { return wire::to_grpc_status(checked.status()); }
  auto buffers = ledger_.list(identity, request->incarnation(), *checked);
  if (!buffers.ok()) { return wire::to_grpc_status(buffers.status()); }
  std::size_t bytes = 0;
  for (auto const& b : *buffers) {
    v1::RemoteBufferEntry entry;
    entry.set_name(b.name);
    entry.set_size(b.size);
    wire::to_proto(b.labels, entry.mutable_labels());
    entry.set_allow_writers(b.allow_writers);
    entry.set_holders(static_cast<std::uint32_t>(b.holders));
    entry.set_persistent(b.persistent);
    entry.set_created_unix_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(b.created.time_since_epoch())
            .count());
    entry.set_tensor_count(static_cast<std::uint32_t>(b.tensor_count));
    bytes += entry.ByteSizeLong();
    if (response->buffers_size() == max_buffers_per_list || bytes > max_list_bytes) {
      response->set_truncated(true);
      break;
    }
    *response->add_buffers() = std::move(entry);
  }
  return grpc::Status::OK;
}

}  // namespace rmmd::peering
