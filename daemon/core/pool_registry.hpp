#pragma once

// The pools: adding them at start, describing them (to everyone, or to one
// session with its tenant's handles), making and retiring each tenant's
// backends, trimming, and the statistics every pool and session shows
// (stats, rmmctl, /metrics).
//
// Owns: the mutex under which a tenant's backends are made, and the source
// of each GPU's driver-side usage. The pools themselves, the sessions and
// the statistics' history are core_state's (the other parts charge and read
// them too).
//
// A pool's row counts every tenant's leases, bytes, shared buffers and
// holders: tenants split a pool's memory between backends, they do not hide
// any of it from the pool's figures. Each tenant also has a row of its own
// inside the pool's.
//
// Lock discipline: every public member takes the core's mutex itself, but
// backends are made (make_tenant_backends), trimmed (trim) and asked for the
// driver's usage (stats) without it. The private members are the other
// parts' (session_registry, daemon_core): each says whether it needs the
// mutex held.

#include "daemon/core/core_state.hpp"
#include "daemon/core/pool_backend.hpp"
#include "daemon/core/tenants.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace rmmd::core {

class pool_registry {
 public:
  explicit pool_registry(core_state& state) : state_(state) {}
  pool_registry(pool_registry const&)            = delete;
  pool_registry& operator=(pool_registry const&) = delete;

  /// Adds a pool served by `backend`, one backend for every session whatever
  /// its tenant. Call before serving requests.
  pool_id add_pool(pool_config config, std::unique_ptr<pool_backend> backend);

  /// Adds a pool of the kind `traits` describes, lending at most `capacity` bytes, served to each
  /// tenant (options.tenancy) by a backend of its own that `make` makes on
  /// the tenant's first session; with tenancy off, by one backend made now.
  /// Throws what `make` throws. Call before serving requests.
  pool_id add_pool(pool_config config,
                   backend_traits traits,
                   std::size_t capacity,
                   backend_maker make);

  /// The pools; a pool with a backend per tenant without any tenant's
  /// handles (shareable_fd -1, no fabric handle): pools_for() gives a
  /// session its own.
  [[nodiscard]] std::vector<pool_description> list() const;

  /// The pools as `session` imports them: with its tenant's fd and fabric
  /// handle (owned by the backend, alive while the session is).
  /// UNAUTHENTICATED when the session is gone.
  [[nodiscard]] absl::StatusOr<std::vector<pool_description>> pools_for(session_id session) const;

  /// Gives unused memory of `pools` (every pool when empty) back to the
  /// system: see pool_backend::trim(). PERMISSION_DENIED unless the session's
  /// uid is root or options.admin_uid; INVALID_ARGUMENT for an unknown pool
  /// id (nothing is trimmed then); INTERNAL when a backend fails (pools before
  /// it in the list have been trimmed: trimming changes no ledger state).
  /// The backends trim without the core's lock: other calls go on meanwhile.
  absl::StatusOr<std::vector<pool_trim>> trim(session_id session,
                                              std::vector<pool_id> const& pools);

  /// Pools and sessions. With `top_sessions`, only that many sessions, those
  /// holding the most (see session_registry::top_sessions()); otherwise
  /// every session, by id.
  [[nodiscard]] stats_snapshot stats(std::optional<std::size_t> top_sessions = {}) const;

  /// What the start took back (stats and /metrics show it).
  void set_restart_summary(restart_summary summary);

  /// Where stats() reads each GPU's used bytes (stats_snapshot::gpu_memory);
  /// called without the core's lock. Call before serving requests.
  void set_driver_usage_source(driver_usage_source source);

 private:
  friend class session_registry;
  friend class daemon_core;

  /// The pools; with `tenant`, its fds and fabric handles. REQUIRES: the
  /// core's mutex held.
  [[nodiscard]] std::vector<pool_description> pools_locked(
      tenant_key const* tenant = nullptr) const;

  /// Makes the backends `tenant` lacks (a session of it is opening), without
  /// the core's lock. INTERNAL (or what the backend said) when one cannot be
  /// made; nothing is kept then. REQUIRES: the core's mutex not held.
  absl::Status make_tenant_backends(tenant_key const& tenant);
  /// Whether every pool has a backend for `tenant`. REQUIRES: the core's
  /// mutex held.
  [[nodiscard]] bool tenant_ready_locked(tenant_key const& tenant) const;
  /// Takes out the backends of `tenant`, whose last session closed, that
  /// nothing needs any more, for the caller to destroy without the lock.
  /// REQUIRES: the core's mutex held.
  std::vector<std::shared_ptr<pool_backend>> retire_tenant_locked(tenant_key const& tenant);

  core_state& state_;
  std::mutex tenants_mutex_;  // one tenant's backends made at a time; taken before the core's
  driver_usage_source driver_usage_;  // set before serving, then only read
};

}  // namespace rmmd::core
