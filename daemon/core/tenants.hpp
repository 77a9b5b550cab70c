#pragma once

// Tenants: whose allocations may share a backend pool. By default each uid
// is a tenant of its own, and every pool keeps one backend per tenant (a
// CUDA pool of its own per GPU and uid, a memfd of its own per host pool and
// uid), made on that tenant's first session: memory freed by one tenant is
// reused inside that tenant's backend only, and reaches another tenant only
// through the driver (a trim) or the kernel (punched pages). See
// docs/reliability.md, "Tenants".
//
// pool_tenants is a part of pool_entry: guarded by the core's mutex (core_state.hpp) like
// the rest of it, except where a member says otherwise.

#include "daemon/core/pool_backend.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/statusor.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rmmd::core {

/// Who a backend serves.
struct tenant_key {
  enum class kind : std::uint8_t {
    node,  ///< everyone (tenancy off)
    uid,   ///< one uid's sessions
    gid,   ///< the sessions whose primary gid is one of tenancy_policy::shared_gids
  };
  kind of{kind::node};
  std::uint32_t id{};

  auto operator<=>(tenant_key const&) const = default;

  /// "uid 1000", "gid 2000", "node": for logs, stats and errors.
  [[nodiscard]] std::string text() const;
};

/// How sessions map to tenants (rmmd.conf's `tenancy`).
struct tenancy_policy {
  /// False: one backend per pool for everyone (a single-tenant node).
  bool isolate{true};
  /// Sessions whose peer's primary gid is listed share one tenant per gid.
  std::vector<gid_t> shared_gids;

  [[nodiscard]] tenant_key tenant_of(peer_credentials const& peer) const;
};

/// Makes the backend of one tenant. Throws (std::exception) naming what failed.
using backend_maker = std::function<std::unique_ptr<pool_backend>(tenant_key const&)>;

/// One tenant's backend of a pool, and what keeps it.
struct tenant_slot {
  std::shared_ptr<pool_backend> backend;
  std::size_t in_use{};   ///< leases, packed blocks and buffers lent out of it, in bytes
  std::size_t buffers{};  ///< shared buffers whose memory it holds
  std::size_t high_water{};
};

/// A pool's backends: one shared by every tenant (a pool added with one
/// backend, or tenancy off), or one per tenant, made by a backend_maker.
class pool_tenants {
 public:
  /// One backend for every tenant.
  explicit pool_tenants(std::unique_ptr<pool_backend> shared);
  /// A backend of the kind `traits` describes per tenant, made on demand.
  pool_tenants(backend_traits traits, backend_maker make);

  /// Whether each tenant gets a backend of its own.
  [[nodiscard]] bool per_tenant() const noexcept
  {
    return static_cast<bool>(make_);
  }

  /// The slot serving `tenant`, or nullptr before make_slot() made it.
  [[nodiscard]] tenant_slot* find(tenant_key const& tenant);
  [[nodiscard]] tenant_slot const* find(tenant_key const& tenant) const;
  /// The backend serving `tenant`. REQUIRES: its slot exists (a session of
  /// the tenant is open, or a buffer of it lives).
  [[nodiscard]] pool_backend& backend(tenant_key const& tenant) const;

  /// Makes `tenant`'s backend (without the core's lock: it may take
  /// milliseconds). INTERNAL naming the pool and tenant when it fails.
  /// Called only with the tenants' mutex held (see pool_registry).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<pool_backend>> make(tenant_key const& tenant,
                                                                   std::string const& pool) const;
  /// Installs a backend make() returned (if none came meanwhile).
  void install(tenant_key const& tenant, std::shared_ptr<pool_backend> backend);

  /// Takes the slot of `tenant` out if nothing is lent from it and no
  /// buffer needs it, and returns its backend so the caller can destroy it
  /// without the lock; nullptr otherwise (and always for a shared backend).
  std::shared_ptr<pool_backend> release_if_unused(tenant_key const& tenant);

  /// Every slot, by tenant (the shared one under tenant_key{}).
  [[nodiscard]] std::map<tenant_key, tenant_slot> const& slots() const noexcept
  {
    return slots_;
  }
  /// The backends other than `tenant`'s, to trim when `tenant`'s backend is
  /// out of memory that the others hold but do not lend.
  [[nodiscard]] std::vector<std::shared_ptr<pool_backend>> others(tenant_key const& tenant) const;

  /// Every tenant's backend's kind.
  [[nodiscard]] backend_traits const& traits() const noexcept
  {
    return traits_;
  }

 private:
  [[nodiscard]] tenant_key slot_key(tenant_key const& tenant) const noexcept
  {
    return per_tenant() ? tenant : tenant_key{};
  }

  backend_maker make_;
  backend_traits traits_{};
  std::map<tenant_key, tenant_slot> slots_;
};

/// `call()` (a backend's allocation); when it finds the backend out of
/// memory and other tenants' backends of the pool (`others`) may hold memory
/// they do not lend (a CUDA pool keeps freed memory up to its release
/// threshold), has the driver take that back (trim(), one at a time under
/// `trim_mutex`) and calls once more. Without the core's lock.
template <class Call>
auto after_trimming_others(std::vector<std::shared_ptr<pool_backend>> const& others,
                           std::mutex& trim_mutex,
                           Call&& call)
{
  auto result = call();
  if (result.ok() || result.status().code() != absl::StatusCode::kResourceExhausted ||
      others.empty()) {
    return result;
  }
  std::size_t released = 0;
  {
    std::lock_guard trimming(trim_mutex);
    for (auto const& other : others) {
      if (auto freed = other->trim(); freed.ok()) { released += *freed; }
    }
  }
  if (released == 0) { return result; }
  return call();
}

}  // namespace rmmd::core
