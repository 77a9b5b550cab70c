// The one status mapping: the codes of DESIGN.md's error table cross both
// sockets as they are, any other one as INTERNAL, and the gRPC status and the
// session socket's ErrorInfo agree.

#include "daemon/wire/status_mapping.hpp"

#include "rmmd/v1/errors.pb.h"

#include <gtest/gtest.h>

namespace rmmd::wire {
namespace {

TEST(StatusMapping, TheErrorTableCodesCrossAsTheyAre)
{
  for (auto code : {absl::StatusCode::kOk,
                    absl::StatusCode::kInvalidArgument,
                    absl::StatusCode::kResourceExhausted,
                    absl::StatusCode::kNotFound,
                    absl::StatusCode::kAlreadyExists,
                    absl::StatusCode::kFailedPrecondition,
                    absl::StatusCode::kPermissionDenied,
                    absl::StatusCode::kUnauthenticated,
                    absl::StatusCode::kUnavailable,
                    absl::StatusCode::kDeadlineExceeded,
                    absl::StatusCode::kUnimplemented,
                    absl::StatusCode::kInternal}) {
    EXPECT_EQ(static_cast<int>(wire_code(code)), static_cast<int>(code))
        << absl::StatusCodeToString(code);
  }
}

TEST(StatusMapping, AnyOtherCodeIsInternal)
{
  for (auto code : {absl::StatusCode::kAborted,
                    absl::StatusCode::kCancelled,
                    absl::StatusCode::kUnknown,
                    absl::StatusCode::kOutOfRange,
                    absl::StatusCode::kDataLoss}) {
    EXPECT_EQ(wire_code(code), grpc::StatusCode::INTERNAL) << absl::StatusCodeToString(code);
  }
}

TEST(StatusMapping, BothSocketsCarryTheSameCodeAndMessage)
{
  auto const status = absl::AbortedError("held for reclaim");
  auto const grpc   = to_grpc_status(status);
  v1::ErrorInfo info;
  to_error_info(status, &info);
  EXPECT_EQ(grpc.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(info.code(), static_cast<int>(grpc.error_code()));
  EXPECT_EQ(grpc.error_message(), "held for reclaim");
  EXPECT_EQ(info.message(), grpc.error_message());
  EXPECT_TRUE(to_grpc_status(absl::OkStatus()).ok());
}

TEST(StatusMapping, AHelloNeededMarkCrossesAsErrorDetailsAndNothingElseCarriesIt)
{
  auto const marked = to_grpc_status(
      mark_hello_needed(absl::FailedPreconditionError("peer 'CN=b' has not said Hello")));
  EXPECT_EQ(marked.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(marked.error_message(), "peer 'CN=b' has not said Hello");
  EXPECT_TRUE(hello_needed(marked));
  v1::ErrorDetails details;
  ASSERT_TRUE(details.ParseFromString(marked.error_details()));
  EXPECT_EQ(details.message(), marked.error_message());
  EXPECT_TRUE(details.unreachable_node().empty());
  // The same words unmarked, or another node's unreachability, are not it.
  EXPECT_FALSE(hello_needed(to_grpc_status(absl::FailedPreconditionError("call Hello first"))));
  EXPECT_FALSE(hello_needed(
      to_grpc_status(mark_unreachable_node(absl::UnavailableError("no answer"), "nodeB"))));
  EXPECT_FALSE(hello_needed(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "x", "garbage")));
}

}  // namespace
}  // namespace rmmd::wire
