// daemon_core's leases: allocate (packed or of its own), free, dropped packed
// blocks, and the checks and charges against pools and quotas that every
// request for memory shares.

#include "daemon/core/core_entries.hpp"
#include "daemon/core/daemon_core.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <bit>
#include <utility>

namespace rmmd::core {
namespace {

std::string bytes_text(std::size_t bytes)
{
  return absl::StrFormat("%d bytes", bytes);
}

absl::Status closed_during_call()
{
  return absl::UnauthenticatedError("allocate: the session closed during the call");
}

absl::Status draining_refusal(std::string const& what)
{
  return absl::UnavailableError(
      absl::StrCat(what, ": the daemon is draining for shutdown; no new allocations"));
}

}  // namespace

template <class BackendCall>
auto daemon_core::call_backend_charged(std::unique_lock<std::mutex>& lock,
                                       pool_id pool,
                                       session_entry& s,
                                       std::size_t charge,
                                       BackendCall&& backend_call)
{
  auto& p            = *pools_[pool];
  auto const session = s.id;
  auto const uid     = s.peer.uid;
  auto const tenant  = s.tenant;
  charge_locked(p, &s, uid, tenant, pool, charge, +1);
  lock.unlock();
  auto result = std::forward<BackendCall>(backend_call)();
  lock.lock();
  auto* const now = find_session_locked(session);
  charge_locked(p, now, uid, tenant, pool, charge, -1);
  return std::pair{std::move(result), now};
}

absl::StatusOr<daemon_core::checked_request> daemon_core::check_request_locked(
    std::string_view request, pool_id pool, std::size_t bytes, std::size_t alignment) const
{
  if (pool >= pools_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unknown pool id %d; this daemon serves pool ids 0 to %d (see `rmmctl pools`)",
        request,
        pool,
        static_cast<long long>(pools_.size()) - 1));
  }
  auto& p = *pools_[pool];
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s in pool '%s': size 0 is not allowed; ask for at least 1 byte", request, p.config.name));
  }
  if (bytes > p.capacity) {
    // RMM's resources raise out_of_memory for a request no memory could
    // hold, so rmm::out_of_memory it is (RESOURCE_EXHAUSTED).
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s of %s in pool '%s': larger than the pool's capacity of %s; no request this large can "
        "succeed here",
        request,
        bytes_text(bytes),
        p.config.name,
        bytes_text(p.capacity)));
  }
  if (alignment == 0) { alignment = default_alignment; }
  if (!std::has_single_bit(alignment) || alignment > p.config.max_alignment) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s of %s in pool '%s': alignment %d is not a power of two between 1 and %d",
        request,
        bytes_text(bytes),
        p.config.name,
        alignment,
        p.config.max_alignment));
  }
  return checked_request{.pool = pools_[pool].get(), .alignment = alignment};
}

absl::StatusOr<lease_grant> daemon_core::allocate(session_id session,
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

answer_or_hold<lease_grant> daemon_core::allocate_or_hold(
    session_id session, pool_id pool, std::size_t bytes, std::size_t alignment, bool may_pack)
{
  return allocate_counted({session, pool, bytes, alignment, short_of_room::hold, may_pack});
}

answer_or_hold<lease_grant> daemon_core::allocate_counted(allocation_request const& r)
{
  bool waited = false;
  auto result = allocate_once(r, waited);
  if (waited) {
    std::lock_guard lock(mutex_);
    auto const* answer = std::get_if<absl::StatusOr<lease_grant>>(&result);
    stats_.reclaim_ended(r.pool, answer != nullptr && answer->ok());
  }
  return result;
}

answer_or_hold<lease_grant> daemon_core::allocate_once(allocation_request const& r, bool& waited)
{
  std::unique_lock lock(mutex_);
  if (draining_) { return draining_refusal(absl::StrCat("allocate ", bytes_text(r.bytes))); }
  auto found = session_locked(r.session, "allocate");
  if (!found.ok()) { return found.status(); }
  auto* s      = *found;
  auto checked = check_request_locked("allocate", r.pool, r.bytes, r.alignment);
  if (!checked.ok()) { return checked.status(); }
  auto& p              = *checked->pool;
  auto const alignment = checked->alignment;
  // Small and asked for by a client that imports blocks: carved out of a
  // block of the session's own (no driver call, no driver memory per lease).
  if (r.may_pack && packed_.packs(p.capacity, r.bytes, alignment) &&
      p.tenants.kind() == backend_kind::cuda) {
    if (auto grant = carve_packed_locked(*s, p, r, alignment)) { return *std::move(grant); }
    if (auto made = pack_in_new_block_locked(lock, *s, r, alignment)) { return *std::move(made); }
    // No room for a block: a lease of its own, below (the session may have
    // closed while the backend tried).
    s = find_session_locked(r.session);
    if (s == nullptr) { return closed_during_call(); }
  }
  // What the backend will reserve: quotas and the pool are checked, and
  // charged while the backend works, with that.
  auto const charge = std::max(r.bytes, p.tenants.backend(s->tenant).reserved_size(r.bytes));
  auto const asked =
      charge == r.bytes
          ? bytes_text(r.bytes)
          : absl::StrCat(bytes_text(r.bytes), " (", bytes_text(charge), " once rounded up)");
  auto const what = absl::StrFormat("allocate %s from pool '%s'", asked, p.config.name);
  if (auto ended = wait_for_room_locked(lock, s, r, charge, what, waited)) { return *ended; }
  return lease_from_backend_locked(lock, *s, r, alignment, charge, what, waited);
}

std::optional<answer_or_hold<lease_grant>> daemon_core::wait_for_room_locked(
    std::unique_lock<std::mutex>& lock,
    session_entry*& s,
    allocation_request const& r,
    std::size_t charge,
    std::string const& what,
    bool& waited)
{
  auto& p      = *pools_[r.pool];
  auto refused = refusal_locked(p, *s, charge, what);
  if (!refused) { return std::nullopt; }
  // Short of room that other sessions' idle slabs would make: ask them for
  // those and wait for the room rather than refuse (DESIGN.md, the fast path).
  if (r.when_short == short_of_room::refuse || quota_refusal_locked(*s, charge, what) ||
      !reclaim_could_serve_locked(r.pool, r.session, charge)) {
    return *refused;
  }
  if (r.when_short == short_of_room::hold) { return reclaim_hold{}; }
  stats_.reclaim_waited(r.pool);
  waited = true;
  wait_for_reclaim_locked(lock, r.pool, r.session, charge);
  if (draining_) { return draining_refusal(what); }
  s = find_session_locked(r.session);
  if (s == nullptr) { return closed_during_call(); }
  if (auto still = refusal_locked(p, *s, charge, what)) { return *still; }
  return std::nullopt;
}

answer_or_hold<lease_grant> daemon_core::lease_from_backend_locked(
    std::unique_lock<std::mutex>& lock,
    session_entry& s,
    allocation_request const& r,
    std::size_t alignment,
    std::size_t charge,
    std::string const& what,
    bool& waited)
{
  auto& p = *pools_[r.pool];
  // The backend's work (a CUDA allocation, a stream synchronisation and a
  // pointer export: tens of us) runs without the lock; the session's
  // tenant's backend serves it, and other tenants' backends give back what
  // they keep idle when it is short.
  auto backend          = p.tenants.find(s.tenant)->backend;
  auto const others     = p.tenants.others(s.tenant);
  auto [block, session] = call_backend_charged(lock, r.pool, s, charge, [&] {
    return after_trimming_others(
        others, trim_mutex_, [&] { return backend->allocate(r.bytes, alignment); });
  });
  if (!block.ok()) {
    if (block.status().code() == absl::StatusCode::kResourceExhausted) {
      signal_pressure_locked(p);
      // The ledger had room but the backend found none (a host pool too
      // fragmented for the request): more idle slabs back may make a range.
      // Ask for the request's size once more, then start over, refusing at
      // once if the backend still fails.
      if (r.when_short != short_of_room::refuse && reclaim_.enabled() && !draining_ &&
          reclaim_.reclaimable(sessions_, packed_, r.pool, r.session) > 0) {
        if (r.when_short == short_of_room::hold) { return reclaim_hold{}; }
        if (!waited) { stats_.reclaim_waited(r.pool); }
        waited = true;
        wait_for_reclaim_locked(lock, r.pool, r.session, charge, charge);
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
  if (refusal_locked(p, *session, reserved, what)) {
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
  charge_locked(p, session, session->peer.uid, session->tenant, r.pool, reserved, +1);
  stats_.grew(r.pool, p.in_use);
  stats_.allocated(r.pool);
  ++p.live;
  ++session->count;
  return lease_grant{.id = id, .block = *std::move(block), .bytes = reserved};
}

std::optional<lease_grant> daemon_core::carve_packed_locked(session_entry& s,
                                                            pool_entry& p,
                                                            allocation_request const& r,
                                                            std::size_t alignment)
{
  auto carved = packed_.carve(s.id, r.pool, r.bytes, alignment);
  if (!carved) { return std::nullopt; }
  auto const id = ledger_.record(s.id, carved->range);
  ++p.live;
  stats_.allocated(r.pool);
  ++s.count;
  return lease_grant{.id           = id,
                     .block        = *carved->memory,
                     .packed_block = carved->block,
                     .block_offset = carved->range.offset,
                     .bytes        = carved->range.bytes};
}

std::optional<absl::StatusOr<lease_grant>> daemon_core::pack_in_new_block_locked(
    std::unique_lock<std::mutex>& lock,
    session_entry& s,
    allocation_request const& r,
    std::size_t alignment)
{
  auto& p         = *pools_[r.pool];
  auto const size = packed_.block_size();
  // Without the side effects of a refusal (pressure): the request goes on
  // unpacked when a block does not fit.
  auto fits = [&](session_entry const& owner, std::size_t charge) {
    return !quota_refusal_locked(owner, charge, "a packed block") && charge <= p.room();
  };
  if (!fits(s, size)) { return std::nullopt; }
  auto backend          = p.tenants.find(s.tenant)->backend;  // alive while the lock is let go
  auto [block, session] = call_backend_charged(
      lock, r.pool, s, size, [&] { return backend->allocate(size, default_alignment); });
  if (!block.ok()) {
    if (block.status().code() == absl::StatusCode::kResourceExhausted) {
      // The device is short (not the ledger): slab clients hear it, as they
      // do when a lease of its own fails; the request goes on unpacked.
      signal_pressure_locked(p);
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
  charge_locked(p, session, session->peer.uid, session->tenant, r.pool, reserved, +1);
  stats_.grew(r.pool, p.in_use);
  packed_.add(r.session, r.pool, *std::move(block));
  if (auto grant = carve_packed_locked(*session, p, r, alignment)) { return *grant; }
  return absl::InternalError(
      absl::StrFormat("allocate %s from pool '%s': a new packed block had no room",
                      bytes_text(r.bytes),
                      p.config.name));
}

absl::Status daemon_core::drop_blocks(session_id session, std::span<block_id const> ids)
{
  std::lock_guard lock(mutex_);
  auto found = session_locked(session, "drop blocks");
  if (!found.ok()) { return found.status(); }
  auto& s      = **found;
  auto leaving = packed_.drop(session, ids);
  if (!leaving.ok()) { return leaving.status(); }
  for (auto const& [pool, memory] : *leaving) {
    auto& p = *pools_[pool];
    p.tenants.backend(s.tenant).deallocate(memory);
    charge_locked(p, &s, s.peer.uid, s.tenant, pool, memory.bytes, -1);
  }
  return absl::OkStatus();
}

std::optional<absl::Status> daemon_core::refusal_locked(pool_entry& p,
                                                        session_entry const& s,
                                                        std::size_t charge,
                                                        std::string const& what)
{
  if (auto quota = quota_refusal_locked(s, charge, what)) { return quota; }
  if (charge > p.room()) {
    signal_pressure_locked(p);
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: the pool has %s of %s in use; retry later or use another pool",
                        what,
                        bytes_text(p.in_use),
                        bytes_text(p.capacity)));
  }
  return std::nullopt;
}

std::optional<absl::Status> daemon_core::quota_refusal_locked(session_entry const& s,
                                                              std::size_t charge,
                                                              std::string const& what) const
{
  auto const session_limit = options_.quotas.per_session_bytes;
  auto const session_used  = s.bytes + s.shared_bytes;
  if (session_limit != 0 && charge > session_limit - std::min(session_limit, session_used)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: session %d holds %s of its quota of %s; free memory first or ask the operator for "
        "a larger per-session quota",
        what,
        s.id,
        bytes_text(session_used),
        bytes_text(session_limit)));
  }
  auto const uid_limit = options_.quotas.limit_for_uid(s.peer.uid);
  auto const uid_it    = uid_bytes_.find(s.peer.uid);
  auto const uid_used  = uid_it == uid_bytes_.end() ? std::size_t{0} : uid_it->second;
  if (uid_limit != 0 && charge > uid_limit - std::min(uid_limit, uid_used)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: uid %d holds %s of its quota of %s across its sessions and shared buffers; free "
        "memory first or ask the operator for a larger per-uid quota",
        what,
        s.peer.uid,
        bytes_text(uid_used),
        bytes_text(uid_limit)));
  }
  return std::nullopt;
}

bool daemon_core::reclaim_could_serve_locked(pool_id pool,
                                             session_id requester,
                                             std::size_t charge) const
{
  return !draining_ &&
         reclaim_.could_serve(sessions_, packed_, *pools_[pool], pool, requester, charge);
}

bool daemon_core::wait_for_reclaim_locked(std::unique_lock<std::mutex>& lock,
                                          pool_id pool,
                                          session_id requester,
                                          std::size_t charge,
                                          std::size_t ask_for)
{
  return reclaim_.wait_for_room(
      lock,
      sessions_,
      packed_,
      *pools_[pool],
      {.pool = pool, .requester = requester, .charge = charge, .ask_for = ask_for},
      draining_);
}

void daemon_core::charge_locked(pool_entry& p,
                                session_entry* s,
                                uid_t uid,
                                tenant_key const& tenant,
                                pool_id pool,
                                std::size_t bytes,
                                int sign) noexcept
{
  auto apply = [&](std::size_t& counter) {
    counter = sign > 0 ? counter + bytes : counter - bytes;
  };
  p.count(tenant, bytes, sign);
  if (s != nullptr) {
    apply(s->bytes);
    apply(s->pool_bytes[pool]);
  }
  auto u = uid_bytes_.try_emplace(uid, 0).first;
  apply(u->second);
  if (u->second == 0) { uid_bytes_.erase(u); }
  if (sign < 0) { reclaim_.room_changed(); }
}

absl::Status daemon_core::free(session_id session, allocation_id id)
{
  std::unique_lock lock(mutex_);
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
  auto* const owner = find_session_locked(session);
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
  auto const backend = pools_[freed.pool]->tenants.find(tenant)->backend;
  lock.unlock();
  backend->deallocate(freed.block());
  lock.lock();
  auto& p       = *pools_[freed.pool];
  auto* const s = find_session_locked(session);  // the session may have closed meanwhile
  charge_locked(p, s, uid, tenant, freed.pool, freed.bytes, -1);
  --p.live;
  if (s != nullptr) { --s->count; }
  return absl::OkStatus();
}

void daemon_core::release_lease_locked(session_id session, allocation_id id) noexcept
{
  auto l  = ledger_.erase(session, id);
  auto& p = *pools_[l.pool];
  --p.live;
  auto* const s = find_session_locked(session);
  if (l.packed) {
    if (s == nullptr) { return; }  // its blocks went with it
    --s->count;
    packed_.release(
        session, l, {.waiting = reclaim_.waiting(), .pressure_until = p.pressure_until});
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
  auto u = uid_bytes_.find(s->peer.uid);
  u->second -= l.bytes;
  if (u->second == 0) { uid_bytes_.erase(u); }
  reclaim_.room_changed();
}

void daemon_core::release_all_leases_locked(session_entry& s) noexcept
{
  auto const leases = ledger_.take_all(s.id);
  // Its packed blocks: the client freed its imports before it closed the
  // session, or died with them.
  auto const blocks = packed_.take_all(s.id);
  if (leases.empty() && blocks.empty()) { return; }
  // One batch per pool, so that a backend frees 100,000 leases in one go (the
  // host backend: one range and one hole per run of adjacent blocks) rather
  // than lease by lease under the lock.
  std::vector<std::vector<backend_allocation>> by_pool(pools_.size());
  std::vector<std::size_t> bytes(pools_.size());
  std::vector<std::size_t> count(pools_.size());
  for (auto const& [id, l] : leases) { ++count[l.pool]; }
  for (std::size_t i = 0; i < pools_.size(); ++i) { by_pool[i].reserve(count[i]); }
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
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    if (by_pool[i].empty() && count[i] == 0) { continue; }
    auto& p = *pools_[i];
    p.tenants.backend(s.tenant).deallocate_many(by_pool[i]);
    p.count(s.tenant, bytes[i], -1);
    p.live -= count[i];
    s.pool_bytes[static_cast<pool_id>(i)] -= bytes[i];
    total += bytes[i];
  }
  s.bytes -= total;
  s.count -= leases.size();
  if (auto u = uid_bytes_.find(s.peer.uid); u != uid_bytes_.end()) {
    u->second -= total;
    if (u->second == 0) { uid_bytes_.erase(u); }
  }
}

}  // namespace rmmd::core
