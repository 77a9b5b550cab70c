#pragma once

#include "daemon/core/daemon_core.hpp"
#include "rmmd/v1/rmmd.grpc.pb.h"

#include <string_view>

namespace rmmd::service {

/// The metadata key that carries the session token on every call.
inline constexpr std::string_view token_metadata_key = "rmmd-token";

/// Thin adapter: authenticates the call's token, translates proto <-> core,
/// and maps errors through to_grpc_status(). Holds no state of its own.
class rmmd_service final : public v1::Rmmd::Service {
 public:
  explicit rmmd_service(core::daemon_core& core) : core_(core) {}

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

 private:
  absl::StatusOr<core::session_id> caller(grpc::ServerContext const& context) const;

  core::daemon_core& core_;
};

}  // namespace rmmd::service
