#pragma once

// The pools a daemon serves: which ones the settings and the flags ask for
// (one per GPU where configured), and making each one in the core through
// its kind's entry (daemon/backends/pool_kinds.hpp), which says in words
// what could not be made and why.

#include "daemon/backends/pool_kinds.hpp"
#include "daemon/config/settings.hpp"
#include "daemon/core/daemon_core.hpp"

#include <optional>
#include <string>
#include <vector>

namespace rmmd::startup {

/// The pools as they will be made: the configured ones, then one per GPU
/// where the configuration asks for it (cuda_pool_per_gpu). nullopt, after
/// saying why, when they cannot all be made as configured.
std::optional<std::vector<config::pool_settings>> pool_plan(config::daemon_settings const& s);

/// Makes the pools of `plan` in order. False, after saying why, if one that
/// must exist cannot. `backend_flag`: --backend; `start`: what every pool's
/// kind is told (its `gpus` is counted here), its `unserved` (may be null)
/// getting, in words, each pool skipped without stopping the start (a pool
/// that requires fabric handles where there are none).
bool add_pools(core::daemon_core& core,
               std::vector<config::pool_settings> const& plan,
               std::string const& backend_flag,
               backends::pool_start start = {});

}  // namespace rmmd::startup
