#include "daemon/service/status_mapping.hpp"

#include <string>

namespace rmmd::service {

grpc::Status to_grpc_status(absl::Status const& status)
{
  auto message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return grpc::Status::OK;
    case absl::StatusCode::kInvalidArgument:
      return {grpc::StatusCode::INVALID_ARGUMENT, message};
    case absl::StatusCode::kResourceExhausted:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, message};
    case absl::StatusCode::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, message};
    case absl::StatusCode::kAlreadyExists:
      return {grpc::StatusCode::ALREADY_EXISTS, message};
    case absl::StatusCode::kPermissionDenied:
      return {grpc::StatusCode::PERMISSION_DENIED, message};
    case absl::StatusCode::kUnauthenticated:
      return {grpc::StatusCode::UNAUTHENTICATED, message};
    case absl::StatusCode::kFailedPrecondition:
      return {grpc::StatusCode::FAILED_PRECONDITION, message};
    case absl::StatusCode::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, message};
    // Everything else is a fault of ours or of the driver, not of the request.
    default:
      return {grpc::StatusCode::INTERNAL, message};
  }
}

}  // namespace rmmd::service
