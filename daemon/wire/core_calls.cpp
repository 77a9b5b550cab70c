#include "daemon/wire/core_calls.hpp"

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/wire/proto_convert.hpp"

#include <absl/strings/str_format.h>

#include <optional>
#include <span>
#include <variant>
#include <vector>

namespace rmmd::wire {
namespace {

/// The one place that reads the core's reclaim hold: with rules.may_hold the
/// request is made so that the core holds it rather than wait for idle slabs
/// (`*held` set: the caller makes it again from a thread that may block);
/// otherwise so that it waits. Puts a grant into `reply` on success.
template <typename Hold, typename Wait, typename Reply>
absl::Status wait_or_hold(
    transport_rules rules, bool* held, Hold&& make_or_hold, Wait&& make_waiting, Reply* reply)
{
  auto answer = [&]() -> std::variant<decltype(make_waiting()), core::reclaim_hold> {
    if (rules.may_hold) { return make_or_hold(); }
    return make_waiting();
  }();
  if (std::holds_alternative<core::reclaim_hold>(answer)) {
    *held = true;
    return absl::OkStatus();
  }
  auto& grant = std::get<0>(answer);
  if (!grant.ok()) { return grant.status(); }
  to_proto(*grant, reply);
  return absl::OkStatus();
}

/// A grant for a transport that does not carry manifests: says one follows.
void manifest_follows(transport_rules rules, v1::BufferGrant* reply)
{
  if (rules.manifest_inline || !reply->has_manifest()) { return; }
  reply->clear_manifest();
  reply->set_manifest_follows(true);
}

}  // namespace

absl::Status allocate(core::daemon_core& core,
                      core::session_id session,
                      v1::AllocateRequest const& request,
                      transport_rules rules,
                      v1::AllocateResponse* reply,
                      bool* held)
{
  return wait_or_hold(
      rules,
      held,
      [&] {
        return core.leases().allocate_or_hold(session,
                                              request.pool_id(),
                                              request.size(),
                                              request.alignment(),
                                              rules.packing && request.may_pack());
      },
      [&] {
        return core.leases().allocate(session,
                                      request.pool_id(),
                                      request.size(),
                                      request.alignment(),
                                      core::reclaim_policy::wait,
                                      rules.packing && request.may_pack());
      },
      reply);
}

absl::Status free(core::daemon_core& core, core::session_id session, v1::FreeRequest const& request)
{
  // The daemon frees when the Free arrives; a client waits for its stream
  // first (a host function enqueued after its free sends the Free). An
  // interprocess event cannot be waited on safely (docs/protocol.md,
  // section 3), so a request that still names one is refused whole.
  if (!request.removed_release_event().empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "free allocation %d: FreeRequest field 2 (release_event, an interprocess event) is no "
        "longer supported, and nothing was freed; send the Free without it once the stream has "
        "passed the free of the imported pointer (the rmmd client sends it from a host function "
        "enqueued after cudaFreeAsync): update the client",
        request.allocation_id()));
  }
  return core.leases().free(session, request.allocation_id());
}

absl::Status drop_blocks(core::daemon_core& core,
                         core::session_id session,
                         v1::BlocksDropped const& request)
{
  auto const& ids = request.block_ids();
  return core.leases().drop_blocks(session, std::span(ids.data(), ids.size()));
}

absl::Status report_usage(core::daemon_core& core,
                          core::session_id session,
                          v1::UsageReport const& request,
                          v1::UsageReply* reply)
{
  std::vector<core::carved_usage> usage;
  usage.reserve(static_cast<std::size_t>(request.pools_size()));
  for (auto const& p : request.pools()) {
    usage.push_back(core::carved_usage{.pool              = p.pool_id(),
                                       .bytes             = p.bytes(),
                                       .allocation_count  = p.allocation_count(),
                                       .slab_bytes        = p.slab_bytes(),
                                       .reclaimable_bytes = p.reclaimable_bytes()});
  }
  auto trim = core.leases().report_usage(session, usage);
  if (!trim.ok()) { return trim.status(); }
  for (auto id : *trim) { reply->add_trim_pool_ids(id); }
  return absl::OkStatus();
}

void get_stats(core::daemon_core const& core, v1::GetStatsRequest const& request, v1::Stats* reply)
{
  auto const top = request.has_top_sessions() ? std::optional<std::size_t>(request.top_sessions())
                                              : std::nullopt;
  to_proto(core.pools().stats(top), reply);
}

void list_sessions(core::daemon_core const& core,
                   v1::ListSessionsRequest const& request,
                   v1::ListSessionsResponse* reply)
{
  if (request.has_top_sessions()) {
    to_proto(core.sessions().top_sessions(request.top_sessions()), reply);
    return;
  }
  auto all = core.sessions().list();
  reply->set_session_count(all.size());
  for (auto const& s : all) { to_proto(s, reply->add_sessions()); }
}

void list_pools(core::daemon_core const& core, v1::ListPoolsResponse* reply)
{
  for (auto const& p : core.pools().stats(0).pools) { to_proto(p, reply->add_pools()); }
}

absl::Status trim(core::daemon_core& core,
                  core::session_id session,
                  v1::TrimRequest const& request,
                  v1::TrimResponse* reply)
{
  std::vector<core::pool_id> pools(request.pool_ids().begin(), request.pool_ids().end());
  auto trimmed = core.pools().trim(session, pools);
  if (!trimmed.ok()) { return trimmed.status(); }
  for (auto const& t : *trimmed) { to_proto(t, reply->add_pools()); }
  return absl::OkStatus();
}

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

absl::Status close_buffer(core::daemon_core& core,
                          core::session_id session,
                          v1::CloseBufferRequest const& request)
{
  return core.buffers().close_buffer(session, request.buffer_id());
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

}  // namespace rmmd::wire
