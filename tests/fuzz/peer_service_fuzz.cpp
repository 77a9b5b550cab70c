// Every RmmdPeer request (peer.proto) through the peer service's own
// methods into a real core with host pools and the serving node's ledger:
// the checks a request from another node passes (grants, incarnations, hold
// ids, labels, access). No server and no channel: each call gets a
// ServerContext of its own, as gRPC would hand one to the method after
// parsing the request; it carries no TLS identity (a plaintext peer, which
// only the grant "*" matches).
//
// Input: records of [method byte][request]; the method byte picks Hello,
// OpenRemoteBuffer, RenewHolds, CloseHolds or ListRemoteBuffers, the request
// is its message in protobuf's binary form.
//
// Checked: every status is a gRPC code with a message where it is an error,
// never INTERNAL or UNKNOWN; a successful response serialises; and once the
// ledger stops, the core keeps no remote hold.

#include "daemon/peering/peer_service.hpp"
#include "daemon/peering/remote_hold_ledger.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <grpcpp/test/server_context_test_spouse.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace {

using namespace rmmd;

template <typename Request, typename Response, typename Method>
grpc::Status call(peering::peer_service& svc, Method method, std::span<char const> bytes)
{
  Request request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return grpc::Status::CANCELLED;  // gRPC would not call the method
  }
  grpc::ServerContext context;
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
  using peering::peer_service;
  auto const owned  = fuzz::make_host_core();
  auto& core        = *owned;
  auto const probes = peering::no_fabric_probe();
  peering::remote_hold_ledger ledger(core, std::chrono::milliseconds(1000));
  peer_service service("fuzz-node",
                       1,
                       probes,
                       ledger,
                       {{.identity = "*", .name_prefixes = {"a"}, .allow_writers = false},
                        {.identity = "CN=x", .name_prefixes = {""}, .allow_writers = true}},
                       {});

  fuzz::input_reader in({data, size});
  while (true) {
    auto const method = in.byte();
    auto const bytes  = in.record();
    if (!bytes) { break; }
    grpc::Status status;
    switch (method % 5) {
      case 0:
        status = call<v1::PeerHello, v1::PeerWelcome>(service, &peer_service::Hello, *bytes);
        break;
      case 1:
        status = call<v1::RemoteOpenRequest, v1::RemoteGrant>(
            service, &peer_service::OpenRemoteBuffer, *bytes);
        break;
      case 2:
        status = call<v1::RenewHoldsRequest, v1::RenewHoldsResponse>(
            service, &peer_service::RenewHolds, *bytes);
        break;
      case 3:
        status = call<v1::CloseHoldsRequest, v1::CloseHoldsResponse>(
            service, &peer_service::CloseHolds, *bytes);
        break;
      default:
        status = call<v1::ListRemoteBuffersRequest, v1::ListRemoteBuffersResponse>(
            service, &peer_service::ListRemoteBuffers, *bytes);
        break;
    }
    auto const code = status.error_code();
    RMMD_FUZZ_CHECK(code >= grpc::StatusCode::OK && code <= grpc::StatusCode::UNAUTHENTICATED);
    RMMD_FUZZ_CHECK(status.ok() || code == grpc::StatusCode::CANCELLED ||
                    !status.error_message().empty());
    RMMD_FUZZ_CHECK(code != grpc::StatusCode::INTERNAL && code != grpc::StatusCode::UNKNOWN);
  }
  ledger.stop();
  RMMD_FUZZ_CHECK(core.buffers().remote_holds().empty());
  return 0;
}
