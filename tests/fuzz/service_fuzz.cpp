// Every gRPC method of the Rmmd service (each gRPC entry of the call table,
// daemon/wire/calls.hpp), through the service's own way in
// (rmmd_service::serve: authentication, then the call's handler) into a
// real core with host pools. No server and no channel: each call gets a
// ServerContext of its own that carries the token the input chose, as gRPC
// would hand one to the method after parsing the request.
//
// Input: records of [method byte][token byte][request]. The method byte picks
// one of the table's gRPC methods (modulo their number, in table order:
// tests/fuzz/service_methods.hpp); the token byte picks none, the first or
// the second of two open sessions, or a wrong one; the request is the
// method's request message in protobuf's binary form (gRPC refuses one that
// does not parse before any method runs, and so does this fuzzer). An
// OpenBuffer's and WaitBufferLease's wait_ms is cut to 0: a fuzzer waits for nothing.
//
// Checked: every status is a gRPC code with a message where it is an error;
// a successful response serialises; a Free naming an interprocess event is
// refused; and once both sessions close and the persistent buffers they left
// are deleted, the ledger is empty.

#include "common/hex.hpp"
#include "daemon/metrics/request_metrics.hpp"
#include "daemon/service/rmmd_service.hpp"
#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/service_methods.hpp"

#include <grpcpp/test/server_context_test_spouse.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace {

using namespace rmmd;

/// Calls `method` with `bytes` as its request, as gRPC would after parsing it.
grpc::Status call(service::rmmd_service& svc,
                  wire::call const& method,
                  std::string const* token,
                  std::span<char const> bytes)
{
  std::unique_ptr<wire::Message> request(method.request->New());
  if (!request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return grpc::Status::CANCELLED;  // gRPC would not call the method
  }
  if (auto* open = dynamic_cast<v1::OpenBufferRequest*>(request.get())) { open->set_wait_ms(0); }
  if (auto* wait = dynamic_cast<v1::WaitBufferLeaseRequest*>(request.get())) {
    wait->set_wait_ms(0);
  }
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  if (token != nullptr) {
    spouse.AddClientMetadata(std::string(service::token_metadata_key), *token);
  }
  std::unique_ptr<wire::Message> response(method.reply->New());
  auto status = svc.serve(method, context, *request, response.get());
  if (status.ok()) {
    std::string out;
    RMMD_FUZZ_CHECK(response->SerializeToString(&out));
  }
  return status;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  using service::rmmd_service;
  auto const owned = fuzz::make_host_core();
  auto& core       = *owned;
  metrics::request_metrics requests(wire::call_names(wire::transport::grpc));
  rmmd_service service(core, requests);
  auto const& methods = fuzz::service_methods();

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
    auto const* token  = (who & 3) == 3 ? nullptr : &tokens[who & 3];
    auto const& called = *methods[method % methods.size()];
    auto const status  = call(service, called, token, *bytes);
    if (called.name == "Free") {
      // A session's Free naming an interprocess event is refused.
      v1::FreeRequest request;
      if ((who & 3) < 2 && request.ParseFromArray(bytes->data(), static_cast<int>(bytes->size())) &&
          !request.removed_release_event().empty()) {
        RMMD_FUZZ_CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
      }
    }
    auto const code = status.error_code();
    RMMD_FUZZ_CHECK(code >= grpc::StatusCode::OK && code <= grpc::StatusCode::UNAUTHENTICATED);
    RMMD_FUZZ_CHECK(status.ok() || code == grpc::StatusCode::CANCELLED ||
                    !status.error_message().empty());
    RMMD_FUZZ_CHECK(code != grpc::StatusCode::INTERNAL && code != grpc::StatusCode::UNKNOWN);
  }
  core.close_session(first->id);
  core.close_session(second->id);
  fuzz::delete_persistent_buffers(core, peer);
  RMMD_FUZZ_CHECK(core.buffers().all().empty());
  RMMD_FUZZ_CHECK(fuzz::ledger_is_empty(core));
  return 0;
}
