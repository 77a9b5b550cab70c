#pragma once

// What a call's grpc::Status means to the session's caller: the one table
// from a status to the exception DESIGN.md's error table gives, and the
// node a daemon said it cannot reach. Both transports' calls end in a
// grpc::Status, so both come here. Stateless.

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace rmmd::detail {

/// Throws the exception DESIGN.md's error table gives for `status`, with
/// `what` (the request) in front of the daemon's message.
[[noreturn]] void throw_status(grpc::Status const& status, std::string_view what);

/// The node that the daemon answered it cannot reach (v1::ErrorDetails in
/// `status`'s details; set on UNAVAILABLE and DEADLINE_EXCEEDED only); ""
/// where the status carries none, as one that gRPC made itself never does.
[[nodiscard]] std::string unreachable_node(grpc::Status const& status);

}  // namespace rmmd::detail
