// rmmd::admin: each call is one request through the session's channel (the
// gRPC calls through session_impl::unary, which waits for a reconnect and asks the
// new daemon), its reply printed as protobuf's JSON mapping or read into
// admin.hpp's structs.

#include <rmmd/admin.hpp>

#include "client/detail/manifest_convert.hpp"
#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

namespace rmmd {
namespace {

/// The reply as admin.hpp promises it: field names as in the .proto, every
/// field (so that a reader need not know the defaults), on one line.
std::string to_json(google::protobuf::Message const& message, std::string const& what)
{
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  print.preserve_proto_field_names    = true;
  std::string out;
  if (auto status = google::protobuf::util::MessageToJsonString(message, &out, print);
      !status.ok()) {
    throw rmm::bad_alloc("rmmd: " + what +
                         ": could not write JSON: " + std::string(status.message()));
  }
  return out;
}

/// The gRPC call `method` (of the calls only gRPC carries) with `request`;
/// its reply, or the exception error.hpp gives, naming `what`.
template <typename Request, typename Reply>
Reply unary(session const& s,
            grpc::Status (v1::Rmmd::Stub::*method)(grpc::ClientContext*, Request const&, Reply*),
            Request const& request,
            std::string const& what)
{
  Reply reply;
  auto status = detail::impl_of(s).unary(method, request, &reply);
  if (!status.ok()) { detail::throw_status(status, what); }
  return reply;
}

/// `what`, unless the daemon's message names the call itself.
std::string unless_named(grpc::Status const& status, std::string what, std::string_view call)
{
  return status.error_message().rfind(call, 0) == 0 ? std::string() : std::move(what);
}

daemon_health from_proto(v1::HealthResponse const& h)
{
  daemon_health out;
  switch (h.status()) {
    case v1::SERVING_STATUS_SERVING:
      out.status = serving_status::serving;
      break;
    case v1::SERVING_STATUS_DRAINING:
      out.status = serving_status::draining;
      break;
    default:
      out.status = serving_status::unspecified;
  }
  out.version         = h.version();
  out.started_unix_ms = h.started_unix_ms();
  out.uptime_seconds  = h.uptime_seconds();
  out.pool_count      = h.pool_count();
  out.session_count   = h.session_count();
  out.pid             = h.pid();
  out.metrics_address = h.metrics_address();
  return out;
}

v1::TrimResponse trim_reply(session const& s, std::vector<std::uint32_t> const& pool_ids)
{
  v1::TrimRequest request;
  for (auto id : pool_ids) { request.add_pool_ids(id); }
  return unary(s, &v1::Rmmd::Stub::Trim, request, "trim");
}

}  // namespace

admin::admin(session s) noexcept : session_(std::move(s)) {}

std::string admin::stats_json(session_listing which) const
{
  v1::GetStatsRequest request;
  if (which.top) { request.set_top_sessions(*which.top); }
  return to_json(unary(session_, &v1::Rmmd::Stub::GetStats, request, "stats"), "stats");
}

std::string admin::sessions_json(session_listing which) const
{
  v1::ListSessionsRequest request;
  if (which.top) { request.set_top_sessions(*which.top); }
  return to_json(unary(session_, &v1::Rmmd::Stub::ListSessions, request, "list sessions"),
                 "list sessions");
}

std::string admin::pools_json() const
{
  return to_json(unary(session_, &v1::Rmmd::Stub::ListPools, v1::ListPoolsRequest{}, "list pools"),
                 "list pools");
}

std::string admin::buffers_json(buffer_filter const& filter) const
{
  v1::ListBuffersRequest request;
  request.set_name_prefix(filter.name_prefix);
  detail::copy_labels(filter.labels, request.mutable_labels());
  request.set_peer(filter.peer);
  v1::ListBuffersResponse reply;
  if (auto status = detail::impl_of(session_).list_buffers(request, &reply); !status.ok()) {
    detail::throw_status(status, "list buffers");
  }
  return to_json(reply, "list buffers");
}

std::string admin::buffer_json(std::string_view name) const
{
  v1::DescribeBufferResponse reply;
  if (auto status = detail::impl_of(session_).describe_buffer(std::string(name), &reply);
      !status.ok()) {
    detail::throw_status(
        status,
        unless_named(status, "describe buffer '" + std::string(name) + "'", "describe buffer "));
  }
  return to_json(reply, "describe buffer");
}

std::string admin::peers_json() const
{
  v1::ListPeersResponse reply;
  if (auto status = detail::impl_of(session_).list_peers(&reply); !status.ok()) {
    detail::throw_status(status, "list peers");
  }
  return to_json(reply, "list peers");
}

daemon_health admin::health() const
{
  return from_proto(unary(session_, &v1::Rmmd::Stub::Health, v1::HealthRequest{}, "health"));
}

std::string admin::health_json() const
{
  return to_json(unary(session_, &v1::Rmmd::Stub::Health, v1::HealthRequest{}, "health"), "health");
}

std::string admin::health_json(std::filesystem::path const& runtime_dir,
                               std::chrono::milliseconds timeout)
{
  auto const path = runtime_dir / "rmmd.sock";
  auto const stub = v1::Rmmd::NewStub(
      grpc::CreateChannel("unix:" + path.string(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::HealthResponse reply;
  if (auto status = stub->Health(&context, v1::HealthRequest{}, &reply); !status.ok()) {
    detail::throw_status(status, "health of the daemon at " + path.string());
  }
  return to_json(reply, "health");
}

std::vector<pool_trim> admin::trim(std::vector<std::uint32_t> const& pool_ids) const
{
  auto const reply = trim_reply(session_, pool_ids);
  std::vector<pool_trim> out;
  out.reserve(static_cast<std::size_t>(reply.pools_size()));
  for (auto const& p : reply.pools()) {
    pool_trim t{.pool_id = p.pool_id(), .name = p.name(), .released_bytes = p.released_bytes()};
    if (p.has_backend_reserved_bytes_before()) {
      t.reserved_bytes_before = p.backend_reserved_bytes_before();
    }
    if (p.has_backend_reserved_bytes_after()) {
      t.reserved_bytes_after = p.backend_reserved_bytes_after();
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string admin::trim_json(std::vector<std::uint32_t> const& pool_ids) const
{
  return to_json(trim_reply(session_, pool_ids), "trim");
}

std::size_t admin::delete_buffer(std::string_view name) const
{
  return shared_buffer::remove(session_, name);
}

std::string admin::sleepers_json() const
{
  return to_json(
      unary(session_, &v1::Rmmd::Stub::ListSleepers, v1::ListSleepersRequest{}, "list sleepers"),
      "list sleepers");
}

std::size_t admin::drop_backups(std::string_view backup_name) const
{
  v1::DropBackupsRequest request;
  request.set_backup_name(std::string(backup_name));
  return unary(session_, &v1::Rmmd::Stub::DropBackups, request, "drop backups").dropped_bytes();
}

std::chrono::nanoseconds admin::ping() const
{
  auto const t0 = std::chrono::steady_clock::now();
  if (auto status = detail::impl_of(session_).ping(); !status.ok()) {
    detail::throw_status(status, "ping");
  }
  return std::chrono::steady_clock::now() - t0;
}

open_probe admin::probe_open(std::string_view name, std::string_view peer) const
{
  auto& impl = detail::impl_of(session_);
  v1::OpenBufferRequest request;
  request.set_name(std::string(name));
  request.set_peer(std::string(peer));
  request.set_access(v1::BUFFER_ACCESS_READ);
  v1::BufferGrant grant;
  auto const t0     = std::chrono::steady_clock::now();
  auto const status = impl.open_buffer(request, &grant);
  auto const t1     = std::chrono::steady_clock::now();
  if (!status.ok()) {
    auto const shown =
        peer.empty() ? std::string(name) : std::string(peer) + ":" + std::string(name);
    detail::throw_status(status,
                         unless_named(status, "open buffer '" + shown + "'", "open buffer "));
  }
  static_cast<void>(impl.close_buffer(grant.buffer_id()));
  return {.bytes = grant.size(), .answer = t1 - t0};
}

}  // namespace rmmd
