// pool_registry: pools, tenants' backends, trim and stats.

#include "daemon/core/pool_registry.hpp"

#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace rmmd::core {

pool_id pool_registry::add_pool(pool_config config, std::unique_ptr<pool_backend> backend)
{
  std::lock_guard lock(state_.mutex);
  auto const capacity = backend->capacity();
  auto entry          = std::make_unique<pool_entry>(pool_tenants(std::move(backend)));
  entry->capacity     = capacity;
  if (config.limit_bytes != 0) { entry->capacity = std::min(entry->capacity, config.limit_bytes); }
  entry->config = std::move(config);
  state_.pools.push_back(std::move(entry));
  state_.stats.add_pool();
  return static_cast<pool_id>(state_.pools.size() - 1);
}

pool_id pool_registry::add_pool(pool_config config,
                                backend_traits traits,
                                std::size_t capacity,
                                backend_maker make)
{
  if (!state_.options.tenancy.isolate) {
    auto backend = make(tenant_key{});
    if (config.limit_bytes == 0) { config.limit_bytes = capacity; }
    return add_pool(std::move(config), std::move(backend));
  }
  std::lock_guard lock(state_.mutex);
  auto entry      = std::make_unique<pool_entry>(pool_tenants(traits, std::move(make)));
  entry->capacity = config.limit_bytes != 0 ? std::min(capacity, config.limit_bytes) : capacity;
  entry->config   = std::move(config);
  state_.pools.push_back(std::move(entry));
  state_.stats.add_pool();
  return static_cast<pool_id>(state_.pools.size() - 1);
}

std::vector<pool_description> pool_registry::list() const
{
  std::lock_guard lock(state_.mutex);
  return pools_locked();
}

absl::StatusOr<std::vector<pool_description>> pool_registry::pools_for(session_id session) const
{
  std::lock_guard lock(state_.mutex);
  auto found = state_.session_locked(session, "pools");
  if (!found.ok()) { return found.status(); }
  return pools_locked(&(*found)->tenant);
}

std::vector<pool_description> pool_registry::pools_locked(tenant_key const* tenant) const
{
  std::vector<pool_description> out;
  out.reserve(state_.pools.size());
  for (std::size_t i = 0; i < state_.pools.size(); ++i) {
    auto const& p     = *state_.pools[i];
    auto const* slot  = tenant != nullptr         ? p.tenants.find(*tenant)
                        : !p.tenants.per_tenant() ? p.tenants.find(tenant_key{})
                                                  : nullptr;
    auto const* owner = slot == nullptr ? nullptr : slot->backend.get();
    out.push_back(pool_description{
        .id             = static_cast<pool_id>(i),
        .name           = p.config.name,
        .device         = p.config.device,
        .gpu_uuid       = p.config.gpu_uuid,
        .pci_bus_id     = p.config.pci_bus_id,
        .backend        = p.tenants.traits(),
        .handle_types   = p.config.handle_types,
        .capacity_bytes = p.capacity,
        .shareable_fd   = owner == nullptr ? -1 : owner->shareable_fd(),
        .fabric_handle  = owner == nullptr ? std::vector<std::byte>{} : owner->fabric_handle(),
        .max_alignment  = p.config.max_alignment,
        .pinnable       = p.config.pinnable,
        .fabric_problem = p.config.fabric_problem});
  }
  return out;
}

bool pool_registry::tenant_ready_locked(tenant_key const& tenant) const
{
  return std::all_of(state_.pools.begin(), state_.pools.end(), [&](auto const& p) {
    return p->tenants.find(tenant) != nullptr;
  });
}

absl::Status pool_registry::make_tenant_backends(tenant_key const& tenant)
{
  std::lock_guard making(tenants_mutex_);
  std::vector<pool_id> missing;
  {
    std::lock_guard lock(state_.mutex);
    for (std::size_t i = 0; i < state_.pools.size(); ++i) {
      if (state_.pools[i]->tenants.find(tenant) == nullptr) {
        missing.push_back(static_cast<pool_id>(i));
      }
    }
  }
  if (missing.empty()) { return absl::OkStatus(); }
  // state_.pools is fixed once requests are served, and a pool's maker is const:
  // both are read without the lock while the backends are made.
  std::vector<std::shared_ptr<pool_backend>> made;
  for (auto id : missing) {
    auto backend = state_.pools[id]->tenants.make(tenant, state_.pools[id]->config.name);
    if (!backend.ok()) { return backend.status(); }  // those made so far go with `made`
    made.push_back(*std::move(backend));
  }
  std::lock_guard lock(state_.mutex);
  for (std::size_t i = 0; i < missing.size(); ++i) {
    state_.pools[missing[i]]->tenants.install(tenant, std::move(made[i]));
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<pool_backend>> pool_registry::retire_tenant_locked(
    tenant_key const& tenant)
{
  std::vector<std::shared_ptr<pool_backend>> retired;
  for (auto& p : state_.pools) {
    if (auto backend = p->tenants.release_if_unused(tenant)) {
      retired.push_back(std::move(backend));
    }
  }
  return retired;
}

absl::StatusOr<std::vector<pool_trim>> pool_registry::trim(session_id session,
                                                           std::vector<pool_id> const& pools)
{
  struct target {
    pool_id id;
    std::string name;
    std::vector<std::shared_ptr<pool_backend>> backends;  // every tenant's
  };
  std::vector<target> targets;
  {
    std::lock_guard lock(state_.mutex);
    auto s = state_.session_locked(session, "trim");
    if (!s.ok()) { return s.status(); }
    auto const uid = (*s)->peer.uid;
    if (uid != 0 && uid != state_.options.admin_uid) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "trim: uid %d may not trim pools; only root (uid 0) and the daemon's own uid %d may; "
          "run it as one of them (e.g. sudo rmmctl trim)",
          uid,
          state_.options.admin_uid));
    }
    std::vector<pool_id> ids = pools;
    if (ids.empty()) {
      for (std::size_t i = 0; i < state_.pools.size(); ++i) {
        ids.push_back(static_cast<pool_id>(i));
      }
    }
    for (auto id : ids) {
      if (id >= state_.pools.size()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "trim: unknown pool id %d; this daemon serves pool ids 0 to %d (see `rmmctl pools`); "
            "nothing was trimmed",
            id,
            static_cast<long long>(state_.pools.size()) - 1));
      }
    }
    for (auto id : ids) {
      auto& p = *state_.pools[id];
      // Fast-path sessions hear of it at their next usage report and give their
      // idle slabs back too: a second trim then frees what they returned.
      state_.signal_pressure_locked(p);
      // Sessions' empty packed blocks too, once their clients drop them.
      state_.packed.retire_empty(id);
      target t{.id = id, .name = p.config.name, .backends = {}};
      for (auto const& [tenant, slot] : p.tenants.slots()) { t.backends.push_back(slot.backend); }
      targets.push_back(std::move(t));
    }
  }

  // A backend's trim can take milliseconds (the CUDA pool waits for its
  // stream first), so it runs without the core's lock: allocations and frees
  // of every session go on meanwhile (pool_backend::trim() is thread-safe).
  // Trimming changes no ledger state. Trims run one at a time, so that each
  // pool's before/after figures are its own trim's.
  std::lock_guard trimming(state_.trim_mutex);
  std::vector<pool_trim> out;
  for (auto const& t : targets) {
    pool_trim trimmed{.pool = t.id, .name = t.name};
    auto add = [](std::optional<std::uint64_t>& sum, std::optional<backend_usage> const& u) {
      if (u) { sum = sum.value_or(0) + u->reserved_bytes; }
    };
    for (auto const& backend : t.backends) {
      add(trimmed.backend_reserved_before, backend->usage());
      auto freed = backend->trim();
      if (!freed.ok()) {
        return absl::Status(
            freed.status().code(),
            absl::StrFormat("trim pool '%s': %s", t.name, freed.status().message()));
      }
      trimmed.released_bytes += *freed;
      add(trimmed.backend_reserved_after, backend->usage());
    }
    out.push_back(std::move(trimmed));
  }
  return out;
}

stats_snapshot pool_registry::stats(std::optional<std::size_t> top_sessions) const
{
  // The driver first, without the lock (one call per GPU).
  std::map<int, std::optional<std::size_t>> driver_used;
  if (driver_usage_) {
    std::vector<int> devices;
    {
      std::lock_guard lock(state_.mutex);
      for (auto const& p : state_.pools) {
        if (p->config.device >= 0) { devices.push_back(p->config.device); }
      }
    }
    for (int d : devices) {
      if (!driver_used.contains(d)) { driver_used[d] = driver_usage_(d); }
    }
  }
  std::lock_guard lock(state_.mutex);
  auto snapshot    = state_.stats.snapshot({.pools        = state_.pools,
                                            .descriptions = pools_locked(),
                                            .sessions     = state_.sessions,
                                            .blocks       = state_.packed,
                                            .buffers      = state_.buffers,
                                            .stables      = state_.stables},
                                        top_sessions);
  snapshot.restart = state_.restart;
  // Address-stable memory with physical memory now: allocations of its own,
  // outside the pools' reservations, like buffers'.
  std::map<pool_id, std::size_t> stable_bytes;
  for (auto const& [id, e] : state_.stables) {
    if (e->state == stable_state::awake || e->state == stable_state::going_to_sleep) {
      stable_bytes[e->pool] += e->bytes;
    }
  }
  // Every pool of a device reports the device's spares.
  std::map<int, std::size_t> spares;
  for (auto const& p : state_.pools) {
    for (auto const& [key, slot] : p->tenants.slots()) {
      auto& s = spares[p->config.device];
      s       = std::max(s, slot.backend->spare_bytes());
    }
  }
  for (auto const& [device, used] : driver_used) {
    if (!used) { continue; }
    gpu_memory_use g{.device = device, .driver_used_bytes = *used};
    for (auto const& p : snapshot.pools) {
      if (p.pool.device != device) { continue; }
      g.gpu_uuid = p.pool.gpu_uuid;
      g.ledger_bytes += p.backend_reserved_bytes.value_or(0) + p.shared_bytes;
      if (auto s = stable_bytes.find(p.pool.id); s != stable_bytes.end()) {
        g.ledger_bytes += s->second;
      }
    }
    g.spare_bytes = spares[device];
    g.ledger_bytes += g.spare_bytes;
    g.unaccounted_bytes = *used > g.ledger_bytes ? *used - g.ledger_bytes : 0;
    snapshot.gpu_memory.push_back(std::move(g));
  }
  return snapshot;
}

void pool_registry::set_driver_usage_source(driver_usage_source source)
{
  std::lock_guard lock(state_.mutex);
  driver_usage_ = std::move(source);
}

void pool_registry::set_restart_summary(restart_summary summary)
{
  std::lock_guard lock(state_.mutex);
  state_.restart = summary;
}

}  // namespace rmmd::core
