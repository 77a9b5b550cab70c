#include "daemon/startup/peer_probes.hpp"

#include "daemon/backends/cuda/peer_probe.hpp"
#include "daemon/log.hpp"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace rmmd::startup {

peering::probe_exchange make_peer_probes(core::daemon_core const& core,
                                         std::vector<std::string> const& unserved)
{
  for (auto const& pool : core.pools().list()) {
    // handle_types names fabric only where startup/pools proved the export
    // (the child's probe, then one pool made in-process): never export here
    // where that said no. Not pool.fabric_handle: with per-uid tenancy no
    // tenant's backend exists at start, so it is empty.
    bool const fabric =
        pool.backend.space == core::memory_space::device &&
        std::find(pool.handle_types.begin(), pool.handle_types.end(), core::handle_type::fabric) !=
            pool.handle_types.end();
    if (!fabric) { continue; }
    auto const device = pool.device;
    try {
      auto allocation = std::make_shared<backends::cuda::fabric_probe_allocation>(device);
      peering::probe_exchange out;
      out.ours   = peering::fabric_probe{.fabric_handle = allocation->fabric_handle(),
                                         .bytes         = allocation->bytes(),
                                         .pattern       = allocation->pattern(),
                                         .gpu_uuid      = pool.gpu_uuid};
      out.import = [allocation, device](peering::fabric_probe const& theirs) {
        auto problem = backends::cuda::import_fabric_probe(
            device, theirs.fabric_handle, theirs.bytes, theirs.pattern);
        return peering::probe_verdict{.ok = problem.empty(), .problem = problem};
      };
      return out;
    } catch (std::exception const& e) {
      log::warn("peering: cannot make the fabric probe on pool '%s': %s", pool.name, e.what());
      auto out         = peering::no_fabric_probe();
      out.ours.problem = std::string("its fabric probe could not be made: ") + e.what();
      return out;
    }
  }
  // No fabric pool: where the config asked one for fabric handles and the
  // start found none (no IMEX channel, ...), the peers hear why: a pool not
  // served for it first, else one served without them.
  auto out                         = peering::no_fabric_probe();
  std::vector<std::string> reasons = unserved;
  for (auto const& pool : core.pools().list()) {
    if (pool.fabric_problem.empty()) { continue; }
    reasons.push_back(
        absl::StrFormat("pool '%s' has no fabric handles: %s", pool.name, pool.fabric_problem));
  }
  if (!reasons.empty()) {
    auto const why   = reasons.front();
    out.ours.problem = why;
    out.import       = [why](peering::fabric_probe const&) {
      return peering::probe_verdict{.ok = false, .problem = why};
    };
  }
  return out;
}

}  // namespace rmmd::startup
