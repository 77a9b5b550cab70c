#include "daemon/session/session_protocol.hpp"

#include "daemon/service/proto_convert.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <absl/strings/str_format.h>

#include <chrono>
#include <utility>
#include <variant>

namespace rmmd::session {
namespace {

void set_error(absl::Status const& status, v1::ErrorInfo* out)
{
  out->set_code(static_cast<int>(status.code()));
  out->set_message(std::string(status.message()));
}

}  // namespace

std::string refusal_welcome(absl::Status const& status)
{
  v1::SessionWelcome welcome;
  welcome.set_protocol_version(1);
  set_error(status, welcome.mutable_error());
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
  answer.client_name = hello.client_name();
  auto grant         = core.open_session(peer, std::move(command), hello.client_name());
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
  for (auto const& pool : core.pools()) {
    int index = -1;
    if (pool.shareable_fd >= 0) {
      index = static_cast<int>(answer.fds.size());
      answer.fds.push_back(pool.shareable_fd);
    }
    service::to_proto(pool, index, w.add_pools());
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
  using metrics::rpc_method;
  auto const start = std::chrono::steady_clock::now();
  v1::SessionReply reply;
  std::optional<rpc_method> method;
  absl::Status status;
  bool on_hold = false;  // a request that would wait, handed to a thread that may
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
    switch (call.call_case()) {
      case v1::SessionCall::kAllocate: {
        method        = rpc_method::allocate;
        auto const& r = call.allocate();
        // A call thread that must not block (`held`) gets a hold instead of a wait.
        auto answer =
            held == nullptr
                ? core::answer_or_hold<core::lease_grant>(core.allocate(session,
                                                                        r.pool_id(),
                                                                        r.size(),
                                                                        r.alignment(),
                                                                        core::reclaim_policy::wait,
                                                                        r.may_pack()))
                : core.allocate_or_hold(
                      session, r.pool_id(), r.size(), r.alignment(), r.may_pack());
        if (std::holds_alternative<core::reclaim_hold>(answer)) {
          on_hold = true;
          break;
        }
        auto& grant = std::get<absl::StatusOr<core::lease_grant>>(answer);
        status      = grant.status();
        if (grant.ok()) { service::to_proto(*grant, reply.mutable_allocate()); }
        break;
      }
      case v1::SessionCall::kFree: {
        method = rpc_method::free;
        status = core.free(session, call.free().allocation_id());
        if (status.ok()) { reply.mutable_free(); }
        break;
      }
      case v1::SessionCall::kPing:
        reply.mutable_ping();
        break;
      case v1::SessionCall::kBlocksDropped: {
        method          = rpc_method::blocks_dropped;
        auto const& ids = call.blocks_dropped().block_ids();
        status          = core.drop_blocks(session, std::span(ids.data(), ids.size()));
        if (status.ok()) { reply.mutable_blocks_dropped(); }
        break;
      }
      case v1::SessionCall::kCreateBuffer: {
        method        = rpc_method::create_buffer;
        auto const& r = call.create_buffer();
        auto answer   = held == nullptr
                            ? core::answer_or_hold<core::buffer_grant>(core.create_buffer(
                                session, r.name(), r.pool_id(), r.size(), service::from_proto(r)))
                            : core.create_buffer_or_hold(
                                session, r.name(), r.pool_id(), r.size(), service::from_proto(r));
        if (std::holds_alternative<core::reclaim_hold>(answer)) {
          on_hold = true;
          break;
        }
        auto& grant = std::get<absl::StatusOr<core::buffer_grant>>(answer);
        status      = grant.status();
        if (grant.ok()) { service::to_proto(*grant, reply.mutable_create_buffer()); }
        break;
      }
      case v1::SessionCall::kPublishBuffer:
        method = rpc_method::publish_buffer;
        status = core.publish_buffer(session, call.publish_buffer().buffer_id());
        if (status.ok()) { reply.mutable_publish_buffer(); }
        break;
      case v1::SessionCall::kOpenBuffer: {
        // Never waits here: the call threads serve every session.
        method     = rpc_method::open_buffer;
        auto grant = core.open_buffer(session, call.open_buffer().name());
        status     = grant.status();
        if (grant.ok()) { service::to_proto(*grant, reply.mutable_open_buffer()); }
        break;
      }
      case v1::SessionCall::kCloseBuffer:
        method = rpc_method::close_buffer;
        status = core.close_buffer(session, call.close_buffer().buffer_id());
        if (status.ok()) { reply.mutable_close_buffer(); }
        break;
      case v1::SessionCall::kBufferFd: {
        auto fd = core.buffer_fd(session, call.buffer_fd().buffer_id());
        status  = fd.status();
        if (fd.ok() && fds == nullptr) {
          status = absl::FailedPreconditionError("this connection cannot carry fds");
        } else if (fd.ok()) {
          fds->push_back(*fd);
          reply.mutable_buffer_fd()->set_fd_index(0);
        }
        break;
      }
      default:
        status = absl::UnimplementedError(
            "session call names no call this daemon knows (allocate, free, ping, create_buffer, "
            "publish_buffer, open_buffer, close_buffer, buffer_fd, blocks_dropped): the client is "
            "newer than the daemon");
    }
  }
  if (on_hold) {
    *held = true;  // counted when it is made, by the thread that may wait
    return std::nullopt;
  }
  if (!status.ok()) { set_error(status, reply.mutable_error()); }
  if (method && call_metrics != nullptr) {
    call_metrics->record(
        *method, static_cast<int>(status.code()), std::chrono::steady_clock::now() - start);
  }
  // Only calls whose reply carries nothing may go unanswered.
  bool const silent_ok = method == rpc_method::free || method == rpc_method::publish_buffer ||
                         method == rpc_method::close_buffer || method == rpc_method::blocks_dropped;
  if (status.ok() && silent_ok && call.reply_only_on_error()) { return std::nullopt; }
  return reply.SerializeAsString();
}

}  // namespace rmmd::session
