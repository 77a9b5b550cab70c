// daemon_core: sessions, pools, usage reports, trim, stats and the drain.
// Leases are in leases.cpp, shared buffers in shared_buffers.cpp.

#include "daemon/core/daemon_core.hpp"

#include "common/hex.hpp"
#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <malloc.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>
#include <utility>

namespace rmmd::core {

namespace {

session_token random_token()
{
  session_token token{};
  std::size_t got = 0;
  while (got < token.size()) {
    auto n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0 && errno == EINTR) { continue; }
    if (n < 0) { throw std::runtime_error(absl::StrCat("getrandom: ", std::strerror(errno))); }
    got += static_cast<std::size_t>(n);
  }
  return token;
}

/// Where this daemon's remote hold ids start: random, below 2^62 and not 0,
/// so ids of a daemon that started again do not repeat its last one's (a
/// peer's stale close must not end another hold), and every id stays below
/// 2^63 (remote_holder_key's bit).
remote_hold_id first_remote_hold_id()
{
  auto const token = random_token();
  remote_hold_id n = 0;
  std::memcpy(&n, token.data(), std::min(sizeof(n), token.size()));
  n &= (remote_hold_id{1} << 62) - 1;
  return n == 0 ? 1 : n;
}

/// Leases a closing session must have held for close_session() to give the
/// heap back to the kernel (malloc_trim costs about a millisecond).
constexpr std::size_t big_session_leases = 10000;

std::string bytes_text(std::size_t bytes)
{
  return absl::StrFormat("%d bytes", bytes);
}

}  // namespace

bool access_policy::allows(peer_credentials const& peer) const
{
  auto has = [](auto const& list, auto v) {
    return std::find(list.begin(), list.end(), v) != list.end();
  };
  if (has(uids, peer.uid) || has(gids, peer.gid)) { return true; }
  return std::any_of(peer.supplementary_gids.begin(), peer.supplementary_gids.end(), [&](gid_t g) {
    return has(gids, g);
  });
}

std::size_t quota_limits::limit_for_uid(uid_t uid) const
{
  auto it = per_uid_overrides.find(uid);
  return it == per_uid_overrides.end() ? per_uid_bytes : it->second;
}

daemon_core::daemon_core(core_options options)
    : options_(std::move(options)),
      next_remote_hold_(first_remote_hold_id()),
      reclaim_(options_.reclaim_timeout),
      packed_(mutex_, options_.pack_up_to, options_.pack_block_size, options_.pack_idle)
{
}

daemon_core::~daemon_core()
{
  close_all_sessions();
  // Persistent buffers stay until deleted or the daemon stops: it stops.
  std::lock_guard lock(mutex_);
  for (auto& [id, b] : buffers_) {
    if (b->creating) { continue; }
    if (b->release) {
      b->release(b->block);
    } else {
      pools_[b->pool]->tenants.backend(b->tenant).deallocate_shared(b->block);
    }
  }
  buffers_.clear();
  buffer_names_.clear();
}

void daemon_core::set_reclaim_notifier(reclaim_notifier notify)
{
  std::lock_guard lock(mutex_);
  reclaim_.set_notifier(std::move(notify));
}

void daemon_core::set_retire_notifier(retire_notifier notify)
{
  std::lock_guard lock(mutex_);
  packed_.set_retire_notifier(std::move(notify));
}

pool_id daemon_core::add_pool(pool_config config, std::unique_ptr<pool_backend> backend)
{
  std::lock_guard lock(mutex_);
  auto const capacity = backend->capacity();
  auto entry          = std::make_unique<pool_entry>(pool_tenants(std::move(backend)));
  entry->capacity     = capacity;
  if (config.limit_bytes != 0) { entry->capacity = std::min(entry->capacity, config.limit_bytes); }
  entry->config = std::move(config);
  pools_.push_back(std::move(entry));
  stats_.add_pool();
  return static_cast<pool_id>(pools_.size() - 1);
}

pool_id daemon_core::add_pool(pool_config config,
                              backend_kind kind,
                              std::size_t capacity,
                              backend_maker make)
{
  if (!options_.tenancy.isolate) {
    auto backend = make(tenant_key{});
    if (config.limit_bytes == 0) { config.limit_bytes = capacity; }
    return add_pool(std::move(config), std::move(backend));
  }
  std::lock_guard lock(mutex_);
  auto entry      = std::make_unique<pool_entry>(pool_tenants(kind, std::move(make)));
  entry->capacity = config.limit_bytes != 0 ? std::min(capacity, config.limit_bytes) : capacity;
  entry->config   = std::move(config);
  pools_.push_back(std::move(entry));
  stats_.add_pool();
  return static_cast<pool_id>(pools_.size() - 1);
}

std::vector<pool_description> daemon_core::pools() const
{
  std::lock_guard lock(mutex_);
  return pools_locked();
}

absl::StatusOr<std::vector<pool_description>> daemon_core::pools_for(session_id session) const
{
  std::lock_guard lock(mutex_);
  auto found = session_locked(session, "pools");
  if (!found.ok()) { return found.status(); }
  return pools_locked(&(*found)->tenant);
}

std::vector<pool_description> daemon_core::pools_locked(tenant_key const* tenant) const
{
  std::vector<pool_description> out;
  out.reserve(pools_.size());
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    auto const& p     = *pools_[i];
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
        .backend        = p.tenants.kind(),
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

bool daemon_core::tenant_ready_locked(tenant_key const& tenant) const
{
  return std::all_of(pools_.begin(), pools_.end(), [&](auto const& p) {
    return p->tenants.find(tenant) != nullptr;
  });
}

absl::Status daemon_core::make_tenant_backends(tenant_key const& tenant)
{
  std::lock_guard making(tenants_mutex_);
  std::vector<pool_id> missing;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < pools_.size(); ++i) {
      if (pools_[i]->tenants.find(tenant) == nullptr) {
        missing.push_back(static_cast<pool_id>(i));
      }
    }
  }
  if (missing.empty()) { return absl::OkStatus(); }
  // pools_ is fixed once requests are served, and a pool's maker is const:
  // both are read without the lock while the backends are made.
  std::vector<std::shared_ptr<pool_backend>> made;
  for (auto id : missing) {
    auto backend = pools_[id]->tenants.make(tenant, pools_[id]->config.name);
    if (!backend.ok()) { return backend.status(); }  // those made so far go with `made`
    made.push_back(*std::move(backend));
  }
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < missing.size(); ++i) {
    pools_[missing[i]]->tenants.install(tenant, std::move(made[i]));
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<pool_backend>> daemon_core::retire_tenant_locked(
    tenant_key const& tenant)
{
  std::vector<std::shared_ptr<pool_backend>> retired;
  if (tenant_sessions_.contains(tenant)) { return retired; }
  for (auto& p : pools_) {
    if (auto backend = p->tenants.release_if_unused(tenant)) {
      retired.push_back(std::move(backend));
    }
  }
  return retired;
}

session_entry* daemon_core::find_session_locked(session_id id) const
{
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

absl::StatusOr<session_entry*> daemon_core::session_locked(session_id id,
                                                           std::string_view request) const
{
  if (auto* s = find_session_locked(id)) { return s; }
  return absl::UnauthenticatedError(absl::StrCat(absl::string_view(request.data(), request.size()),
                                                 ": the session is closed; open a new session"));
}

absl::StatusOr<session_grant> daemon_core::open_session(peer_credentials peer,
                                                        std::string command,
                                                        session_origin origin)
{
  auto const refusal = [&]() -> std::optional<absl::Status> {
    if (draining_ || sessions_closed_) {
      return absl::UnavailableError(
          "open session: the daemon is draining for shutdown; retry once it has restarted");
    }
    if (!options_.access.allows(peer)) {
      return absl::PermissionDeniedError(
          absl::StrFormat("open session: uid %d gid %d (pid %d) is not allowed to use this "
                          "daemon; ask the operator to add the uid or one of its groups to the "
                          "allowed ids",
                          peer.uid,
                          peer.gid,
                          peer.pid));
    }
    return std::nullopt;
  };
  auto const tenant = options_.tenancy.tenant_of(peer);  // fixed: read without the lock
  std::unique_lock lock(mutex_);
  // A tenant's first session makes its backends (a CUDA pool each: about a
  // millisecond) without the lock; its last session's close may retire them
  // meanwhile, so check again once they are there.
  while (true) {
    if (auto refused = refusal()) { return *refused; }
    if (tenant_ready_locked(tenant)) { break; }
    lock.unlock();
    if (auto made = make_tenant_backends(tenant); !made.ok()) {
      return absl::Status(made.code(), absl::StrCat("open session: ", made.message()));
    }
    lock.lock();
  }
  auto token              = random_token();
  auto entry              = std::make_unique<session_entry>();
  entry->id               = next_session_++;
  entry->token_hex        = common::to_hex(std::span<std::byte const>(token));
  entry->peer             = std::move(peer);
  entry->tenant           = tenant;
  entry->command          = std::move(command);
  entry->client_name      = std::move(origin.client_name);
  entry->reconnects       = origin.reconnects;
  entry->previous_session = origin.reconnects > 0 ? origin.previous_session : session_id{};
  entry->started          = std::chrono::system_clock::now();
  if (origin.reconnects > 0) { ++restart_.reconnected_sessions; }
  auto const id = entry->id;
  by_token_.emplace(entry->token_hex, id);
  sessions_.emplace(id, std::move(entry));
  ++tenant_sessions_[tenant];
  return session_grant{.id = id, .token = token};
}

void daemon_core::close_session(session_id id) noexcept
{
  std::size_t leases = 0;
  std::vector<std::shared_ptr<pool_backend>> retired;  // destroyed without the lock
  std::set<buffer_id> foreign;                         // told without the lock
  foreign_release_notifier notify;
  {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) { return; }
    leases = ledger_.held_count(id);
    foreign.swap(it->second->foreign_holds);
    notify = foreign_released_;
    release_all_leases_locked(*it->second);
    release_buffers_of_locked(*it->second);
    auto const tenant = it->second->tenant;
    by_token_.erase(it->second->token_hex);
    sessions_.erase(it);
    if (auto t = tenant_sessions_.find(tenant); t != tenant_sessions_.end() && --t->second == 0) {
      tenant_sessions_.erase(t);
      retired = retire_tenant_locked(tenant);
    }
    reclaim_.room_changed();  // its leases are back, and its idle slabs gone from the count
  }
  retired.clear();
  if (notify) {
    for (auto f : foreign) { notify(f); }
  }
  // A session that held many leases leaves megabytes of freed tables and
  // batches in the heap, which glibc keeps (50 MiB after a million leases):
  // give them back to the kernel, without the lock.
  if (leases >= big_session_leases) { ::malloc_trim(0); }
}

absl::StatusOr<session_id> daemon_core::authenticate(std::string_view token_hex) const
{
  std::lock_guard lock(mutex_);
  if (token_hex.empty()) {
    return absl::UnauthenticatedError(
        "no session token in the call's `rmmd-token` metadata; open a session on the session "
        "socket first");
  }
  auto it = by_token_.find(std::string(token_hex));
  if (it == by_token_.end()) {
    return absl::UnauthenticatedError(
        "unknown session token: the session is closed or the token is wrong; open a new session");
  }
  return it->second;
}

absl::StatusOr<std::vector<pool_id>> daemon_core::report_usage(
    session_id session, std::vector<carved_usage> const& usage)
{
  std::lock_guard lock(mutex_);
  auto found = session_locked(session, "report usage");
  if (!found.ok()) { return found.status(); }
  auto& s = **found;
  std::set<pool_id> seen;
  for (auto const& u : usage) {
    if (u.pool >= pools_.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("report usage: unknown pool id %d; this daemon serves pool ids 0 to %d",
                          u.pool,
                          static_cast<long long>(pools_.size()) - 1));
    }
    if (!seen.insert(u.pool).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("report usage: pool '%s' appears twice; report each pool once",
                          pools_[u.pool]->config.name));
    }
    auto const held  = s.held_in(u.pool);
    auto const& name = pools_[u.pool]->config.name;
    if (u.bytes > held) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "report usage: %s in %d allocations carved from pool '%s', but the session holds "
          "%s there",
          bytes_text(u.bytes),
          u.allocation_count,
          name,
          bytes_text(held)));
    }
    if (u.slab_bytes > held) {
      return absl::InvalidArgumentError(
          absl::StrFormat("report usage: %s of slabs in pool '%s', but the session holds %s there",
                          bytes_text(u.slab_bytes),
                          name,
                          bytes_text(held)));
    }
    if (u.slab_bytes != 0 && u.bytes > u.slab_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("report usage: %s carved from %s of slabs in pool '%s'; a session "
                          "carves only from its slabs",
                          bytes_text(u.bytes),
                          bytes_text(u.slab_bytes),
                          name));
    }
    if (u.reclaimable_bytes > u.slab_bytes - std::min(u.slab_bytes, u.bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "report usage: %s of slabs with nothing carved in pool '%s', but only %s of its %s of "
          "slabs there are not carved",
          bytes_text(u.reclaimable_bytes),
          name,
          bytes_text(u.slab_bytes - std::min(u.slab_bytes, u.bytes)),
          bytes_text(u.slab_bytes)));
    }
  }
  for (auto const& u : usage) {
    if (u.bytes == 0 && u.allocation_count == 0 && u.slab_bytes == 0) {
      s.carved.erase(u.pool);
    } else {
      s.carved[u.pool] = u;
    }
  }
  std::vector<pool_id> trim;
  auto const now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    if (pools_[i]->pressure_until > now) { trim.push_back(static_cast<pool_id>(i)); }
  }
  return trim;
}

void daemon_core::signal_pressure(pool_id pool)
{
  std::lock_guard lock(mutex_);
  if (pool < pools_.size()) { signal_pressure_locked(*pools_[pool]); }
}

void daemon_core::signal_pressure_locked(pool_entry& pool)
{
  pool.pressure_until = std::chrono::steady_clock::now() + pressure_window;
}

absl::StatusOr<std::vector<pool_trim>> daemon_core::trim(session_id session,
                                                         std::vector<pool_id> const& pools)
{
  struct target {
    pool_id id;
    std::string name;
    std::vector<std::shared_ptr<pool_backend>> backends;  // every tenant's
  };
  std::vector<target> targets;
  {
    std::lock_guard lock(mutex_);
    auto s = session_locked(session, "trim");
    if (!s.ok()) { return s.status(); }
    auto const uid = (*s)->peer.uid;
    if (uid != 0 && uid != options_.admin_uid) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "trim: uid %d may not trim pools; only root (uid 0) and the daemon's own uid %d may; "
          "run it as one of them (e.g. sudo rmmctl trim)",
          uid,
          options_.admin_uid));
    }
    std::vector<pool_id> ids = pools;
    if (ids.empty()) {
      for (std::size_t i = 0; i < pools_.size(); ++i) { ids.push_back(static_cast<pool_id>(i)); }
    }
    for (auto id : ids) {
      if (id >= pools_.size()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "trim: unknown pool id %d; this daemon serves pool ids 0 to %d (see `rmmctl pools`); "
            "nothing was trimmed",
            id,
            static_cast<long long>(pools_.size()) - 1));
      }
    }
    for (auto id : ids) {
      auto& p = *pools_[id];
      // Fast-path sessions hear of it at their next usage report and give their
      // idle slabs back too: a second trim then frees what they returned.
      signal_pressure_locked(p);
      // Sessions' empty packed blocks too, once their clients drop them.
      packed_.retire_empty(id);
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
  std::lock_guard trimming(trim_mutex_);
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

stats_snapshot daemon_core::stats(std::optional<std::size_t> top_sessions) const
{
  // The driver first, without the lock (one call per GPU).
  std::map<int, std::optional<std::size_t>> driver_used;
  if (driver_usage_) {
    std::vector<int> devices;
    {
      std::lock_guard lock(mutex_);
      for (auto const& p : pools_) {
        if (p->config.device >= 0) { devices.push_back(p->config.device); }
      }
    }
    for (int d : devices) {
      if (!driver_used.contains(d)) { driver_used[d] = driver_usage_(d); }
    }
  }
  std::lock_guard lock(mutex_);
  auto snapshot    = stats_.snapshot({.pools        = pools_,
                                      .descriptions = pools_locked(),
                                      .sessions     = sessions_,
                                      .blocks       = packed_,
                                      .buffers      = buffers_},
                                  top_sessions);
  snapshot.restart = restart_;
  for (auto const& [device, used] : driver_used) {
    if (!used) { continue; }
    gpu_memory_use g{.device = device, .driver_used_bytes = *used};
    for (auto const& p : snapshot.pools) {
      if (p.pool.device != device) { continue; }
      g.gpu_uuid = p.pool.gpu_uuid;
      g.ledger_bytes += p.backend_reserved_bytes.value_or(0) + p.shared_bytes;
    }
    g.unaccounted_bytes = *used > g.ledger_bytes ? *used - g.ledger_bytes : 0;
    snapshot.gpu_memory.push_back(std::move(g));
  }
  return snapshot;
}

std::vector<session_info> daemon_core::sessions() const
{
  std::lock_guard lock(mutex_);
  std::vector<session_info> out;
  out.reserve(sessions_.size());
  for (auto const& [id, s] : sessions_) { out.push_back(core_stats::info(*s, packed_)); }
  return out;
}

session_listing daemon_core::top_sessions(std::size_t n) const
{
  std::lock_guard lock(mutex_);
  return core_stats::top(sessions_, packed_, n);
}

std::size_t daemon_core::session_count() const
{
  std::lock_guard lock(mutex_);
  return sessions_.size();
}

void daemon_core::reconfigure(core_reload reload)
{
  std::lock_guard lock(mutex_);
  options_.access = std::move(reload.access);
  options_.quotas = std::move(reload.quotas);
  reclaim_.set_timeout(reload.reclaim_timeout);
  packed_.set_pack_up_to(reload.pack_up_to);
}

void daemon_core::begin_drain()
{
  std::lock_guard lock(mutex_);
  draining_ = true;
  buffers_changed_.notify_all();  // waiting opens answer UNAVAILABLE
  reclaim_.room_changed();        // and requests waiting for idle slabs
}
bool daemon_core::draining() const
{
  std::lock_guard lock(mutex_);
  return draining_ || sessions_closed_;
}

void daemon_core::stop_new_sessions()
{
  std::lock_guard lock(mutex_);
  sessions_closed_ = true;
  buffers_changed_.notify_all();  // waiting opens answer UNAVAILABLE
}

void daemon_core::close_all_sessions() noexcept
{
  std::vector<session_id> ids;
  {
    std::lock_guard lock(mutex_);
    for (auto const& [id, s] : sessions_) { ids.push_back(id); }
  }
  for (auto id : ids) { close_session(id); }
}

}  // namespace rmmd::core
