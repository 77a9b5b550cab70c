#include "daemon/session/session_protocol.hpp"

#include "daemon/wire/core_calls.hpp"
#include "daemon/wire/proto_convert.hpp"
#include "daemon/wire/status_mapping.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <absl/strings/str_format.h>

#include <chrono>
#include <utility>

namespace rmmd::session_socket {
namespace {

using metrics::rpc_method;

/// The calls whose reply carries nothing, which reply_only_on_error may
/// leave unanswered when they succeed.
bool may_go_unanswered(std::optional<rpc_method> method)
{
  return method == rpc_method::free || method == rpc_method::publish_buffer ||
         method == rpc_method::close_buffer || method == rpc_method::blocks_dropped;
}

/// An fd a reply must carry: the buffer's (owned by the backend), as the
/// reply's first fd.
absl::Status buffer_fd(core::daemon_core& core,
                       core::session_id session,
                       v1::BufferFdRequest const& request,
                       std::vector<int>* fds,
                       v1::BufferFdResponse* reply)
{
  auto fd = core.buffers().buffer_fd(session, request.buffer_id());
  if (!fd.ok()) { return fd.status(); }
  if (fds == nullptr) { return absl::FailedPreconditionError("this connection cannot carry fds"); }
  fds->push_back(*fd);
  reply->set_fd_index(0);
  return absl::OkStatus();
}

/// Answers a parsed call into `reply` (its payload, meaningful on success);
/// returns the call's status and sets `method` to the method it counts as
/// (none for Ping and BufferFd). A call held for idle slabs sets `*held`
/// (see wire::transport_rules).
absl::Status dispatch(core::daemon_core& core,
                      core::session_id session,
                      v1::SessionCall const& call,
                      wire::transport_rules rules,
                      std::vector<int>* fds,
                      v1::SessionReply& reply,
                      std::optional<rpc_method>& method,
                      bool* held)
{
  absl::Status status;
  switch (call.call_case()) {
    case v1::SessionCall::kAllocate:
      method = rpc_method::allocate;
      return wire::allocate(core, session, call.allocate(), rules, reply.mutable_allocate(), held);
    case v1::SessionCall::kFree:
      method = rpc_method::free;
      status = wire::free(core, session, call.free());
      if (status.ok()) { reply.mutable_free(); }
      return status;
    case v1::SessionCall::kPing:
      reply.mutable_ping();
      return status;
    case v1::SessionCall::kBlocksDropped:
      method = rpc_method::blocks_dropped;
      status = wire::drop_blocks(core, session, call.blocks_dropped());
      if (status.ok()) { reply.mutable_blocks_dropped(); }
      return status;
    case v1::SessionCall::kCreateBuffer:
      method = rpc_method::create_buffer;
      return wire::create_buffer(
          core, session, call.create_buffer(), rules, reply.mutable_create_buffer(), held);
    case v1::SessionCall::kPublishBuffer:
      method = rpc_method::publish_buffer;
      status = wire::publish_buffer(core, session, call.publish_buffer());
      if (status.ok()) { reply.mutable_publish_buffer(); }
      return status;
    case v1::SessionCall::kOpenBuffer:
      // Never waits here: the call threads serve every session.
      method = rpc_method::open_buffer;
      return wire::open_buffer(
          core, session, call.open_buffer(), rules, reply.mutable_open_buffer());
    case v1::SessionCall::kCloseBuffer:
      method = rpc_method::close_buffer;
      status = wire::close_buffer(core, session, call.close_buffer());
      if (status.ok()) { reply.mutable_close_buffer(); }
      return status;
    case v1::SessionCall::kBufferFd:
      return buffer_fd(core, session, call.buffer_fd(), fds, reply.mutable_buffer_fd());
    default:
      return absl::UnimplementedError(
          "session call names no call this daemon knows (allocate, free, ping, create_buffer, "
          "publish_buffer, open_buffer, close_buffer, buffer_fd, blocks_dropped): the client is "
          "newer than the daemon");
  }
}

}  // namespace

std::string refusal_welcome(absl::Status const& status)
{
  v1::SessionWelcome welcome;
  welcome.set_protocol_version(1);
  wire::to_error_info(status, welcome.mutable_error());
  return welcome.SerializeAsString();
}

hello_answer handle_hello(core::daemon_core& core,
                          datagram_view hello_bytes,
                          core::peer_credentials const& peer,
                          std::string command,
                          hello_limits const& limits)
{
  hello_answer answer;
  if (hello_bytes.truncated) {
    answer.message = refusal_welcome(absl::InvalidArgumentError(
        absl::StrFormat("session hello larger than %d bytes; send one SessionHello message",
                        limits.max_hello_bytes)));
    return answer;
  }
  v1::SessionHello hello;
  if (!hello.ParseFromArray(hello_bytes.bytes.data(), static_cast<int>(hello_bytes.bytes.size()))) {
    answer.message = refusal_welcome(absl::InvalidArgumentError(
        "session hello is not a valid rmmd.v1.SessionHello message (bytes that do not parse, "
        "or a client_name that is not UTF-8); send one SessionHello as protobuf serialises "
        "it, with a UTF-8 client_name"));
    return answer;
  }
  if (hello.protocol_version() != 1) {
    answer.message = refusal_welcome(absl::FailedPreconditionError(
        absl::StrFormat("session hello asks for protocol version %d; this daemon speaks version 1",
                        hello.protocol_version())));
    return answer;
  }
  answer.client_name         = hello.client_name();
  answer.previous_session_id = hello.previous_session_id();
  answer.reconnects          = hello.reconnects();
  auto grant                 = core.sessions().open_session(
      peer,
      std::move(command),
      core::session_origin{.client_name      = hello.client_name(),
                                           .reconnects       = hello.reconnects(),
                                           .previous_session = hello.previous_session_id()});
  if (!grant.ok()) {
    answer.refusal = grant.status();
    answer.message = refusal_welcome(grant.status());
    return answer;
  }
  v1::SessionWelcome w;
  w.set_protocol_version(1);
  w.set_token(std::string(reinterpret_cast<char const*>(grant->token.data()), grant->token.size()));
  w.set_session_id(grant->id);
  w.set_max_message_bytes(limits.max_message_bytes);
  // The session's own tenant's pools: their fds, and nobody else's.
  auto pools = core.pools().pools_for(grant->id);
  if (!pools.ok()) {
    answer.refusal = pools.status();
    answer.message = refusal_welcome(pools.status());
    return answer;
  }
  for (auto const& pool : *pools) {
    int index = -1;
    if (pool.shareable_fd >= 0) {
      index = static_cast<int>(answer.fds.size());
      answer.fds.push_back(pool.shareable_fd);
    }
    wire::to_proto(pool, index, w.add_pools());
  }
  w.set_session_calls(true);
  answer.message = w.SerializeAsString();
  answer.grant   = *grant;
  return answer;
}

std::optional<std::string> handle_call(core::daemon_core& core,
                                       core::session_id session,
                                       datagram_view call_bytes,
                                       std::size_t max_call_bytes,
                                       metrics::request_metrics* call_metrics,
                                       std::vector<int>* fds,
                                       bool* held)
{
  auto const start = std::chrono::steady_clock::now();
  wire::transport_rules const rules{
      .may_hold = held != nullptr, .packing = true, .manifest_inline = false};
  if (held != nullptr) { *held = false; }
  v1::SessionReply reply;
  std::optional<rpc_method> method;
  absl::Status status;
  v1::SessionCall call;
  if (call_bytes.truncated) {
    status = absl::InvalidArgumentError(absl::StrFormat(
        "session call larger than %d bytes; send one SessionCall message per datagram",
        max_call_bytes));
  } else if (!call.ParseFromArray(call_bytes.bytes.data(),
                                  static_cast<int>(call_bytes.bytes.size()))) {
    status = absl::InvalidArgumentError("session call is not a valid rmmd.v1.SessionCall message");
  } else {
    reply.set_tag(call.tag());
    status = dispatch(core, session, call, rules, fds, reply, method, held);
  }
  if (held != nullptr && *held) {
    return std::nullopt;  // counted when it is made, by the thread that may wait
  }
  if (!status.ok()) {
    reply.clear_reply();  // an error answers with the error alone
    wire::to_error_info(status, reply.mutable_error());
  }
  if (method && call_metrics != nullptr) {
    call_metrics->record(*method,
                         static_cast<int>(wire::wire_code(status.code())),
                         std::chrono::steady_clock::now() - start);
  }
  if (status.ok() && may_go_unanswered(method) && call.reply_only_on_error()) {
    return std::nullopt;
  }
  return reply.SerializeAsString();
}

}  // namespace rmmd::session_socket
