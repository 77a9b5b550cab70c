// lease_allocator: allocate (packed or of its own), free, dropped packed
// blocks, usage reports and pressure.

#include "daemon/core/lease_allocator.hpp"

#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <set>
#include <utility>

namespace rmmd::core {
namespace {

absl::Status closed_during_call()
{
  return absl::UnauthenticatedError("allocate: the session closed during the call");
}

absl::Status draining_refusal(request_text const& what)
{
  return absl::UnavailableError(absl::StrCat(
      std::string(what.str()), ": the daemon is draining for shutdown; no new allocations"));
}

}  // namespace

template <class BackendCall>
auto lease_allocator::call_backend_charged(std::unique_lock<std::mutex>& lock,
                                           pool_id pool,
                                           session_entry& s,
                                           std::size_t charge,
                                           BackendCall&& backend_call)
{
  auto& p            = *state_.pools[pool];
  auto const session = s.id;
  auto const uid     = s.peer.uid;
  auto const tenant  = s.tenant;
  state_.charge_locked(p, &s, uid, tenant, pool, charge, +1);
  lock.unlock();
  auto result = std::forward<BackendCall>(backend_call)();
  lock.lock();
  auto* const now = state_.find_session_locked(session);
  state_.charge_locked(p, now, uid, tenant, pool, charge, -1);
  return std::pair{std::move(result), now};
}

absl::StatusOr<lease_grant> lease_allocator::allocate(session_id session,
                                                      pool_id pool,
                                                      std::size_t bytes,
                                                      std::size_t alignment,
                                                      reclaim_policy policy,
                                                      bool may_pack)
{
  auto const when_short =
      policy == reclaim_policy::refuse ? short_of_room::refuse : short_of_room::wait;
  // Never a hold: only allocate_or_hold() asks for one.
  return std::get<absl::StatusOr<lease_grant>>(
      allocate_counted({session, pool, bytes, alignment, when_short, may_pack}));
}

answer_or_hold<lease_grant> lease_allocator::allocate_or_hold(
    session_id session, pool_id pool, std::size_t bytes, std::size_t alignment, bool may_pack)
{
  return allocate_counted({session, pool, bytes, alignment, short_of_room::hold, may_pack});
}

answer_or_hold<lease_grant> lease_allocator::allocate_counted(allocation_request const& r)
{
  bool waited = false;
  auto result = allocate_once(r, waited);
  if (waited) {
    std::lock_guard lock(state_.mutex);
    auto const* answer = std::get_if<absl::StatusOr<lease_grant>>(&result);
    state_.stats.reclaim_ended(r.pool, answer != nullptr && answer->ok());
  }
  return result;
}

answer_or_hold<lease_grant> lease_allocator::allocate_once(allocation_request const& r,
                                                           bool& waited)
{
  std::unique_lock lock(state_.mutex);
  if (state_.draining) { return draining_refusal(absl::StrCat("allocate ", bytes_text(r.bytes))); }
  auto found = state_.session_locked(r.session, "allocate");
  if (!found.ok()) { return found.status(); }
  auto* s      = *found;
  auto checked = state_.check_request_locked("allocate", r.pool, r.bytes, r.alignment);
  if (!checked.ok()) { return checked.status(); }
  auto& p              = *checked->pool;
  auto const alignment = checked->alignment;
  // Small and asked for by a client that imports blocks: carved out of a
  // block of the session's own (no driver call, no driver memory per lease).
  if (r.may_pack && state_.packed.packs(p.capacity, r.bytes, alignment) &&
      p.tenants.traits().packs_small_leases) {
    if (auto grant = carve_packed_locked(*s, p, r, alignment)) { return *std::move(grant); }
    if (auto made = pack_in_new_block_locked(lock, *s, r, alignment)) { return *std::move(made); }
    // No room for a block: a lease of its own, below (the session may have
    // closed while the backend tried).
    s = state_.find_session_locked(r.session);
    if (s == nullptr) { return closed_during_call(); }
  }
  // What the backend will reserve: quotas and the pool are checked, and
  // charged while the backend works, with that.
  auto const charge = std::max(r.bytes, p.tenants.backend(s->tenant).reserved_size(r.bytes));
  // In words only for a refusal's message (most requests are served).
  auto const describe = [&] {
    auto const asked =
        charge == r.bytes
            ? bytes_text(r.bytes)
            : absl::StrCat(bytes_text(r.bytes), " (", bytes_text(charge), " once rounded up)");
    return absl::StrFormat("allocate %s from pool '%s'", asked, p.config.name);
  };
  request_text const what(describe);
  if (auto ended = wait_for_room_locked(lock, s, r, charge, what, waited)) { return *ended; }
  return lease_from_backend_locked(lock, *s, r, alignment, charge, what, waited);
}

std::optional<answer_or_hold<lease_grant>> lease_allocator::wait_for_room_locked(
    std::unique_lock<std::mutex>& lock,
    session_entry*& s,
    allocation_request const& r,
    std::size_t charge,
    request_text const& what,
    bool& waited)
{
  auto& p      = *state_.pools[r.pool];
  auto refused = state_.refusal_locked(p, *s, charge, what);
  if (!refused) { return std::nullopt; }
  // Short of room that other sessions' idle slabs would make: ask them for
  // those and wait for the room rather than refuse (DESIGN.md, the fast path).
  if (r.when_short == short_of_room::refuse || state_.quota_refusal_locked(*s, charge, what) ||
      !state_.reclaim_could_serve_locked(r.pool, r.session, charge)) {
    return *refused;
  }
  if (r.when_short == short_of_room::hold) { return reclaim_hold{}; }
  state_.stats.reclaim_waited(r.pool);
  waited = true;
  state_.wait_for_reclaim_locked(lock, r.pool, r.session, charge);
  if (state_.draining) { return draining_refusal(what); }
  s = state_.find_session_locked(r.session);
  if (s == nullptr) { return closed_during_call(); }
  if (auto still = state_.refusal_locked(p, *s, charge, what)) { return *still; }
  return std::nullopt;
}

answer_or_hold<lease_grant> lease_allocator::lease_from_backend_locked(
    std::unique_lock<std::mutex>& lock,
    session_entry& s,
    allocation_request const& r,
    std::size_t alignment,
    std::size_t charge,
    request_text const& what,
    bool& waited)
{
  auto& p = *state_.pools[r.pool];
  // The backend's work (a CUDA allocation, a stream synchronisation and a
  // pointer export: tens of us) runs without the lock; the session's
  // tenant's backend serves it, and other tenants' backends give back what
  // they keep idle when it is short.
  auto backend          = p.tenants.find(s.tenant)->backend;
  auto const others     = p.tenants.others(s.tenant);
  auto [block, session] = call_backend_charged(lock, r.pool, s, charge, [&] {
    return after_trimming_others(
        others, state_.trim_mutex, [&] { return backend->allocate(r.bytes, alignment); });
  });
  if (!block.ok()) {
    if (block.status().code() == absl::StatusCode::kResourceExhausted) {
      state_.signal_pressure_locked(p);
      // The ledger had room but the backend found none (a host pool too
      // fragmented for the request): more idle slabs back may make a range.
      // Ask for the request's size once more, then start over, refusing at
      // once if the backend still fails.
      if (r.when_short != short_of_room::refuse && state_.reclaim.enabled() && !state_.draining &&
          state_.reclaim.reclaimable(state_.sessions, state_.packed, r.pool, r.session) > 0) {
        if (r.when_short == short_of_room::hold) { return reclaim_hold{}; }
        if (!waited) { state_.stats.reclaim_waited(r.pool); }
        waited = true;
        state_.wait_for_reclaim_locked(lock, r.pool, r.session, charge, charge);
        lock.unlock();
        auto again        = r;
        again.when_short  = short_of_room::refuse;
        bool again_waited = false;  // it does not: it refuses when short
        return allocate_once(again, again_waited);
      }
    }
    return absl::Status(block.status().code(),
                        absl::StrFormat("allocate %s from pool '%s': %s",
                                        bytes_text(r.bytes),
                                        p.config.name,
                                        block.status().message()));
  }
  if (session == nullptr) {
    backend->deallocate(*block);
    return closed_during_call();
  }
  // The ledger and quotas count what the backend reserved.
  auto const reserved = block->bytes;
  if (state_.refusal_locked(p, *session, reserved, what)) {
    backend->deallocate(*block);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "allocate %s from pool '%s': rounded up to %s by the pool's alignment, it exceeds the "
        "pool limit or a quota; ask for less",
        bytes_text(r.bytes),
        p.config.name,
        bytes_text(reserved)));
  }
  auto id = ledger_.record(
      r.session,
      lease{.pool = r.pool, .bytes = reserved, .offset = block->offset, .address = block->address});
  state_.charge_locked(p, session, session->peer.uid, session->tenant, r.pool, reserved, +1);
  state_.stats.grew(r.pool, p.in_use);
  state_.stats.allocated(r.pool);
  ++p.live;
  ++session->count;
  return lease_grant{.id = id, .block = *std::move(block), .bytes = reserved};
}

std::optional<lease_grant> lease_allocator::carve_packed_locked(session_entry& s,
                                                                pool_entry& p,
                                                                allocation_request const& r,
                                                                std::size_t alignment)
{
  auto carved = state_.packed.carve(s.id, r.pool, r.bytes, alignment);
  if (!carved) { return std::nullopt; }
  auto const id = ledger_.record(s.id, carved->range);
  ++p.live;
  state_.stats.allocated(r.pool);
  ++s.count;
  return lease_grant{.id           = id,
                     .block        = *carved->memory,
                     .packed_block = carved->block,
                     .block_offset = carved->range.offset,
                     .bytes        = carved->range.bytes};
}

std::optional<absl::StatusOr<lease_grant>> lease_allocator::pack_in_new_block_locked(
    std::unique_lock<std::mutex>& lock,
    session_entry& s,
    allocation_request const& r,
    std::size_t alignment)
{
  auto& p         = *state_.pools[r.pool];
  auto const size = state_.packed.block_size();
  // Without the side effects of a refusal (pressure): the request goes on
  // unpacked when a block does not fit.
  auto fits = [&](session_entry const& owner, std::size_t charge) {
    return !state_.quota_refusal_locked(owner, charge, "a packed block") && charge <= p.room();
  };
  if (!fits(s, size)) { return std::nullopt; }
  auto backend          = p.tenants.find(s.tenant)->backend;  // alive while the lock is let go
  auto [block, session] = call_backend_charged(
      lock, r.pool, s, size, [&] { return backend->allocate(size, default_alignment); });
  if (!block.ok()) {
    if (block.status().code() == absl::StatusCode::kResourceExhausted) {
      // The device is short (not the ledger): slab clients hear it, as they
      // do when a lease of its own fails; the request goes on unpacked.
      state_.signal_pressure_locked(p);
      return std::nullopt;
    }
    return absl::Status(block.status().code(),
                        absl::StrFormat("allocate %s from pool '%s' (a packed block of %s): %s",
                                        bytes_text(r.bytes),
                                        p.config.name,
                                        bytes_text(size),
                                        block.status().message()));
  }
  if (session == nullptr) {
    backend->deallocate(*block);
    return closed_during_call();
  }
  auto const reserved = block->bytes;
  if (!fits(*session, reserved)) {
    backend->deallocate(*block);
    return std::nullopt;
  }
  state_.charge_locked(p, session, session->peer.uid, session->tenant, r.pool, reserved, +1);
  state_.stats.grew(r.pool, p.in_use);
  state_.packed.add(r.session, r.pool, *std::move(block));
  if (auto grant = carve_packed_locked(*session, p, r, alignment)) { return *grant; }
  return absl::InternalError(
      absl::StrFormat("allocate %s from pool '%s': a new packed block had no room",
                      bytes_text(r.bytes),
                      p.config.name));
}

absl::Status lease_allocator::drop_blocks(session_id session, std::span<block_id const> ids)
{
  std::lock_guard lock(state_.mutex);
  auto found = state_.session_locked(session, "drop blocks");
  if (!found.ok()) { return found.status(); }
  auto& s      = **found;
  auto leaving = state_.packed.drop(session, ids);
  if (!leaving.ok()) { return leaving.status(); }
  for (auto const& [pool, memory] : *leaving) {
    auto& p = *state_.pools[pool];
    p.tenants.backend(s.tenant).deallocate(memory);
    state_.charge_locked(p, &s, s.peer.uid, s.tenant, pool, memory.bytes, -1);
  }
  return absl::OkStatus();
}

absl::Status lease_allocator::free(session_id session, allocation_id id)
{
  std::unique_lock lock(state_.mutex);
  auto const* l = ledger_.find(session, id);
  if (l == nullptr) {
    if (ledger_.owner_of(id)) {
      return absl::PermissionDeniedError(
          absl::StrFormat("free allocation %d: it is held by another session; a session can free "
                          "only what it holds",
                          id));
    }
    return absl::NotFoundError(absl::StrFormat(
        "free allocation %d: no such allocation (never allocated, or already freed)", id));
  }
  if (l->packed) {
    release_lease_locked(session, id);  // no backend call: its block stays
    return absl::OkStatus();
  }
  auto* const owner = state_.find_session_locked(session);
  if (owner == nullptr) {  // not while the lease is found: close_session frees both
    release_lease_locked(session, id);
    return absl::OkStatus();
  }
  // The backend's free (CUDA: cudaFreeAsync, which waits for the driver's
  // lock while another thread's export holds it) runs without the core's
  // lock, as allocate()'s backend work does, so that the other calls go on
  // meanwhile. The lease leaves the ledger first (nobody else can free it
  // now), and its bytes stay charged until the backend has them back: no
  // allocation counts on memory the backend does not have yet.
  auto const uid     = owner->peer.uid;
  auto const tenant  = owner->tenant;
  auto const freed   = ledger_.erase(session, id);
  auto const backend = state_.pools[freed.pool]->tenants.find(tenant)->backend;
  lock.unlock();
  backend->deallocate(freed.block());
  lock.lock();
  auto& p       = *state_.pools[freed.pool];
  auto* const s = state_.find_session_locked(session);  // the session may have closed meanwhile
  state_.charge_locked(p, s, uid, tenant, freed.pool, freed.bytes, -1);
  --p.live;
  if (s != nullptr) { --s->count; }
  return absl::OkStatus();
}

void lease_allocator::release_lease_locked(session_id session, allocation_id id) noexcept
{
  auto l  = ledger_.erase(session, id);
  auto& p = *state_.pools[l.pool];
  --p.live;
  auto* const s = state_.find_session_locked(session);
  if (l.packed) {
    if (s == nullptr) { return; }  // its blocks went with it
    --s->count;
    state_.packed.release(
        session, l, {.waiting = state_.reclaim.waiting(), .pressure_until = p.pressure_until});
    return;
  }
  // A lease outlives its session never (close_session frees them first):
  // the session says whose backend it came from.
  if (s == nullptr) { return; }
  p.tenants.backend(s->tenant).deallocate(l.block());
  p.count(s->tenant, l.bytes, -1);
  s->bytes -= l.bytes;
  s->pool_bytes[l.pool] -= l.bytes;
  --s->count;
  auto u = state_.uid_bytes.find(s->peer.uid);
  u->second -= l.bytes;
  if (u->second == 0) { state_.uid_bytes.erase(u); }
  state_.reclaim.room_changed();
}

void lease_allocator::release_all_leases_locked(session_entry& s) noexcept
{
  auto const leases = ledger_.take_all(s.id);
  // Its packed blocks: the client freed its imports before it closed the
  // session, or died with them.
  auto const blocks = state_.packed.take_all(s.id);
  if (leases.empty() && blocks.empty()) { return; }
  // One batch per pool, so that a backend frees 100,000 leases in one go (the
  // host backend: one range and one hole per run of adjacent blocks) rather
  // than lease by lease under the lock.
  std::vector<std::vector<backend_allocation>> by_pool(state_.pools.size());
  std::vector<std::size_t> bytes(state_.pools.size());
  std::vector<std::size_t> count(state_.pools.size());
  for (auto const& [id, l] : leases) { ++count[l.pool]; }
  for (std::size_t i = 0; i < state_.pools.size(); ++i) { by_pool[i].reserve(count[i]); }
  for (auto const& [id, l] : leases) {
    if (l.packed) { continue; }  // its block goes below
    by_pool[l.pool].push_back(l.block());
    bytes[l.pool] += l.bytes;
  }
  for (auto const& [pool, memory] : blocks) {
    by_pool[pool].push_back(memory);
    bytes[pool] += memory.bytes;
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < state_.pools.size(); ++i) {
    if (by_pool[i].empty() && count[i] == 0) { continue; }
    auto& p = *state_.pools[i];
    p.tenants.backend(s.tenant).deallocate_many(by_pool[i]);
    p.count(s.tenant, bytes[i], -1);
    p.live -= count[i];
    s.pool_bytes[static_cast<pool_id>(i)] -= bytes[i];
    total += bytes[i];
  }
  s.bytes -= total;
  s.count -= leases.size();
  if (auto u = state_.uid_bytes.find(s.peer.uid); u != state_.uid_bytes.end()) {
    u->second -= total;
    if (u->second == 0) { state_.uid_bytes.erase(u); }
  }
}

void lease_allocator::set_reclaim_notifier(reclaim_notifier notify)
{
  std::lock_guard lock(state_.mutex);
  state_.reclaim.set_notifier(std::move(notify));
}

void lease_allocator::set_retire_notifier(retire_notifier notify)
{
  std::lock_guard lock(state_.mutex);
  state_.packed.set_retire_notifier(std::move(notify));
}

absl::StatusOr<std::vector<pool_id>> lease_allocator::report_usage(
    session_id session, std::vector<carved_usage> const& usage)
{
  std::lock_guard lock(state_.mutex);
  auto found = state_.session_locked(session, "report usage");
  if (!found.ok()) { return found.status(); }
  auto& s = **found;
  std::set<pool_id> seen;
  for (auto const& u : usage) {
    if (u.pool >= state_.pools.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("report usage: unknown pool id %d; this daemon serves pool ids 0 to %d",
                          u.pool,
                          static_cast<long long>(state_.pools.size()) - 1));
    }
    if (!seen.insert(u.pool).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("report usage: pool '%s' appears twice; report each pool once",
                          state_.pools[u.pool]->config.name));
    }
    auto const held  = s.held_in(u.pool);
    auto const& name = state_.pools[u.pool]->config.name;
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
  for (std::size_t i = 0; i < state_.pools.size(); ++i) {
    if (state_.pools[i]->pressure_until > now) { trim.push_back(static_cast<pool_id>(i)); }
  }
  return trim;
}

void lease_allocator::signal_pressure(pool_id pool)
{
  std::lock_guard lock(state_.mutex);
  if (pool < state_.pools.size()) { state_.signal_pressure_locked(*state_.pools[pool]); }
}

}  // namespace rmmd::core
