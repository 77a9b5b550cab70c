#pragma once

// The RmmdPeer service (peer.proto): what other nodes' daemons call here,
// over mutual TLS. Thin: the caller's identity comes from the TLS auth
// context (x509_subject), never from a field; peer_grants checks what it may
// open; remote_hold_ledger keeps its holds.
//
// Thread safety: gRPC's threads call it at once; the grants are swapped
// whole under a mutex (a reload).

#include "daemon/config/settings.hpp"
#include "daemon/peering/probe_exchange.hpp"
#include "daemon/peering/remote_hold_ledger.hpp"
#include "rmmd/v1/peer.grpc.pb.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rmmd::peering {

/// The certificate subject gRPC's TLS verified for this call (the
/// x509_subject property); "" on a plaintext call.
std::string caller_identity(grpc::ServerContext const& context);

class peer_service final : public v1::RmmdPeer::Service {
 public:
  peer_service(std::string node_name,
               std::uint64_t incarnation,
               probe_exchange const& probes,
               remote_hold_ledger& ledger,
               std::vector<config::peer_grant_settings> grants,
               std::vector<config::peer_node_settings> const& peers);

  /// Hello is answered only for an identity that `grants` (or "*") or one of
  /// `peers`' identities names: PERMISSION_DENIED otherwise, nothing recorded.
  /// A reload's grants; calls in flight keep the ones they read.
  void set_grants(std::vector<config::peer_grant_settings> grants);

  grpc::Status Hello(grpc::ServerContext* context,
                     v1::PeerHello const* request,
                     v1::PeerWelcome* response) override;
  grpc::Status OpenRemoteBuffer(grpc::ServerContext* context,
                                v1::RemoteOpenRequest const* request,
                                v1::RemoteGrant* response) override;
  grpc::Status RenewHolds(grpc::ServerContext* context,
                          v1::RenewHoldsRequest const* request,
                          v1::RenewHoldsResponse* response) override;
  grpc::Status CloseHolds(grpc::ServerContext* context,
                          v1::CloseHoldsRequest const* request,
                          v1::CloseHoldsResponse* response) override;
  /// At most max_buffers_per_list entries and about max_list_bytes (below
  /// gRPC's 4 MiB default for a message), by name; `truncated` says more
  /// matched.
  grpc::Status ListRemoteBuffers(grpc::ServerContext* context,
                                 v1::ListRemoteBuffersRequest const* request,
                                 v1::ListRemoteBuffersResponse* response) override;

  static constexpr int max_buffers_per_list   = 4096;
  static constexpr std::size_t max_list_bytes = std::size_t{3} << 20;

 private:
  [[nodiscard]] std::shared_ptr<std::vector<config::peer_grant_settings> const> grants() const;

  std::string const node_name_;
  std::uint64_t const incarnation_;
  probe_exchange const& probes_;
  remote_hold_ledger& ledger_;
  mutable std::mutex grants_mutex_;
  std::shared_ptr<std::vector<config::peer_grant_settings> const> grants_;
  std::vector<std::string> peer_identities_;  // peering.peers' non-empty identities
};

/// FabricProbe <-> fabric_probe.
void to_proto(fabric_probe const& in, v1::FabricProbe* out);
fabric_probe from_proto(v1::FabricProbe const& in);

}  // namespace rmmd::peering
