#pragma once

// The CUDA pools that cuda_pool_per_gpu asks for, once the daemon knows its
// GPUs: one per GPU, the shared settings with that GPU's override applied.
// No CUDA here: the caller says which GPU a UUID or PCI bus id names.

#include "daemon/config/settings.hpp"

#include <functional>
#include <string>
#include <vector>

namespace rmmd::config {

/// Whether CUDA device `device` is the GPU that `selector` (a UUID or PCI
/// bus id) names.
using gpu_matcher = std::function<bool(int device, std::string const& selector)>;

struct per_gpu_plan {
  /// One pool per GPU 0 .. gpus-1, in ordinal order, but for skipped ones.
  std::vector<pool_settings> pools;
  /// An override that names no GPU the daemon sees, said in words (the
  /// daemon warns and goes on: one file may serve nodes of several kinds).
  std::vector<std::string> unmatched;
  /// Not empty: why the pools cannot be made (two overrides name one GPU).
  std::string error;
};

/// The pools of `settings` on GPUs 0 .. gpus-1.
per_gpu_plan plan_per_gpu_pools(per_gpu_pools const& settings, int gpus, gpu_matcher const& names);

}  // namespace rmmd::config
