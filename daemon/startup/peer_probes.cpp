#include "daemon/startup/peer_probes.hpp"

#include "daemon/backends/cuda/peer_probe.hpp"
#include "daemon/log.hpp"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace rmmd::startup {

namespace {

/// A CUDA pool whose fabric export startup/pools proved: handle_types names
/// fabric only there (never export where that said no). Not
/// pool.fabric_handle: with per-uid tenancy no tenant's backend exists at
/// start, so it is empty.
bool exports_fabric(core::pool_description const& pool)
{
  return pool.backend.space == core::memory_space::device &&
         std::find(pool.handle_types.begin(), pool.handle_types.end(), core::handle_type::fabric) !=
             pool.handle_types.end();
}

/// One anchor (a probe allocation) per further GPU with a fabric pool, beside
/// `out`'s probe, which is the first GPU's. A GPU whose anchor cannot be made
/// has none: its buffers' opens then pay the driver's first mapping.
void add_anchors(core::daemon_core const& core,
                 peering::probe_exchange& out,
                 std::shared_ptr<backends::cuda::fabric_probe_allocation> probe)
{
  auto kept =
      std::make_shared<std::vector<std::shared_ptr<backends::cuda::fabric_probe_allocation>>>();
  kept->push_back(std::move(probe));
  out.anchors.push_back(out.ours);
  for (auto const& pool : core.pools().list()) {
    if (!exports_fabric(pool) || out.anchor_of(pool.gpu_uuid) != nullptr) { continue; }
    try {
      auto allocation = std::make_shared<backends::cuda::fabric_probe_allocation>(pool.device);
      out.anchors.push_back(peering::fabric_probe{.fabric_handle = allocation->fabric_handle(),
                                                  .bytes         = allocation->bytes(),
                                                  .pattern       = allocation->pattern(),
                                                  .gpu_uuid      = pool.gpu_uuid});
      kept->push_back(std::move(allocation));
    } catch (std::exception const& e) {
      log::warn(
          "peering: no anchor for GPU %s (pool '%s'): %s; other nodes' first opens of its "
          "buffers pay the driver's first mapping",
          pool.gpu_uuid,
          pool.name,
          e.what());
    }
  }
  out.anchor_memory = std::move(kept);
}

}  // namespace

peering::probe_exchange make_peer_probes(core::daemon_core const& core,
                                         std::vector<std::string> const& unserved)
{
  for (auto const& pool : core.pools().list()) {
    if (!exports_fabric(pool)) { continue; }
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
      add_anchors(core, out, std::move(allocation));
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
