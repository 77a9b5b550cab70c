#include "daemon/session/session_protocol.hpp"

#include "daemon/wire/calls.hpp"
#include "daemon/wire/proto_convert.hpp"
#include "daemon/wire/status_mapping.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::session_socket {
namespace {

/// The call table's entries that the session socket carries, by their
/// SessionCall field's number (the oneof's case); null where none.
std::vector<wire::call const*> const& session_calls()
{
  static std::vector<wire::call const*> const by_field = [] {
    std::vector<wire::call const*> out;
    for (auto const& c : wire::calls()) {
      if (!wire::carries(c, wire::transport::session_socket)) { continue; }
      auto const number = static_cast<std::size_t>(c.session_call_field->number());
      if (out.size() <= number) { out.resize(number + 1); }
      out[number] = &c;
    }
    return out;
  }();
  return by_field;
}

wire::call const* session_call_of(v1::SessionCall const& call)
{
  auto const number    = static_cast<std::size_t>(call.call_case());
  auto const& by_field = session_calls();
  return number < by_field.size() ? by_field[number] : nullptr;
}

/// The refusal of a call that names none the daemon knows, naming those it
/// does (SessionCall's fields, in their order).
absl::Status unknown_call()
{
  static std::string const message = [] {
    std::vector<std::string> known;
    auto const* oneof = v1::SessionCall::descriptor()->FindOneofByName("call");
    for (int i = 0; i < oneof->field_count(); ++i) {
      auto const number = static_cast<std::size_t>(oneof->field(i)->number());
      if (number < session_calls().size() && session_calls()[number] != nullptr) {
        known.push_back(oneof->field(i)->name());
      }
    }
    return absl::StrFormat(
        "session call names no call this daemon knows (%s): the client is newer than the "
        "daemon",
        absl::StrJoin(known, ", "));
  }();
  return absl::UnimplementedError(message);
}

/// Answers a parsed call into `reply` (its payload, meaningful on success);
/// returns the call's status and sets `method` to the call it is. A call held
/// for idle slabs sets `*held` (see wire::transport_rules).
absl::Status dispatch(core::daemon_core& core,
                      core::session_id session,
                      v1::SessionCall const& call,
                      wire::transport_rules rules,
                      std::vector<int>* fds,
                      v1::SessionReply& reply,
                      wire::call const*& method,
                      bool* held)
{
  method = session_call_of(call);
  if (method == nullptr) { return unknown_call(); }
  auto const& request = method->routes.session.request(call);
  auto* answer        = method->routes.session.reply(reply);
  wire::call_context const context{
      .core = core, .session = session, .rules = rules, .fds = fds, .held = held};
  return method->handle(context, request, answer);
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
  wire::call const* method = nullptr;
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
  if (method != nullptr && call_metrics != nullptr) {
    call_metrics->record(method->name,
                         static_cast<int>(wire::wire_code(status.code())),
                         std::chrono::steady_clock::now() - start);
  }
  if (status.ok() && method != nullptr && method->routes.reply_only_on_error &&
      call.reply_only_on_error()) {
    return std::nullopt;
  }
  return reply.SerializeAsString();
}

}  // namespace rmmd::session_socket
