#pragma once

// The daemon's calls, request message -> core call -> reply message, once for
// both sockets: the gRPC service and the session socket are two transports
// onto these functions. Each function checks what the core cannot (fields of
// the wire alone), calls the core, and on success fills the reply; on failure
// it returns the core's status (wire::status_mapping makes it a wire code)
// and writes nothing into the reply. Who the caller is (`session`) is the
// transport's to establish.
//
// Thread safety: as the core's.

#include "daemon/core/daemon_core.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <absl/status/status.h>

#include <chrono>

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

/// With rules.may_hold, `*held` is set (and OK returned) for a call held for
/// idle slabs. REQUIRES: `held` is not null when rules.may_hold.
absl::Status allocate(core::daemon_core& core,
                      core::session_id session,
                      v1::AllocateRequest const& request,
                      transport_rules rules,
                      v1::AllocateResponse* reply,
                      bool* held = nullptr);

/// INVALID_ARGUMENT, changing nothing, for a request that carries the removed
/// interprocess-event field (see FreeRequest in rmmd.proto).
absl::Status free(core::daemon_core& core,
                  core::session_id session,
                  v1::FreeRequest const& request);

absl::Status drop_blocks(core::daemon_core& core,
                         core::session_id session,
                         v1::BlocksDropped const& request);

absl::Status report_usage(core::daemon_core& core,
                          core::session_id session,
                          v1::UsageReport const& request,
                          v1::UsageReply* reply);

void get_stats(core::daemon_core const& core, v1::GetStatsRequest const& request, v1::Stats* reply);

void list_sessions(core::daemon_core const& core,
                   v1::ListSessionsRequest const& request,
                   v1::ListSessionsResponse* reply);

void list_pools(core::daemon_core const& core, v1::ListPoolsResponse* reply);

absl::Status trim(core::daemon_core& core,
                  core::session_id session,
                  v1::TrimRequest const& request,
                  v1::TrimResponse* reply);

/// Held as allocate() is.
absl::Status create_buffer(core::daemon_core& core,
                           core::session_id session,
                           v1::CreateBufferRequest const& request,
                           transport_rules rules,
                           v1::BufferGrant* reply,
                           bool* held = nullptr);

absl::Status publish_buffer(core::daemon_core& core,
                            core::session_id session,
                            v1::PublishBufferRequest const& request);

/// Waits until `wait_until` at most (the transport bounds the request's
/// wait_ms); the default waits not at all. INVALID_ARGUMENT for an access
/// the protocol does not define.
absl::Status open_buffer(core::daemon_core& core,
                         core::session_id session,
                         v1::OpenBufferRequest const& request,
                         transport_rules rules,
                         v1::BufferGrant* reply,
                         std::chrono::steady_clock::time_point wait_until = {});

/// INVALID_ARGUMENT also for a manifest larger than core::max_manifest_bytes
/// serialized.
absl::Status set_buffer_manifest(core::daemon_core& core,
                                 core::session_id session,
                                 v1::SetBufferManifestRequest const& request);

absl::Status describe_buffer(core::daemon_core const& core,
                             core::session_id session,
                             v1::DescribeBufferRequest const& request,
                             v1::DescribeBufferResponse* reply);

absl::Status get_buffer_manifest(core::daemon_core const& core,
                                 core::session_id session,
                                 v1::GetBufferManifestRequest const& request,
                                 v1::BufferManifest* reply);

absl::Status close_buffer(core::daemon_core& core,
                          core::session_id session,
                          v1::CloseBufferRequest const& request);

absl::Status delete_buffer(core::daemon_core& core,
                           core::session_id session,
                           v1::DeleteBufferRequest const& request,
                           v1::DeleteBufferResponse* reply);

absl::Status list_buffers(core::daemon_core const& core,
                          core::session_id session,
                          v1::ListBuffersRequest const& request,
                          v1::ListBuffersResponse* reply);

}  // namespace rmmd::wire
