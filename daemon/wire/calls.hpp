#pragma once

// The daemon's calls, each declared once: its name (the gRPC method's and the
// metrics' label), its request and reply messages, which transports carry it
// (a method of the Rmmd gRPC service; a field of the SessionCall and
// SessionReply oneofs on the session socket) and its handler, request -> core
// -> reply. The gRPC service registers its methods from this table, the
// session socket dispatches its datagrams by it, the request metrics count
// the names it gives, and the service fuzzer drives every gRPC entry.
//
// The entries live with their handlers, one file per domain:
// lease_calls.cpp, buffer_calls.cpp, stable_calls.cpp, daemon_calls.cpp. A new call is its
// messages and rpc (or SessionCall/SessionReply fields) in rmmd.proto, its
// core method, and one make_call() entry in its domain's file.
//
// Handlers check what the core cannot (fields of the wire alone), call the
// core, and on success fill the reply; on failure they return the core's
// status (wire::status_mapping makes it a wire code) and write nothing into
// the reply. Who the caller is (`session`) is the transport's to establish.
//
// Thread safety: calls() is built and checked once, on its first use (from
// any thread), and immutable after; handlers are as thread-safe as the core.

#include "daemon/core/daemon_core.hpp"
#include "daemon/wire/remote_buffers.hpp"

#include <absl/status/status.h>
#include <google/protobuf/message.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::v1 {
class SessionCall;
class SessionReply;
}  // namespace rmmd::v1

namespace rmmd::wire {

/// What the transport that carries a call lets it do.
struct transport_rules {
  /// An Allocate or CreateBuffer that finds its pool short waits for other
  /// sessions' idle slabs, up to the core's reclaim_timeout, unless this is
  /// set: then such a call is not made (it changes nothing, and says so
  /// through `held`), for the transport to make again from a thread that may
  /// wait.
  bool may_hold{false};
  /// Whether AllocateRequest.may_pack is honoured: a packed lease needs the
  /// RetireBlocks/BlocksDropped exchange of the session socket.
  bool packing{false};
  /// Whether a buffer grant carries the buffer's manifest; otherwise it says
  /// `manifest_follows` and GetBufferManifest brings it (the session socket:
  /// one datagram is too small for a large table).
  bool manifest_inline{true};
};

/// What Health reports beside the core: the gRPC service's start and the
/// metrics endpoint's address.
struct daemon_facts {
  std::chrono::steady_clock::time_point started{std::chrono::steady_clock::now()};
  std::chrono::system_clock::time_point started_wall{std::chrono::system_clock::now()};
  std::string metrics_address;
};

/// What a handler gets besides its request: the core, the caller and what
/// its transport allows.
struct call_context {
  core::daemon_core& core;
  /// The caller's session; 0 for a call that needs none (call::needs_session).
  core::session_id session{};
  transport_rules rules{};
  /// When the caller stops waiting for the answer (gRPC's deadline);
  /// nullopt: the transport lets no call wait (the session socket's call
  /// threads serve every session), so an OpenBuffer answers at once.
  std::optional<std::chrono::system_clock::time_point> deadline{};
  /// Peering's answer for other nodes' buffers; null where peering is off.
  remote_buffers* remote{nullptr};
  /// What Health reports; null where the transport has none.
  daemon_facts const* facts{nullptr};
  /// Where a reply's fds go (the session socket); null where none can travel.
  std::vector<int>* fds{nullptr};
  /// With rules.may_hold: set when the call was held for idle slabs (see
  /// transport_rules). REQUIRES: not null when rules.may_hold.
  bool* held{nullptr};
};

using google::protobuf::Message;

/// A call's fields in the SessionCall oneof `call` and the SessionReply oneof
/// `reply`: their name, and their generated accessors, through which the
/// session socket reaches the messages of every call (reflection would cost
/// about 900 instructions a call). Made by on_session(); calls() checks that
/// the accessors reach the fields of that name.
struct session_route {
  /// The fields' name; empty: not carried on the session socket.
  std::string_view field{};
  Message const& (*request)(v1::SessionCall const& call){nullptr};
  Message* (*reply)(v1::SessionReply& reply){nullptr};
};

/// The session route of the fields `field`, read by `Get` (SessionCall's
/// accessor) and written by `Mutable` (SessionReply's mutable_ accessor):
/// on_session<&v1::SessionCall::free, &v1::SessionReply::mutable_free>("free").
template <auto Get, auto Mutable>
session_route on_session(std::string_view field)
{
  return {.field   = field,
          .request = [](v1::SessionCall const& call) -> Message const& { return (call.*Get)(); },
          .reply   = [](v1::SessionReply& reply) -> Message* { return (reply.*Mutable)(); }};
}

/// Which transports carry a call, and how.
struct call_routes {
  /// A method of the gRPC service rmmd.v1.Rmmd, of the same name.
  bool grpc{true};
  /// Its fields on the session socket; none: not carried there.
  session_route session{};
  /// Session socket: the call may ask for a reply only on error
  /// (SessionCall.reply_only_on_error).
  bool reply_only_on_error{false};
  /// Whether the caller must be a session (gRPC: its token); Health needs none.
  bool needs_session{true};
  /// gRPC: its request may be as large as a manifest (core::max_manifest_bytes
  /// and room for the rest); every other call's request is capped at the
  /// daemon's max_message_bytes (64 KiB by default).
  bool large_request{false};
};

/// One call of the table. Made by make_call(); its descriptors are filled in
/// and checked against rmmd.proto by calls().
class call {
 public:
  /// The gRPC method's name ("Allocate"), also the metrics' `method` label.
  std::string_view name;
  /// Default instances of the request and reply messages (New() makes more).
  Message const* request{nullptr};
  Message const* reply{nullptr};
  call_routes routes;
  /// Set by calls(): the SessionCall and SessionReply fields, when
  /// routes.session names them.
  google::protobuf::FieldDescriptor const* session_call_field{nullptr};
  google::protobuf::FieldDescriptor const* session_reply_field{nullptr};

  /// Runs the handler. REQUIRES: `request` and `*reply` are of this call's
  /// message types.
  absl::Status handle(call_context const& context, Message const& request, Message* reply) const
  {
    return invoke_(handler_, context, request, reply);
  }

  template <typename Request, typename Reply>
  friend call make_call(std::string_view name,
                        call_routes routes,
                        absl::Status (*handler)(call_context const&, Request const&, Reply*));

 private:
  using erased_handler = void (*)();
  using invoker = absl::Status (*)(erased_handler, call_context const&, Message const&, Message*);

  erased_handler handler_{nullptr};
  invoker invoke_{nullptr};
};

/// An entry of the table: `handler` (a function, or a lambda without
/// captures) answers `name`'s Request with its Reply.
template <typename Request, typename Reply>
call make_call(std::string_view name,
               call_routes routes,
               absl::Status (*handler)(call_context const&, Request const&, Reply*))
{
  using typed = absl::Status (*)(call_context const&, Request const&, Reply*);
  call c;
  c.name     = name;
  c.request  = &Request::default_instance();
  c.reply    = &Reply::default_instance();
  c.routes   = routes;
  c.handler_ = reinterpret_cast<call::erased_handler>(handler);
  c.invoke_  = [](call::erased_handler h,
                 call_context const& context,
                 Message const& request,
                 Message* reply) {
    return reinterpret_cast<typed>(h)(
        context, static_cast<Request const&>(request), static_cast<Reply*>(reply));
  };
  return c;
}

/// Every call, each once. The first use checks the table against rmmd.proto
/// (every gRPC entry is a method of rmmd.v1.Rmmd with its messages, and every
/// method has an entry; every session field exists in both oneofs with the
/// entry's messages; names are unique) and throws std::logic_error, naming
/// the entry, where it does not hold.
std::span<call const> calls();

/// The call named `name`; null if none.
call const* find_call(std::string_view name);

/// Which transport carries a call.
enum class transport : std::uint8_t { grpc, session_socket };

[[nodiscard]] bool carries(call const& c, transport t) noexcept;

/// The names of the calls `t` carries, in table order: what that transport's
/// request metrics count.
std::vector<std::string> call_names(transport t);

// The domains' entries, which calls() puts together (one function per
// *_calls.cpp file).
std::vector<call> lease_calls();
std::vector<call> buffer_calls();
std::vector<call> stable_calls();
std::vector<call> daemon_calls();

}  // namespace rmmd::wire
