#pragma once

// The fabric probe peering shows other nodes (peering/probe_exchange.hpp):
// made on the GPU of the first CUDA pool that exports fabric handles, whose
// export startup/pools proved (fabric_probe.hpp); none without such a pool.
// The probe is that GPU's anchor too, and each further GPU with such a pool
// gets one more granule as its anchor.

#include "daemon/core/daemon_core.hpp"
#include "daemon/peering/probe_exchange.hpp"

#include <string>
#include <vector>

namespace rmmd::startup {

/// Never throws: a probe that cannot be made is an empty one with the reason.
/// Without a fabric pool, the reason names the first of `unserved` (pools the
/// start skipped, in words), else a pool served without fabric handles.
peering::probe_exchange make_peer_probes(core::daemon_core const& core,
                                         std::vector<std::string> const& unserved = {});

}  // namespace rmmd::startup
