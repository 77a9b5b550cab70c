#include "client/detail/call_status.hpp"

#include "rmmd/v1/errors.pb.h"

#include <rmmd/error.hpp>

#include <rmm/error.hpp>

namespace rmmd::detail {

std::string unreachable_node(grpc::Status const& status)
{
  if (status.error_details().empty()) { return {}; }
  v1::ErrorDetails details;
  if (!details.ParseFromString(status.error_details())) { return {}; }
  return details.unreachable_node();
}

[[noreturn]] void throw_status(grpc::Status const& status, std::string_view what)
{
  // An empty `what`: the daemon's message names the request itself.
  auto message = what.empty() ? "rmmd: " + status.error_message()
                              : "rmmd: " + std::string(what) + ": " + status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::UNIMPLEMENTED:  // a call this daemon does not know
      throw rmmd::logic_error(message);
    case grpc::StatusCode::FAILED_PRECONDITION:
      throw rmmd::precondition_error(message);
    case grpc::StatusCode::NOT_FOUND:
      throw rmmd::not_found_error(message);
    case grpc::StatusCode::ALREADY_EXISTS:
      throw rmmd::already_exists_error(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // what() reads "std::bad_alloc: out_of_memory: rmmd: ...", as RMM's own.
      throw rmm::out_of_memory(message);
    case grpc::StatusCode::PERMISSION_DENIED:
      throw permission_error(message);
    case grpc::StatusCode::UNAUTHENTICATED:
      throw session_error(message);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      // This node's daemon answered that another node cannot be reached
      // (its message says so, and where to look): it and the session are fine.
      if (!unreachable_node(status).empty()) { throw session_error(message); }
      throw session_error(message + " (the daemon is gone or not answering)");
    default:
      throw rmm::bad_alloc(message);
  }
}

}  // namespace rmmd::detail
