#pragma once

// The one place where a core status becomes a wire status (DESIGN.md's error
// table), for both sockets: the gRPC service answers a grpc::Status, the
// session socket an ErrorInfo; both carry the code that wire_code() gives.

#include "rmmd/v1/rmmd.pb.h"

#include <absl/status/status.h>
#include <grpcpp/support/status.h>

namespace rmmd::wire {

/// The wire code of a core status code. The codes of the error table are
/// carried over one to one; any other one (a fault of ours or of the driver,
/// not of the request) is INTERNAL.
[[nodiscard]] grpc::StatusCode wire_code(absl::StatusCode code) noexcept;

/// `status` as the gRPC service answers it: wire_code() and the message as is.
[[nodiscard]] grpc::Status to_grpc_status(absl::Status const& status);

/// `status` as the session socket answers it, into `out`.
/// REQUIRES: !status.ok().
void to_error_info(absl::Status const& status, v1::ErrorInfo* out);

}  // namespace rmmd::wire
