#pragma once

// The gRPC service rmmd.v1.Rmmd, as a thin adapter over the call table
// (daemon/wire/calls.hpp): one method per gRPC entry, registered at
// construction as the generated service would, with no per-method code here.
// A method authenticates the call's token (unless its entry needs no
// session), runs the entry's handler, maps its status through
// wire::to_grpc_status(), and counts the call in `requests` (lock-free; see
// request_metrics).
//
// Thread safety: serve() runs on gRPC's threads, any number at once; its
// state is set before the service serves calls, and read only after.

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/metrics/request_metrics.hpp"
#include "daemon/wire/calls.hpp"
#include "daemon/wire/remote_buffers.hpp"

#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>

#include <deque>
#include <string>
#include <string_view>

namespace rmmd::service {

/// The metadata key that carries the session token on every call.
inline constexpr std::string_view token_metadata_key = "rmmd-token";

class rmmd_service final : public grpc::Service {
 public:
  /// Registers every gRPC entry of wire::calls() (which throws
  /// std::logic_error if the table and rmmd.proto disagree).
  rmmd_service(core::daemon_core& core, metrics::request_metrics& requests);

  /// Answers one call of `method`, a gRPC entry of the call table, as its
  /// registered method does once gRPC has parsed the request: the fuzzer's
  /// way in. REQUIRES: `request` and `*reply` are of `method`'s types.
  grpc::Status serve(wire::call const& method,
                     grpc::ServerContext& context,
                     wire::Message const& request,
                     wire::Message* reply);

  /// Who serves OpenBuffer and ListBuffers with `peer` set, and ListPeers;
  /// null: peering is off (such a call answers NOT_FOUND). REQUIRES: called
  /// before the service serves calls.
  void set_remote_buffers(wire::remote_buffers* remote)
  {
    remote_ = remote;
  }

  /// The largest request each method accepts, in bytes: `small` for most,
  /// `large` for those whose routes say large_request (a manifest). gRPC's
  /// own receive cap must be at least `large`. REQUIRES: called before the
  /// service serves calls.
  void set_request_caps(std::size_t small, std::size_t large)
  {
    small_request_bytes_ = small;
    large_request_bytes_ = large;
  }

  /// The metrics endpoint's address, which Health reports.
  /// REQUIRES: called before the service serves calls.
  void set_metrics_address(std::string address)
  {
    facts_.metrics_address = std::move(address);
  }

 private:
  /// A registered method: the request's bytes parsed into `method`'s
  /// message, served, and the reply serialised.
  grpc::Status serve_bytes(wire::call const& method,
                           grpc::ServerContext& context,
                           grpc::ByteBuffer const& request,
                           grpc::ByteBuffer* reply);

  absl::StatusOr<core::session_id> caller(grpc::ServerContext const& context) const;

  core::daemon_core& core_;
  std::size_t small_request_bytes_{std::size_t{64} << 10};
  std::size_t large_request_bytes_{core::max_manifest_bytes + (std::size_t{64} << 10)};
  metrics::request_metrics& requests_;
  wire::daemon_facts facts_;
  wire::remote_buffers* remote_{nullptr};
  /// The methods' paths ("/rmmd.v1.Rmmd/Allocate"), which gRPC keeps
  /// pointers to: a deque, so they never move.
  std::deque<std::string> paths_;
};

}  // namespace rmmd::service
