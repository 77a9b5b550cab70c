#pragma once

#include <absl/status/status.h>
#include <grpcpp/support/status.h>

namespace rmmd::service {

/// The one place where a core status becomes a gRPC status (DESIGN.md's
/// error table): the code is carried over one to one, the message as is.
grpc::Status to_grpc_status(absl::Status const& status);

}  // namespace rmmd::service
