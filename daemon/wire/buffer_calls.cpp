#include "daemon/wire/calls.hpp"

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/wire/detail/reclaim_hold.hpp"
#include "daemon/wire/proto_convert.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <chrono>
#include <vector>

// Named shared buffers: CreateBuffer, PublishBuffer, OpenBuffer, WaitBufferLease, CloseBuffer,
// DeleteBuffer, ListBuffers, the manifest calls, and BufferFd (the session
// socket's: a buffer's fd travels only there).

namespace rmmd::wire {
namespace {

using detail::wait_or_hold;

/// Longest an OpenBuffer waits, whatever it asks: a waiting call holds one of
/// gRPC's threads.
constexpr std::chrono::minutes max_open_wait{10};

/// A grant for a transport that does not carry manifests: says one follows.
void manifest_follows(transport_rules rules, v1::BufferGrant* reply)
{
  if (rules.manifest_inline || !reply->has_manifest()) { return; }
  reply->clear_manifest();
  reply->set_manifest_follows(true);
}

/// Held as allocate() is.
absl::Status create_buffer(core::daemon_core& core,
                           core::session_id session,
                           v1::CreateBufferRequest const& request,
                           transport_rules rules,
                           v1::BufferGrant* reply,
                           bool* held)
{
  auto status = wait_or_hold(
      rules,
      held,
      [&] {
        return core.buffers().create_buffer_or_hold(
            session, request.name(), request.pool_id(), request.size(), from_proto(request));
      },
      [&] {
        return core.buffers().create_buffer(session,
                                            request.name(),
                                            request.pool_id(),
                                            request.size(),
                                            from_proto(request),
                                            core::reclaim_policy::wait);
      },
      reply);
  if (status.ok()) { manifest_follows(rules, reply); }
  return status;
}

absl::Status publish_buffer(core::daemon_core& core,
                            core::session_id session,
                            v1::PublishBufferRequest const& request)
{
  return core.buffers().publish_buffer(session, request.buffer_id());
}

/// Waits until `wait_until` at most (the transport bounds the request's
/// wait_ms); the default waits not at all. INVALID_ARGUMENT for an access
/// the protocol does not define.
absl::Status open_buffer(core::daemon_core& core,
                         core::session_id session,
                         v1::OpenBufferRequest const& request,
                         transport_rules rules,
                         v1::BufferGrant* reply,
                         std::chrono::steady_clock::time_point wait_until)
{
  if (!v1::BufferAccess_IsValid(request.access())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "open buffer: access %d is not one the protocol defines; ask for BUFFER_ACCESS_READ (0) "
        "or BUFFER_ACCESS_READ_WRITE (1)",
        static_cast<int>(request.access())));
  }
  if (auto key = repeated_label_key(request.expect_labels())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("open buffer '%s': expect_labels names '%s' twice; name each label once",
                        request.name(),
                        *key));
  }
  auto grant = core.buffers().open_buffer(session, request.name(), wait_until, from_proto(request));
  if (!grant.ok()) { return grant.status(); }
  to_proto(*grant, reply);
  manifest_follows(rules, reply);
  return absl::OkStatus();
}

/// INVALID_ARGUMENT also for a manifest larger than core::max_manifest_bytes
/// serialized.
absl::Status set_buffer_manifest(core::daemon_core& core,
                                 core::session_id session,
                                 v1::SetBufferManifestRequest const& request)
{
  if (auto bytes = request.manifest().ByteSizeLong(); bytes > core::max_manifest_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "set the manifest of buffer %d: it is %d bytes serialized; a manifest is at most %d "
        "bytes (split the tensors over several buffers)",
        request.buffer_id(),
        bytes,
        core::max_manifest_bytes));
  }
  if (auto key = repeated_label_key(request.manifest().labels())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("set the manifest of buffer %d: label '%s' is given twice; a key names "
                        "one label",
                        request.buffer_id(),
                        *key));
  }
  return core.buffers().set_buffer_manifest(
      session, request.buffer_id(), from_proto(request.manifest()));
}

absl::Status describe_buffer(core::daemon_core const& core,
                             core::session_id session,
                             v1::DescribeBufferRequest const& request,
                             v1::DescribeBufferResponse* reply)
{
  auto described = core.buffers().describe_buffer(session, request.name());
  if (!described.ok()) { return described.status(); }
  to_proto(described->info, reply->mutable_info());
  if (described->manifest) { to_proto(*described->manifest, reply->mutable_manifest()); }
  return absl::OkStatus();
}

absl::Status get_buffer_manifest(core::daemon_core const& core,
                                 core::session_id session,
                                 v1::GetBufferManifestRequest const& request,
                                 v1::BufferManifest* reply)
{
  auto manifest = core.buffers().buffer_manifest_of(session, request.buffer_id());
  if (!manifest.ok()) { return manifest.status(); }
  if (*manifest) { to_proto(**manifest, reply); }
  return absl::OkStatus();
}

/// INVALID_ARGUMENT for a hold the protocol does not define.
absl::Status close_buffer(core::daemon_core& core,
                          core::session_id session,
                          v1::CloseBufferRequest const& request)
{
  core::hold_kind kind{};
  switch (request.hold()) {
    case v1::BUFFER_HOLD_READ:
      kind = core::hold_kind::read;
      break;
    case v1::BUFFER_HOLD_READ_WRITE:
      kind = core::hold_kind::read_write;
      break;
    case v1::BUFFER_HOLD_LEASE:
      kind = core::hold_kind::lease;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "close buffer %d: hold %d is not one the protocol defines; name BUFFER_HOLD_READ (0), "
          "BUFFER_HOLD_READ_WRITE (1) or BUFFER_HOLD_LEASE (2)",
          request.buffer_id(),
          static_cast<int>(request.hold())));
  }
  return core.buffers().close_buffer(session, request.buffer_id(), kind);
}

absl::Status delete_buffer(core::daemon_core& core,
                           core::session_id session,
                           v1::DeleteBufferRequest const& request,
                           v1::DeleteBufferResponse* reply)
{
  auto holders = core.buffers().delete_buffer(session, request.name());
  if (!holders.ok()) { return holders.status(); }
  reply->set_holders(static_cast<std::uint32_t>(*holders));
  return absl::OkStatus();
}

absl::Status list_buffers(core::daemon_core const& core,
                          core::session_id session,
                          v1::ListBuffersRequest const& request,
                          v1::ListBuffersResponse* reply)
{
  if (auto key = repeated_label_key(request.labels())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "list buffers: the filter names label '%s' twice; name each label once", *key));
  }
  auto buffers = core.buffers().list_buffers(session, from_proto(request));
  if (!buffers.ok()) { return buffers.status(); }
  for (auto const& b : *buffers) { to_proto(b, reply->add_buffers()); }
  return absl::OkStatus();
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

/// An OpenBuffer: another node's buffer through peering, else this node's,
/// waiting no longer than asked, than the caller waits for the answer, or
/// than max_open_wait (not at all where the transport lets no call wait).
absl::Status open_here_or_there(call_context const& c,
                                v1::OpenBufferRequest const& request,
                                v1::BufferGrant* reply)
{
  if (!request.peer().empty()) {
    if (request.exclusive()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "open buffer '%s:%s' exclusively: a write lease is held by a session of the buffer's "
          "own node (docs/failover.md); open it exclusively there",
          request.peer(),
          request.name()));
    }
    if (!c.deadline) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "open buffer '%s:%s': the session socket opens this node's buffers only; open "
          "another node's with the gRPC OpenBuffer (rmmd clients do)",
          request.peer(),
          request.name()));
    }
    if (c.remote == nullptr) {
      return absl::NotFoundError(absl::StrFormat(
          "open buffer '%s': no peer '%s' in peering.peers (peering is off on this node)",
          request.name(),
          request.peer()));
    }
    return c.remote->open(c.session, request, reply);
  }
  if (!c.deadline) { return open_buffer(c.core, c.session, request, c.rules, reply, {}); }
  auto const now = std::chrono::steady_clock::now();
  auto wait      = std::min<std::chrono::steady_clock::duration>(
      std::chrono::milliseconds(request.wait_ms()), max_open_wait);
  auto const left = *c.deadline - std::chrono::system_clock::now();
  if (left < wait) { wait = std::max<std::chrono::steady_clock::duration>(left, {}); }
  return open_buffer(c.core, c.session, request, c.rules, reply, now + wait);
}

/// A standby's wait for its write lease: as long as asked, than the caller
/// waits for the answer, or than max_open_wait, whichever ends first.
absl::Status wait_buffer_lease(call_context const& c,
                               v1::WaitBufferLeaseRequest const& request,
                               v1::WaitBufferLeaseResponse* reply)
{
  auto const now = std::chrono::steady_clock::now();
  auto wait      = std::min<std::chrono::steady_clock::duration>(
      std::chrono::milliseconds(request.wait_ms()), max_open_wait);
  if (c.deadline) {
    auto const left = *c.deadline - std::chrono::system_clock::now();
    if (left < wait) { wait = std::max<std::chrono::steady_clock::duration>(left, {}); }
  } else {
    wait = {};  // a transport whose calls may not wait
  }
  auto generation = c.core.buffers().wait_buffer_lease(c.session, request.buffer_id(), now + wait);
  if (!generation.ok()) { return generation.status(); }
  reply->set_lease_generation(*generation);
  return absl::OkStatus();
}

/// A ListBuffers: another node's through peering, else this node's.
absl::Status list_here_or_there(call_context const& c,
                                v1::ListBuffersRequest const& request,
                                v1::ListBuffersResponse* reply)
{
  if (!request.peer().empty()) {
    if (c.remote == nullptr) {
      return absl::NotFoundError(absl::StrFormat(
          "list buffers: no peer '%s' in peering.peers (peering is off on this node)",
          request.peer()));
    }
    return c.remote->list(request, reply);
  }
  return list_buffers(c.core, c.session, request, reply);
}

}  // namespace

std::vector<call> buffer_calls()
{
  return {
      make_call<v1::CreateBufferRequest, v1::BufferGrant>(
          "CreateBuffer",
          {.session = on_session<&v1::SessionCall::create_buffer,
                                 &v1::SessionReply::mutable_create_buffer>("create_buffer")},
          [](call_context const& c, auto const& request, auto* reply) {
            return create_buffer(c.core, c.session, request, c.rules, reply, c.held);
          }),
      make_call<v1::PublishBufferRequest, v1::PublishBufferResponse>(
          "PublishBuffer",
          {.session             = on_session<&v1::SessionCall::publish_buffer,
                                 &v1::SessionReply::mutable_publish_buffer>("publish_buffer"),
           .reply_only_on_error = true},
          [](call_context const& c, auto const& request, auto*) {
            return publish_buffer(c.core, c.session, request);
          }),
      make_call<v1::OpenBufferRequest, v1::BufferGrant>(
          "OpenBuffer",
          {.session =
               on_session<&v1::SessionCall::open_buffer, &v1::SessionReply::mutable_open_buffer>(
                   "open_buffer")},
          &open_here_or_there),
      make_call<v1::WaitBufferLeaseRequest, v1::WaitBufferLeaseResponse>(
          "WaitBufferLease", {}, &wait_buffer_lease),
      make_call<v1::CloseBufferRequest, v1::CloseBufferResponse>(
          "CloseBuffer",
          {.session =
               on_session<&v1::SessionCall::close_buffer, &v1::SessionReply::mutable_close_buffer>(
                   "close_buffer"),
           .reply_only_on_error = true},
          [](call_context const& c, auto const& request, auto*) {
            return close_buffer(c.core, c.session, request);
          }),
      make_call<v1::DeleteBufferRequest, v1::DeleteBufferResponse>(
          "DeleteBuffer",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            return delete_buffer(c.core, c.session, request, reply);
          }),
      make_call<v1::ListBuffersRequest, v1::ListBuffersResponse>(
          "ListBuffers", {}, &list_here_or_there),
      make_call<v1::SetBufferManifestRequest, v1::SetBufferManifestResponse>(
          "SetBufferManifest",
          {.large_request = true},
          [](call_context const& c, auto const& request, auto*) {
            return set_buffer_manifest(c.core, c.session, request);
          }),
      make_call<v1::DescribeBufferRequest, v1::DescribeBufferResponse>(
          "DescribeBuffer",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            return describe_buffer(c.core, c.session, request, reply);
          }),
      make_call<v1::GetBufferManifestRequest, v1::BufferManifest>(
          "GetBufferManifest",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            return get_buffer_manifest(c.core, c.session, request, reply);
          }),
      make_call<v1::BufferFdRequest, v1::BufferFdResponse>(
          "BufferFd",
          {.grpc    = false,
           .session = on_session<&v1::SessionCall::buffer_fd, &v1::SessionReply::mutable_buffer_fd>(
               "buffer_fd")},
          [](call_context const& c, auto const& request, auto* reply) {
            return buffer_fd(c.core, c.session, request, c.fds, reply);
          }),
  };
}

}  // namespace rmmd::wire
