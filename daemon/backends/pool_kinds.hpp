#pragma once

// The kinds of pool this daemon can serve, one entry each: the config's name
// for the kind, what its backends are (core::backend_traits), and how a pool
// of it is made at start. A new kind of pool is its backend and its entry
// under daemon/backends/<kind>/, one line in pool_kinds.cpp, and its config
// entry (Pool.Backend and its checks); the core, the wire, the metrics and
// the client go by the traits and need no new case (docs/architecture.md).

#include "daemon/config/settings.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/core/types.hpp"

#include <chrono>
#include <span>
#include <string>
#include <vector>

namespace rmmd::backends {

/// What the start knows when it makes pools.
struct pool_start {
  int gpus{};               ///< GPUs CUDA shows this daemon (0: none, or none needed)
  bool vmm_buffers{false};  ///< shared buffers on device pools get allocations of their own
  /// How long address-stable memory given back stays the daemon's for its
  /// uid's next allocation (--keep-released-memory); 0: not at all.
  std::chrono::milliseconds keep_released{0};
  /// Where a kind's entry notes each pool it skips (not served, the daemon
  /// starts without it), in words; null: nowhere. Peering tells peers.
  std::vector<std::string>* unserved{nullptr};
};

/// One kind of pool.
struct pool_kind_entry {
  config::pool_kind config{};  ///< its Pool.backend in rmmd.conf
  core::backend_traits traits{};
  bool needs_gpu{false};  ///< the start counts GPUs when a pool of it is planned
  /// Makes the pool `p` in `core`. False, after saying why, when the daemon
  /// cannot start as configured; true also when the pool is skipped for a
  /// reason its log line gives (a device pool that requires fabric handles).
  bool (*add)(core::daemon_core& core, config::pool_settings const& p, pool_start const& start){};
};

/// Every kind, in the order of config::pool_kind.
[[nodiscard]] std::span<pool_kind_entry const> pool_kinds() noexcept;

/// The entry of `kind`.
[[nodiscard]] pool_kind_entry const& pool_kind_of(config::pool_kind kind) noexcept;

}  // namespace rmmd::backends
