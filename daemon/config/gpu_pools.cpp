#include "daemon/config/gpu_pools.hpp"

#include <absl/strings/str_format.h>

namespace rmmd::config {
namespace {

bool names_device(gpu_pool_override const& o, int device, gpu_matcher const& names)
{
  return o.device >= 0 ? o.device == device : names(device, o.gpu);
}

std::string described(gpu_pool_override const& o)
{
  auto const gpu =
      o.device >= 0 ? absl::StrFormat("device %d", o.device) : absl::StrFormat("gpu %s", o.gpu);
  return absl::StrFormat("cuda_pool_per_gpu.gpu_overrides at line %d (%s)", o.line, gpu);
}

pool_settings applied(per_gpu_pools const& s, int device, gpu_pool_override const* o)
{
  pool_settings p{.name                    = s.name_prefix + std::to_string(device),
                  .backend                 = pool_kind::cuda,
                  .device                  = device,
                  .fabric                  = s.fabric,
                  .initial_size_bytes      = s.initial_size_bytes,
                  .release_threshold_bytes = s.release_threshold_bytes,
                  .limit_bytes             = s.limit_bytes};
  if (o == nullptr) { return p; }
  p.line = o->line;
  if (!o->name.empty()) { p.name = o->name; }
  p.fabric                  = o->fabric.value_or(p.fabric);
  p.initial_size_bytes      = o->initial_size_bytes.value_or(p.initial_size_bytes);
  p.release_threshold_bytes = o->release_threshold_bytes.value_or(p.release_threshold_bytes);
  p.limit_bytes             = o->limit_bytes.value_or(p.limit_bytes);
  return p;
}

}  // namespace

per_gpu_plan plan_per_gpu_pools(per_gpu_pools const& settings, int gpus, gpu_matcher const& names)
{
  per_gpu_plan plan;
  std::vector<bool> used(settings.overrides.size(), false);
  for (int device = 0; device < gpus; ++device) {
    gpu_pool_override const* found = nullptr;
    for (std::size_t i = 0; i < settings.overrides.size(); ++i) {
      auto const& o = settings.overrides[i];
      if (!names_device(o, device, names)) { continue; }
      used[i] = true;
      if (found != nullptr) {
        plan.error = absl::StrFormat("%s and %s both name CUDA device %d; keep one",
                                     described(*found),
                                     described(o),
                                     device);
        return plan;
      }
      found = &o;
    }
    if (found != nullptr && found->skip) { continue; }
    plan.pools.push_back(applied(settings, device, found));
  }
  for (std::size_t i = 0; i < settings.overrides.size(); ++i) {
    if (!used[i]) {
      plan.unmatched.push_back(absl::StrFormat("%s names no GPU that CUDA shows this daemon",
                                               described(settings.overrides[i])));
    }
  }
  return plan;
}

}  // namespace rmmd::config
