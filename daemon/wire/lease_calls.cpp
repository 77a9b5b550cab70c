#include "daemon/wire/calls.hpp"

#include "daemon/wire/detail/reclaim_hold.hpp"
#include "daemon/wire/proto_convert.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <absl/strings/str_format.h>

#include <span>
#include <vector>

// Leases: Allocate, Free, BlocksDropped, ReportUsage and Trim.

namespace rmmd::wire {
namespace {

using detail::wait_or_hold;

/// With rules.may_hold, `*held` is set (and OK returned) for a call held for
/// idle slabs. REQUIRES: `held` is not null when rules.may_hold.
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

/// INVALID_ARGUMENT, changing nothing, for a request that carries the removed
/// interprocess-event field (see FreeRequest in rmmd.proto).
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

}  // namespace

std::vector<call> lease_calls()
{
  return {
      make_call<v1::AllocateRequest, v1::AllocateResponse>(
          "Allocate",
          {.session = on_session<&v1::SessionCall::allocate, &v1::SessionReply::mutable_allocate>(
               "allocate")},
          [](call_context const& c, auto const& request, auto* reply) {
            return allocate(c.core, c.session, request, c.rules, reply, c.held);
          }),
      make_call<v1::FreeRequest, v1::FreeResponse>(
          "Free",
          {.session = on_session<&v1::SessionCall::free, &v1::SessionReply::mutable_free>("free"),
           .reply_only_on_error = true},
          [](call_context const& c, auto const& request, auto*) {
            return free(c.core, c.session, request);
          }),
      // A direct-mode client let go of its imports of packed-lease blocks
      // (RetireBlocks): the session socket's alone, counted apart from Free.
      make_call<v1::BlocksDropped, v1::BlocksDroppedResponse>(
          "BlocksDropped",
          {.grpc                = false,
           .session             = on_session<&v1::SessionCall::blocks_dropped,
                                 &v1::SessionReply::mutable_blocks_dropped>("blocks_dropped"),
           .reply_only_on_error = true},
          [](call_context const& c, auto const& request, auto*) {
            return drop_blocks(c.core, c.session, request);
          }),
      make_call<v1::UsageReport, v1::UsageReply>(
          "ReportUsage",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            return report_usage(c.core, c.session, request, reply);
          }),
      make_call<v1::TrimRequest, v1::TrimResponse>(
          "Trim",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            return trim(c.core, c.session, request, reply);
          }),
  };
}

}  // namespace rmmd::wire
