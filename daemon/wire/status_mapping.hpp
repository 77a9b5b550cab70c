#pragma once

// The one place where a core status becomes a wire status (DESIGN.md's error
// table), for both sockets: the gRPC service answers a grpc::Status, the
// session socket an ErrorInfo; both carry the code that wire_code() gives.

#include "rmmd/v1/rmmd.pb.h"

#include <absl/status/status.h>
#include <grpcpp/support/status.h>

#include <string>
#include <string_view>

namespace rmmd::wire {

/// The wire code of a core status code. The codes of the error table are
/// carried over one to one; any other one (a fault of ours or of the driver,
/// not of the request) is INTERNAL.
[[nodiscard]] grpc::StatusCode wire_code(absl::StatusCode code) noexcept;

/// `status` (UNAVAILABLE or DEADLINE_EXCEEDED) marked as "another node's
/// daemon, `node`, cannot be reached from this one": the gRPC answer carries
/// it as v1::ErrorDetails.unreachable_node, by which a client tells it from
/// this daemon being gone (which gRPC answers with the same codes).
[[nodiscard]] absl::Status mark_unreachable_node(absl::Status status, std::string_view node);

/// The node mark_unreachable_node() named in `status`; "" if none.
[[nodiscard]] std::string unreachable_node(absl::Status const& status);

/// `status` (FAILED_PRECONDITION) marked as "no Hello of the calling peer
/// daemon's current incarnation reached this one": the gRPC answer carries
/// it as v1::ErrorDetails.hello_needed, by which the caller knows to say
/// Hello and call again.
[[nodiscard]] absl::Status mark_hello_needed(absl::Status status);

/// Whether a peer's gRPC answer carries v1::ErrorDetails.hello_needed.
[[nodiscard]] bool hello_needed(grpc::Status const& status);

/// `status` as the gRPC service answers it: wire_code() and the message as
/// is, and v1::ErrorDetails where mark_unreachable_node() or
/// mark_hello_needed() marked it.
[[nodiscard]] grpc::Status to_grpc_status(absl::Status const& status);

/// `status` as the session socket answers it, into `out`.
/// REQUIRES: !status.ok().
void to_error_info(absl::Status const& status, v1::ErrorInfo* out);

}  // namespace rmmd::wire
