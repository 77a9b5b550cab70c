#include "daemon/startup/pools.hpp"

#include "common/gpu_identity.hpp"
#include "daemon/backends/cuda/cuda_backend.hpp"
#include "daemon/backends/pool_kinds.hpp"
#include "daemon/config/gpu_pools.hpp"
#include "daemon/log.hpp"

#include <algorithm>
#include <optional>

namespace rmmd::startup {

std::optional<std::vector<config::pool_settings>> pool_plan(config::daemon_settings const& s)
{
  auto plan = s.pools;
  if (!s.cuda_pool_per_gpu) { return plan; }
  auto const per_gpu = config::plan_per_gpu_pools(*s.cuda_pool_per_gpu,
                                                  backends::cuda::device_count(),
                                                  [](int device, std::string const& selector) {
                                                    auto id = gpu::identify(device);
                                                    return id && gpu::names(*id, selector);
                                                  });
  for (auto const& line : per_gpu.unmatched) { log::warn("%s; ignored", line); }
  if (!per_gpu.error.empty()) {
    log::error("%s", per_gpu.error);
    return std::nullopt;
  }
  for (auto const& p : per_gpu.pools) {
    auto same =
        std::find_if(plan.begin(), plan.end(), [&](auto const& q) { return q.name == p.name; });
    if (same != plan.end()) {
      log::error("two pools are named '%s' (one made per GPU for CUDA device %d); rename one",
                 p.name,
                 p.device);
      return std::nullopt;
    }
    plan.push_back(p);
  }
  return plan;
}

bool add_pools(core::daemon_core& core,
               std::vector<config::pool_settings> const& plan,
               std::string const& backend_flag,
               backends::pool_start start)
{
  bool const any_cuda = std::any_of(plan.begin(), plan.end(), [](auto const& p) {
    return backends::pool_kind_of(p.backend).needs_gpu;
  });
  start.gpus          = any_cuda || backend_flag == "cuda" ? backends::cuda::device_count() : 0;
  if (backend_flag == "cuda" && start.gpus == 0) {
    log::error("--backend=cuda, but CUDA sees no GPU (is the driver loaded? nvidia-smi)");
    return false;
  }
  if (!any_cuda && backend_flag == "auto") {
    log::info("no CUDA pool: no GPU found, or none configured");
  }
  for (auto const& p : plan) {
    auto const& kind = backends::pool_kind_of(p.backend);
    if (!kind.add(core, p, start)) { return false; }
  }
  if (core.pools().list().empty()) {
    log::error("no pool could be served; see the lines above");
    return false;
  }
  return true;
}

}  // namespace rmmd::startup
