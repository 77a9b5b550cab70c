#include "daemon/service/rmmd_service.hpp"

#include "daemon/wire/status_mapping.hpp"
#include "rmmd/v1/rmmd.grpc.pb.h"

#include <absl/strings/str_format.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <chrono>
#include <memory>

namespace rmmd::service {
namespace {

/// gRPC's own parsing and serialising of a message, as a generated method's
/// handler does them (same codes and messages on failure).
using message_traits = grpc::SerializationTraits<wire::Message>;

}  // namespace

rmmd_service::rmmd_service(core::daemon_core& core, metrics::request_metrics& requests)
    : core_(core), requests_(requests)
{
  using bytes_handler =
      grpc::internal::RpcMethodHandler<rmmd_service, grpc::ByteBuffer, grpc::ByteBuffer>;
  for (auto const& method : wire::calls()) {
    if (!wire::carries(method, wire::transport::grpc)) { continue; }
    paths_.push_back("/" + std::string(v1::Rmmd::service_full_name()) + "/" +
                     std::string(method.name));
    AddMethod(new grpc::internal::RpcServiceMethod(paths_.back().c_str(),
                                                   grpc::internal::RpcMethod::NORMAL_RPC,
                                                   new bytes_handler(
                                                       [&method](rmmd_service* self,
                                                                 grpc::ServerContext* context,
                                                                 grpc::ByteBuffer const* request,
                                                                 grpc::ByteBuffer* reply) {
                                                         return self->serve_bytes(
                                                             method, *context, *request, reply);
                                                       },
                                                       this)));
  }
}

absl::StatusOr<core::session_id> rmmd_service::caller(grpc::ServerContext const& context) const
{
  auto const& md = context.client_metadata();
  auto it        = md.find(grpc::string_ref(token_metadata_key.data(), token_metadata_key.size()));
  if (it == md.end()) { return core_.sessions().authenticate({}); }
  return core_.sessions().authenticate(std::string_view(it->second.data(), it->second.size()));
}

grpc::Status rmmd_service::serve(wire::call const& method,
                                 grpc::ServerContext& context,
                                 wire::Message const& request,
                                 wire::Message* reply)
{
  auto const start = std::chrono::steady_clock::now();
  wire::call_context call{.core     = core_,
                          .rules    = {},
                          .deadline = context.deadline(),
                          .remote   = remote_,
                          .facts    = &facts_};
  absl::Status status;
  if (method.routes.needs_session) {
    auto session = caller(context);
    if (session.ok()) { call.session = *session; }
    status = session.status();
  }
  if (status.ok()) { status = method.handle(call, request, reply); }
  auto const answer = wire::to_grpc_status(status);
  requests_.record(
      method.name, static_cast<int>(answer.error_code()), std::chrono::steady_clock::now() - start);
  return answer;
}

grpc::Status rmmd_service::serve_bytes(wire::call const& method,
                                       grpc::ServerContext& context,
                                       grpc::ByteBuffer const& request_bytes,
                                       grpc::ByteBuffer* reply_bytes)
{
  // A request over its method's cap, or one that does not parse, is
  // answered as gRPC answers one over its own cap or unparsable, before the
  // method runs (and before parsing, for the first): not counted.
  auto const cap = method.routes.large_request ? large_request_bytes_ : small_request_bytes_;
  if (request_bytes.Length() > cap) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrFormat("%s: a request of %d bytes is larger than the %d bytes this method "
                            "accepts (the daemon's max_message_bytes; SetBufferManifest takes "
                            "up to %d)",
                            method.name,
                            request_bytes.Length(),
                            cap,
                            large_request_bytes_)};
  }
  std::unique_ptr<wire::Message> request(method.request->New());
  grpc::ByteBuffer bytes(request_bytes);
  if (auto parsed = message_traits::Deserialize(&bytes, request.get()); !parsed.ok()) {
    return parsed;
  }
  std::unique_ptr<wire::Message> reply(method.reply->New());
  auto status = serve(method, context, *request, reply.get());
  if (!status.ok()) { return status; }
  bool own_buffer = false;
  return message_traits::Serialize(*reply, reply_bytes, &own_buffer);
}

}  // namespace rmmd::service
