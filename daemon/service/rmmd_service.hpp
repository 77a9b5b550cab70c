#pragma once

#include "daemon/core/daemon_core.hpp"
#include "daemon/metrics/request_metrics.hpp"
#include "daemon/service/remote_buffers.hpp"
#include "rmmd/v1/rmmd.grpc.pb.h"

#include <chrono>
#include <string>
#include <string_view>

namespace rmmd::service {

/// The metadata key that carries the session token on every call.
inline constexpr std::string_view token_metadata_key = "rmmd-token";

/// The daemon's version ("0.1.0"), from the CMake project.
std::string_view daemon_version() noexcept;

/// Thin adapter: authenticates the call's token, hands the request to the
/// wire layer's core call (wire/core_calls), maps its status through
/// wire::to_grpc_status(), and counts each call in `requests` (lock-free; see
/// request_metrics). Its only state is what Health reports about the daemon:
/// the start time and the metrics address.
class rmmd_service final : public v1::Rmmd::Service {
 public:
  rmmd_service(core::daemon_core& core, metrics::request_metrics& requests);

  grpc::Status Allocate(grpc::ServerContext* context,
                        v1::AllocateRequest const* request,
                        v1::AllocateResponse* response) override;
  grpc::Status Free(grpc::ServerContext* context,
                    v1::FreeRequest const* request,
                    v1::FreeResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context,
                        v1::GetStatsRequest const* request,
                        v1::Stats* response) override;
  grpc::Status ListSessions(grpc::ServerContext* context,
                            v1::ListSessionsRequest const* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status ReportUsage(grpc::ServerContext* context,
                           v1::UsageReport const* request,
                           v1::UsageReply* response) override;
  grpc::Status ListPools(grpc::ServerContext* context,
                         v1::ListPoolsRequest const* request,
                         v1::ListPoolsResponse* response) override;
  grpc::Status Trim(grpc::ServerContext* context,
                    v1::TrimRequest const* request,
                    v1::TrimResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context,
                      v1::HealthRequest const* request,
                      v1::HealthResponse* response) override;
  grpc::Status CreateBuffer(grpc::ServerContext* context,
                            v1::CreateBufferRequest const* request,
                            v1::BufferGrant* response) override;
  grpc::Status PublishBuffer(grpc::ServerContext* context,
                             v1::PublishBufferRequest const* request,
                             v1::PublishBufferResponse* response) override;
  /// Waits (wait_ms, within the call's deadline, at most max_open_wait) for
  /// the buffer to be created and published.
  grpc::Status OpenBuffer(grpc::ServerContext* context,
                          v1::OpenBufferRequest const* request,
                          v1::BufferGrant* response) override;
  grpc::Status CloseBuffer(grpc::ServerContext* context,
                           v1::CloseBufferRequest const* request,
                           v1::CloseBufferResponse* response) override;
  grpc::Status DeleteBuffer(grpc::ServerContext* context,
                            v1::DeleteBufferRequest const* request,
                            v1::DeleteBufferResponse* response) override;
  grpc::Status ListBuffers(grpc::ServerContext* context,
                           v1::ListBuffersRequest const* request,
                           v1::ListBuffersResponse* response) override;
  grpc::Status SetBufferManifest(grpc::ServerContext* context,
                                 v1::SetBufferManifestRequest const* request,
                                 v1::SetBufferManifestResponse* response) override;
  grpc::Status DescribeBuffer(grpc::ServerContext* context,
                              v1::DescribeBufferRequest const* request,
                              v1::DescribeBufferResponse* response) override;
  grpc::Status GetBufferManifest(grpc::ServerContext* context,
                                 v1::GetBufferManifestRequest const* request,
                                 v1::BufferManifest* response) override;
  grpc::Status ListPeers(grpc::ServerContext* context,
                         v1::ListPeersRequest const* request,
                         v1::ListPeersResponse* response) override;

  /// Longest an OpenBuffer waits, whatever it asks: a waiting call holds one
  /// of gRPC's threads.
  static constexpr std::chrono::minutes max_open_wait{10};

  /// Who serves OpenBuffer with `peer` set, and ListPeers; null: peering is
  /// off (such an open answers NOT_FOUND). REQUIRES: called before the
  /// service serves calls.
  void set_remote_buffers(remote_buffers* remote)
  {
    remote_ = remote;
  }

  /// The metrics endpoint's address, which Health reports.
  /// REQUIRES: called before the service serves calls.
  void set_metrics_address(std::string address)
  {
    metrics_address_ = std::move(address);
  }

 private:
  absl::StatusOr<core::session_id> caller(grpc::ServerContext const& context) const;

  core::daemon_core& core_;
  std::chrono::steady_clock::time_point started_{std::chrono::steady_clock::now()};
  std::chrono::system_clock::time_point started_wall_{std::chrono::system_clock::now()};
  std::string metrics_address_;
  remote_buffers* remote_{nullptr};
  metrics::request_metrics& requests_;
};

}  // namespace rmmd::service
