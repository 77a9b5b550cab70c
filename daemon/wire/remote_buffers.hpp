#pragma once

// What the calls ask of peering (daemon/peering/): buffers of other nodes
// (OpenBuffer and ListBuffers with `peer` set), and the peers as ListPeers
// shows them. An interface so that the wire layer and the gRPC service do
// not depend on peering.

#include "daemon/core/types.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <absl/status/status.h>

namespace rmmd::wire {

class remote_buffers {
 public:
  remote_buffers()                                 = default;
  remote_buffers(remote_buffers const&)            = delete;
  remote_buffers& operator=(remote_buffers const&) = delete;
  virtual ~remote_buffers()                        = default;

  /// An OpenBuffer whose `peer` is set: asks that node's daemon. NOT_FOUND
  /// for a peer peering.peers does not name, UNAVAILABLE when it cannot be
  /// reached, else its answer. REQUIRES: !request.peer().empty().
  virtual absl::Status open(core::session_id session,
                            v1::OpenBufferRequest const& request,
                            v1::BufferGrant* reply) = 0;

  /// A ListBuffers whose `peer` is set: that node's daemon lists what this
  /// node's grant there lets it open. NOT_FOUND and UNAVAILABLE as open().
  /// REQUIRES: !request.peer().empty().
  virtual absl::Status list(v1::ListBuffersRequest const& request,
                            v1::ListBuffersResponse* reply) = 0;

  virtual void list_peers(v1::ListPeersResponse* reply) const = 0;
};

}  // namespace rmmd::wire
