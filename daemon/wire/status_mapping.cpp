#include "daemon/wire/status_mapping.hpp"

#include "rmmd/v1/errors.pb.h"

#include <absl/strings/cord.h>

#include <array>
#include <string>
#include <utility>

namespace rmmd::wire {
namespace {

/// DESIGN.md's error table: the codes a request can earn. The numbers of the
/// two enums agree, but the table names each one that may leave the daemon,
/// so that a new core code is INTERNAL until someone decides otherwise.
constexpr std::array<std::pair<absl::StatusCode, grpc::StatusCode>, 12> wire_codes{{
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
}};

/// The absl::Status payload mark_unreachable_node() sets: the node's name.
constexpr char const* unreachable_node_payload = "rmmd.v1.ErrorDetails.unreachable_node";
/// The absl::Status payload mark_hello_needed() sets.
constexpr char const* hello_needed_payload = "rmmd.v1.ErrorDetails.hello_needed";

}  // namespace

grpc::StatusCode wire_code(absl::StatusCode code) noexcept
{
  for (auto const& [from, to] : wire_codes) {
    if (from == code) { return to; }
  }
  return grpc::StatusCode::INTERNAL;
}

absl::Status mark_unreachable_node(absl::Status status, std::string_view node)
{
  status.SetPayload(unreachable_node_payload, absl::Cord(std::string(node)));
  return status;
}

std::string unreachable_node(absl::Status const& status)
{
  auto node = status.GetPayload(unreachable_node_payload);
  return node ? std::string(*node) : std::string();
}

absl::Status mark_hello_needed(absl::Status status)
{
  status.SetPayload(hello_needed_payload, absl::Cord());
  return status;
}

bool hello_needed(grpc::Status const& status)
{
  v1::ErrorDetails details;
  return !status.error_details().empty() && details.ParseFromString(status.error_details()) &&
         details.hello_needed();
}

grpc::Status to_grpc_status(absl::Status const& status)
{
  if (status.ok()) { return grpc::Status::OK; }
  auto const code  = wire_code(status.code());
  auto node        = unreachable_node(status);
  bool const hello = status.GetPayload(hello_needed_payload).has_value();
  if (node.empty() && !hello) { return {code, std::string(status.message())}; }
  v1::ErrorDetails details;
  details.set_code(static_cast<int>(code));
  details.set_message(std::string(status.message()));
  details.set_unreachable_node(std::move(node));
  details.set_hello_needed(hello);
  return {code, details.message(), details.SerializeAsString()};
}

void to_error_info(absl::Status const& status, v1::ErrorInfo* out)
{
  out->set_code(static_cast<int>(wire_code(status.code())));
  out->set_message(std::string(status.message()));
}

}  // namespace rmmd::wire
