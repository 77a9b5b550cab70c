// Every gRPC request of the Rmmd service, through the service's own methods
// (authentication, then the wire layer: validation, proto <-> core) into a real core
// with host pools. No server and no channel: each call gets a ServerContext
// of its own that carries the token the input chose, as gRPC would hand one
// to the method after parsing the request.
//
// Input: records of [method byte][token byte][request]. The method byte picks
// one of the eight methods; the token byte picks none, the first or the
// second of two open sessions, or a wrong one; the request is the method's
// request message in protobuf's binary form (gRPC refuses one that does not
// parse before any method runs, and so does this fuzzer).
//
// Checked: every status is a gRPC code with a message where it is an error;
// a successful response serialises; a Free naming an interprocess event is
// refused; and once both sessions close, the ledger is empty.

#include "common/hex.hpp"
#include "daemon/metrics/request_metrics.hpp"
#include "daemon/service/rmmd_service.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <grpcpp/test/server_context_test_spouse.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace {

using namespace rmmd;

template <typename Request, typename Response, typename Method>
grpc::Status call(service::rmmd_service& svc,
                  Method method,
                  std::string const* token,
                  std::span<char const> bytes)
{
  Request request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return grpc::Status::CANCELLED;  // gRPC would not call the method
  }
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  if (token != nullptr) {
    spouse.AddClientMetadata(std::string(service::token_metadata_key), *token);
  }
  Response response;
  auto status = (svc.*method)(&context, &request, &response);
  if (status.ok()) {
    std::string out;
    RMMD_FUZZ_CHECK(response.SerializeToString(&out));
  }
  return status;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  using service::rmmd_service;
  auto const owned = fuzz::make_host_core();
  auto& core       = *owned;
  metrics::request_metrics requests;
  rmmd_service service(core, requests);

  core::peer_credentials const peer{
      .pid = 4242, .uid = fuzz::allowed_uid(), .gid = 4242, .supplementary_gids = {}};
  auto first  = core.sessions().open_session(peer, "fuzz", "first");
  auto second = core.sessions().open_session(peer, "fuzz", "second");
  RMMD_FUZZ_CHECK(first.ok() && second.ok());
  std::string const tokens[] = {common::to_hex(std::span<std::byte const>(first->token)),
                                common::to_hex(std::span<std::byte const>(second->token)),
                                std::string(32, '0')};

  fuzz::input_reader in({data, size});
  while (true) {
    auto const method = in.byte();
    auto const who    = in.byte();
    auto const bytes  = in.record();
    if (!bytes) { break; }
    auto const* token = (who & 3) == 3 ? nullptr : &tokens[who & 3];
    grpc::Status status;
    switch (method % 8) {
      case 0:
        status = call<v1::AllocateRequest, v1::AllocateResponse>(
            service, &rmmd_service::Allocate, token, *bytes);
        break;
      case 1: {
        status =
            call<v1::FreeRequest, v1::FreeResponse>(service, &rmmd_service::Free, token, *bytes);
        // A session's Free naming an interprocess event is refused.
        v1::FreeRequest request;
        if ((who & 3) < 2 &&
            request.ParseFromArray(bytes->data(), static_cast<int>(bytes->size())) &&
            !request.removed_release_event().empty()) {
          RMMD_FUZZ_CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        }
        break;
      }
      case 2:
        status =
            call<v1::GetStatsRequest, v1::Stats>(service, &rmmd_service::GetStats, token, *bytes);
        break;
      case 3:
        status = call<v1::ListSessionsRequest, v1::ListSessionsResponse>(
            service, &rmmd_service::ListSessions, token, *bytes);
        break;
      case 4:
        status = call<v1::UsageReport, v1::UsageReply>(
            service, &rmmd_service::ReportUsage, token, *bytes);
        break;
      case 5:
        status = call<v1::ListPoolsRequest, v1::ListPoolsResponse>(
            service, &rmmd_service::ListPools, token, *bytes);
        break;
      case 6:
        status =
            call<v1::TrimRequest, v1::TrimResponse>(service, &rmmd_service::Trim, token, *bytes);
        break;
      default:
        status = call<v1::HealthRequest, v1::HealthResponse>(
            service, &rmmd_service::Health, token, *bytes);
        break;
    }
    auto const code = status.error_code();
    RMMD_FUZZ_CHECK(code >= grpc::StatusCode::OK && code <= grpc::StatusCode::UNAUTHENTICATED);
    RMMD_FUZZ_CHECK(status.ok() || code == grpc::StatusCode::CANCELLED ||
                    !status.error_message().empty());
    RMMD_FUZZ_CHECK(code != grpc::StatusCode::INTERNAL && code != grpc::StatusCode::UNKNOWN);
  }
  core.close_session(first->id);
  core.close_session(second->id);
  RMMD_FUZZ_CHECK(fuzz::ledger_is_empty(core));
  return 0;
}
