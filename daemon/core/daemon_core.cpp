#include "daemon/core/daemon_core.hpp"

#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <malloc.h>
#include <sys/random.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
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

/// Leases a closing session must have held for close_session() to give the
/// heap back to the kernel (malloc_trim costs about a millisecond).
constexpr std::size_t big_session_leases = 10000;

std::string bytes_text(std::size_t bytes)
{
  return absl::StrFormat("%d bytes", bytes);
}

constexpr char const* held_message = "held: waiting for idle slabs to come back";

}  // namespace

absl::Status held_for_reclaim()
{
  return absl::AbortedError(held_message);
}

bool is_held_for_reclaim(absl::Status const& status)
{
  return status.code() == absl::StatusCode::kAborted && status.message() == held_message;
}

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

std::string to_hex(session_token const& token)
{
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(token.size() * 2);
  for (auto b : token) {
    auto v = std::to_integer<unsigned>(b);
    out.push_back(digits[v >> 4]);
    out.push_back(digits[v & 0xf]);
  }
  return out;
}

daemon_core::daemon_core(core_options options)
    : options_(std::move(options)),
      fence_reaper_([this](std::stop_token stop) { run_fence_reaper(std::move(stop)); })
{
  options_.pack_up_to = std::min(options_.pack_up_to, options_.pack_block_size);
}

daemon_core::~daemon_core()
{
  close_all_sessions();
  // Persistent buffers stay until deleted or the daemon stops: it stops.
  std::lock_guard lock(mutex_);
  for (auto& [id, b] : buffers_) {
    if (!b->creating) { pools_[b->pool]->backend->deallocate_shared(b->block); }
  }
  buffers_.clear();
  buffer_names_.clear();
}

void daemon_core::set_reclaim_notifier(reclaim_notifier notify)
{
  std::lock_guard lock(mutex_);
  reclaim_notify_ = std::move(notify);
}

void daemon_core::set_retire_notifier(retire_notifier notify)
{
  std::lock_guard lock(mutex_);
  retire_notify_ = std::move(notify);
}

pool_id daemon_core::add_pool(pool_config config, std::unique_ptr<pool_backend> backend)
{
  std::lock_guard lock(mutex_);
  auto entry      = std::make_unique<pool_entry>();
  entry->capacity = backend->capacity();
  if (config.limit_bytes != 0) { entry->capacity = std::min(entry->capacity, config.limit_bytes); }
  entry->config  = std::move(config);
  entry->backend = std::move(backend);
  pools_.push_back(std::move(entry));
  return static_cast<pool_id>(pools_.size() - 1);
}

std::vector<pool_description> daemon_core::pools() const
{
  std::lock_guard lock(mutex_);
  std::vector<pool_description> out;
  out.reserve(pools_.size());
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    auto const& p = *pools_[i];
    out.push_back(pool_description{.id             = static_cast<pool_id>(i),
                                   .name           = p.config.name,
                                   .device         = p.config.device,
                                   .gpu_uuid       = p.config.gpu_uuid,
                                   .pci_bus_id     = p.config.pci_bus_id,
                                   .backend        = p.backend->kind(),
                                   .handle_types   = p.config.handle_types,
                                   .capacity_bytes = p.capacity,
                                   .shareable_fd   = p.backend->shareable_fd(),
                                   .fabric_handle  = p.backend->fabric_handle(),
                                   .max_alignment  = p.config.max_alignment,
                                   .pinnable       = p.config.pinnable});
  }
  return out;
}

absl::StatusOr<session_grant> daemon_core::open_session(peer_credentials peer,
                                                        std::string command,
                                                        std::string client_name)
{
  std::lock_guard lock(mutex_);
  if (draining_ || sessions_closed_) {
    return absl::UnavailableError(
        "open session: the daemon is draining for shutdown; retry once it has restarted");
  }
  if (!options_.access.allows(peer)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "open session: uid %d gid %d (pid %d) is not allowed to use this daemon; ask the operator "
        "to add the uid or one of its groups to the allowed ids",
        peer.uid,
        peer.gid,
        peer.pid));
  }
  auto token         = random_token();
  auto entry         = std::make_unique<session_entry>();
  entry->id          = next_session_++;
  entry->token_hex   = to_hex(token);
  entry->peer        = std::move(peer);
  entry->command     = std::move(command);
  entry->client_name = std::move(client_name);
  entry->started     = std::chrono::system_clock::now();
  auto const id      = entry->id;
  by_token_.emplace(entry->token_hex, id);
  sessions_.emplace(id, std::move(entry));
  return session_grant{.id = id, .token = token};
}

void daemon_core::close_session(session_id id) noexcept
{
  std::size_t leases = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) { return; }
    // Its fences are dropped unpassed: either the client waited for its streams
    // before closing (the client library does), or it died, and its imports
    // died with it.
    std::erase_if(fenced_, [id](auto const& entry) { return entry.second.session == id; });
    leases = ledger_.held_count(id);
    release_all_leases_locked(*it->second);
    release_buffers_of_locked(*it->second);
    for (auto& pool : pools_) { pool->backend->forget_session(id); }
    by_token_.erase(it->second->token_hex);
    sessions_.erase(it);
    room_changed_locked();  // its leases are back, and its idle slabs gone from the count
  }
  // A session that held many leases leaves megabytes of freed tables and
  // batches in the heap, which glibc keeps (measured: 50 MiB kept after a
  // million leases went): give them back to the kernel, without the lock.
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

absl::StatusOr<lease_grant> daemon_core::allocate(session_id session,
                                                  pool_id pool,
                                                  std::size_t bytes,
                                                  std::size_t alignment,
                                                  reclaim_policy policy,
                                                  bool may_pack)
{
  bool waited = false;
  auto result = allocate_once(session, pool, bytes, alignment, policy, may_pack, waited);
  if (waited) {
    std::lock_guard lock(mutex_);
    auto& p = *pools_[pool];
    ++(result.ok() ? p.reclaim_served : p.reclaim_refused);
  }
  return result;
}

absl::StatusOr<lease_grant> daemon_core::allocate_once(session_id session,
                                                       pool_id pool,
                                                       std::size_t bytes,
                                                       std::size_t alignment,
                                                       reclaim_policy policy,
                                                       bool may_pack,
                                                       bool& waited)
{
  std::unique_lock lock(mutex_);
  if (draining_) {
    return absl::UnavailableError(
        absl::StrCat("allocate ",
                     bytes_text(bytes),
                     ": the daemon is draining for shutdown; no new allocations"));
  }
  auto s_it = sessions_.find(session);
  if (s_it == sessions_.end()) {
    return absl::UnauthenticatedError("allocate: the session is closed; open a new session");
  }
  auto* s = s_it->second.get();
  if (pool >= pools_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "allocate %s: unknown pool id %d; this daemon serves pool ids 0 to %d (see `rmmctl stats`)",
        bytes_text(bytes),
        pool,
        static_cast<long long>(pools_.size()) - 1));
  }
  auto& p = *pools_[pool];
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "allocate from pool '%s': size 0 is not allowed; ask for at least 1 byte", p.config.name));
  }
  if (bytes > p.capacity) {
    // RMM's resources raise out_of_memory for a request no memory could
    // hold, so rmm::out_of_memory it is (RESOURCE_EXHAUSTED).
    return absl::ResourceExhaustedError(absl::StrFormat(
        "allocate %s from pool '%s': larger than the pool's capacity of %s; no allocation this "
        "large can succeed here",
        bytes_text(bytes),
        p.config.name,
        bytes_text(p.capacity)));
  }
  if (alignment == 0) { alignment = default_alignment; }
  if (!std::has_single_bit(alignment) || alignment > p.config.max_alignment) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "allocate %s from pool '%s': alignment %d is not a power of two between 1 and %d",
        bytes_text(bytes),
        p.config.name,
        alignment,
        p.config.max_alignment));
  }
  // Small and asked for by a client that imports blocks: carved out of a
  // block of the session's own (no driver call, no driver memory per lease).
  if (may_pack && options_.pack_up_to > 0 && bytes <= options_.pack_up_to &&
      alignment <= default_alignment && p.backend->kind() == backend_kind::cuda &&
      options_.pack_block_size <= p.capacity) {
    if (auto grant = carve_packed_locked(*s, p, pool, bytes, alignment)) {
      return *std::move(grant);
    }
    if (auto made = pack_in_new_block_locked(lock, session, pool, bytes, alignment)) {
      return *std::move(made);
    }
    // No room for a block: a lease of its own, below (the session may have
    // closed while the backend tried).
    s_it = sessions_.find(session);
    if (s_it == sessions_.end()) {
      return absl::UnauthenticatedError("allocate: the session closed during the call");
    }
    s = s_it->second.get();
  }
  // What the backend will reserve: quotas and the pool are checked, and
  // charged while the backend works, with that.
  auto const charge = std::max(bytes, p.backend->reserved_size(bytes));
  auto const asked =
      charge == bytes
          ? bytes_text(bytes)
          : absl::StrCat(bytes_text(bytes), " (", bytes_text(charge), " once rounded up)");
  auto const what = absl::StrFormat("allocate %s from pool '%s'", asked, p.config.name);
  auto refused    = refusal_locked(p, *s, charge, what);
  // Leases freed with an event count until the reaper sees the event: before
  // refusing for want of room, reap what has passed and look again. (Not on
  // every request: that would poll every pending event under the lock.)
  if (refused && !fenced_.empty()) {
    reap_fences_locked();
    refused = refusal_locked(p, *s, charge, what);
  }
  // Short of room that other sessions' idle slabs would make: ask them for
  // those and wait for the room rather than refuse (DESIGN.md, the fast path).
  if (refused && policy != reclaim_policy::refuse && !quota_refusal_locked(*s, charge, what) &&
      reclaim_could_serve_locked(p, pool, session, charge)) {
    if (policy == reclaim_policy::hand_off) { return held_for_reclaim(); }
    ++p.reclaim_waits;
    waited = true;
    wait_for_reclaim_locked(lock, pool, session, charge);
    if (draining_) {
      return absl::UnavailableError(
          absl::StrCat(what, ": the daemon is draining for shutdown; no new allocations"));
    }
    s_it = sessions_.find(session);
    if (s_it == sessions_.end()) {
      return absl::UnauthenticatedError("allocate: the session closed during the call");
    }
    s       = s_it->second.get();
    refused = refusal_locked(p, *s, charge, what);
  }
  if (refused) { return *refused; }

  // The backend's work (a CUDA allocation, a stream synchronisation and a
  // pointer export: tens of us) runs without the lock, so that the calls of
  // other sessions go on meanwhile. The bytes asked for are counted first, so
  // that concurrent requests cannot together overrun a quota or the pool.
  auto const uid = s->peer.uid;
  charge_locked(p, s, uid, pool, charge, +1);
  lock.unlock();
  auto block = p.backend->allocate(bytes, alignment);
  lock.lock();

  // The session may have closed meanwhile (its leases are gone, not this
  // charge), and the backend may have rounded up or failed.
  auto const it   = sessions_.find(session);
  auto* const now = it == sessions_.end() ? nullptr : it->second.get();
  charge_locked(p, now, uid, pool, charge, -1);
  if (!block.ok()) {
    if (block.status().code() == absl::StatusCode::kResourceExhausted) {
      signal_pressure_locked(p);
      // The ledger had room but the backend found none (a host pool too
      // fragmented for the request): more idle slabs back may make a range.
      // Ask for the request's size once more, then start over, refusing at
      // once if the backend still fails.
      if (policy != reclaim_policy::refuse && options_.reclaim_timeout.count() > 0 &&
          reclaim_notify_ && !draining_ && reclaimable_locked(pool, session) > 0) {
        if (policy == reclaim_policy::hand_off) { return held_for_reclaim(); }
        if (!waited) { ++p.reclaim_waits; }
        waited = true;
        wait_for_reclaim_locked(lock, pool, session, charge, charge);
        lock.unlock();
        bool again_waited = false;  // it does not: it refuses when short
        return allocate_once(
            session, pool, bytes, alignment, reclaim_policy::refuse, may_pack, again_waited);
      }
    }
    return absl::Status(block.status().code(),
                        absl::StrFormat("allocate %s from pool '%s': %s",
                                        bytes_text(bytes),
                                        p.config.name,
                                        block.status().message()));
  }
  if (now == nullptr) {
    p.backend->deallocate(*block);
    return absl::UnauthenticatedError("allocate: the session closed during the call");
  }
  // The ledger and quotas count what the backend reserved.
  auto const reserved = block->bytes;
  if (refusal_locked(p, *now, reserved, what)) {
    p.backend->deallocate(*block);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "allocate %s from pool '%s': rounded up to %s by the pool's alignment, it exceeds the "
        "pool limit or a quota; ask for less",
        bytes_text(bytes),
        p.config.name,
        bytes_text(reserved)));
  }
  auto id = ledger_.record(
      session,
      lease{.pool = pool, .bytes = reserved, .offset = block->offset, .address = block->address});
  charge_locked(p, now, uid, pool, reserved, +1);
  p.high_water = std::max(p.high_water, p.in_use);
  ++p.live;
  ++p.total;
  ++now->count;
  return lease_grant{.id = id, .block = *std::move(block), .bytes = reserved};
}

std::optional<lease_grant> daemon_core::carve_packed_locked(
    session_entry& s, pool_entry& p, pool_id pool, std::size_t bytes, std::size_t alignment)
{
  auto const blocks = s.packed.find(pool);
  if (blocks == s.packed.end()) { return std::nullopt; }
  for (auto& [base, b] : blocks->second) {
    if (b.retired || b.ranges.free_bytes() < bytes) { continue; }
    auto const range = b.ranges.allocate(bytes, alignment);
    if (!range) { continue; }
    ++b.leases;
    b.lease_bytes += range->size;
    auto const id =
        ledger_.record(s.id,
                       lease{.pool    = pool,
                             .packed  = true,
                             .bytes   = range->size,
                             .offset  = range->offset,
                             .address = static_cast<std::byte*>(b.memory.address) + range->offset});
    ++p.live;
    ++p.total;
    ++s.count;
    return lease_grant{.id           = id,
                       .block        = b.memory,
                       .packed_block = b.id,
                       .block_offset = range->offset,
                       .bytes        = range->size};
  }
  return std::nullopt;
}

std::optional<absl::StatusOr<lease_grant>> daemon_core::pack_in_new_block_locked(
    std::unique_lock<std::mutex>& lock,
    session_id session,
    pool_id pool,
    std::size_t bytes,
    std::size_t alignment)
{
  auto& p         = *pools_[pool];
  auto* s         = sessions_.at(session).get();
  auto const size = options_.pack_block_size;
  // Without the side effects of a refusal (pressure): the request goes on
  // unpacked when a block does not fit.
  auto fits = [&](session_entry const& owner, std::size_t charge) {
    return !quota_refusal_locked(owner, charge, "a packed block") &&
           charge <= p.capacity - std::min(p.capacity, p.in_use);
  };
  if (!fits(*s, size)) { return std::nullopt; }
  auto const uid = s->peer.uid;
  charge_locked(p, s, uid, pool, size, +1);
  lock.unlock();
  auto block = p.backend->allocate(size, default_alignment);
  lock.lock();
  auto const it   = sessions_.find(session);
  auto* const now = it == sessions_.end() ? nullptr : it->second.get();
  charge_locked(p, now, uid, pool, size, -1);
  if (!block.ok()) {
    if (block.status().code() == absl::StatusCode::kResourceExhausted) {
      // The device is short (not the ledger): slab clients hear it, as they
      // do when a lease of its own fails; the request goes on unpacked.
      signal_pressure_locked(p);
      return std::nullopt;
    }
    return absl::Status(block.status().code(),
                        absl::StrFormat("allocate %s from pool '%s' (a packed block of %s): %s",
                                        bytes_text(bytes),
                                        p.config.name,
                                        bytes_text(size),
                                        block.status().message()));
  }
  if (now == nullptr) {
    p.backend->deallocate(*block);
    return absl::UnauthenticatedError("allocate: the session closed during the call");
  }
  auto const reserved = block->bytes;
  if (!fits(*now, reserved)) {
    p.backend->deallocate(*block);
    return std::nullopt;
  }
  charge_locked(p, now, uid, pool, reserved, +1);
  p.high_water             = std::max(p.high_water, p.in_use);
  auto const base          = reinterpret_cast<std::uintptr_t>(block->address);
  auto const id            = next_block_++;
  auto& blocks             = now->packed[pool];
  auto const [slot, added] = blocks.try_emplace(
      base,
      packed_block{.id     = id,
                   .memory = *std::move(block),
                   .ranges = backends::host::offset_allocator(reserved, default_alignment)});
  static_cast<void>(slot);
  static_cast<void>(added);  // a live block's address is never handed out twice
  if (packed_blocks_++ == 0) { fences_waiting_.notify_one(); }  // the reaper starts sweeping
  if (auto grant = carve_packed_locked(*now, p, pool, bytes, alignment)) { return *grant; }
  return absl::InternalError(
      absl::StrFormat("allocate %s from pool '%s': a new packed block had no room",
                      bytes_text(bytes),
                      p.config.name));
}

void daemon_core::unpack_locked(session_id session, lease const& l) noexcept
{
  auto& p = *pools_[l.pool];
  --p.live;
  auto const s = sessions_.find(session);
  if (s == sessions_.end()) { return; }  // its blocks went with it
  auto& owner = *s->second;
  --owner.count;
  auto const blocks = owner.packed.find(l.pool);
  if (blocks == owner.packed.end()) { return; }
  auto it = blocks->second.upper_bound(reinterpret_cast<std::uintptr_t>(l.address));
  if (it == blocks->second.begin()) { return; }
  auto& b = std::prev(it)->second;
  b.ranges.release({.offset = l.offset, .size = l.bytes});
  --b.leases;
  b.lease_bytes -= l.bytes;
  if (b.leases != 0 || b.retired || !retire_notify_) { return; }
  b.empty_since = std::chrono::steady_clock::now();
  // One empty block per pool stays for the session's next allocations (a
  // session that allocates and frees one at a time would otherwise lease a
  // block each time); more go back, and every one when room is wanted.
  auto const wanted = reclaim_waiters_ > 0 || p.pressure_until > std::chrono::steady_clock::now();
  auto const another_empty =
      std::any_of(blocks->second.begin(), blocks->second.end(), [&](auto const& entry) {
        return &entry.second != &b && !entry.second.retired && entry.second.leases == 0;
      });
  if (wanted || another_empty) { retire_locked(owner, l.pool, {b.id}); }
}

void daemon_core::retire_locked(session_entry& s,
                                pool_id pool,
                                std::vector<block_id> const& blocks) noexcept
{
  if (blocks.empty() || !retire_notify_) { return; }
  std::size_t asked = 0;
  try {
    asked = std::min(retire_notify_(s.id, pool, blocks), blocks.size());
  } catch (std::exception const&) {
    // Out of memory: none was asked for.
  }
  // Only the blocks the session was asked for are retired: the others stay
  // its own (and reclaimable), to be asked for again by the idle reaper or
  // the next request short of room.
  auto const first = blocks.begin();
  auto const last  = first + static_cast<std::ptrdiff_t>(asked);
  for (auto& [base, b] : s.packed[pool]) {
    if (std::find(first, last, b.id) != last) { b.retired = true; }
  }
}

void daemon_core::retire_idle_blocks_locked() noexcept
{
  auto const now = std::chrono::steady_clock::now();
  for (auto& [id, s] : sessions_) {
    for (auto& [pool, blocks] : s->packed) {
      std::vector<block_id> idle;
      for (auto const& [base, b] : blocks) {
        if (!b.retired && b.leases == 0 && now - b.empty_since >= options_.pack_idle) {
          idle.push_back(b.id);
        }
      }
      retire_locked(*s, pool, idle);
    }
  }
}

std::size_t daemon_core::retire_for_room_locked(pool_id pool,
                                                session_id requester,
                                                std::size_t wanted,
                                                std::vector<retired_block>& retired)
{
  if (!retire_notify_) { return 0; }
  std::size_t asked = 0;
  for (auto& [id, s] : sessions_) {
    if (asked >= wanted) { break; }
    if (id == requester) { continue; }
    auto blocks = s->packed.find(pool);
    if (blocks == s->packed.end()) { continue; }
    std::vector<block_id> empty;
    std::size_t would_ask = asked;
    for (auto const& [base, b] : blocks->second) {
      if (would_ask >= wanted) { break; }
      if (b.retired || b.leases != 0) { continue; }
      empty.push_back(b.id);
      would_ask += b.memory.bytes;
    }
    // Only what the session was asked for counts: a block whose RetireBlocks
    // could not be sent stays its own (and unretired).
    retire_locked(*s, pool, empty);
    for (auto const& [base, b] : blocks->second) {
      if (b.retired && std::find(empty.begin(), empty.end(), b.id) != empty.end()) {
        retired.push_back({.session = id, .base = base, .id = b.id});
        asked += b.memory.bytes;
      }
    }
  }
  return asked;
}

absl::Status daemon_core::drop_blocks(session_id session, std::span<block_id const> ids)
{
  std::lock_guard lock(mutex_);
  auto s_it = sessions_.find(session);
  if (s_it == sessions_.end()) {
    return absl::UnauthenticatedError("drop blocks: the session is closed; open a new session");
  }
  auto& s = *s_it->second;
  struct found {
    pool_id pool;
    std::uintptr_t base;
  };
  // One pass over the session's blocks, then a lookup per id: a call names
  // up to a datagram's worth of ids, all under the core's lock.
  std::unordered_map<block_id, found> held;
  for (auto const& [pool, blocks] : s.packed) {
    for (auto const& [base, b] : blocks) { held.emplace(b.id, found{pool, base}); }
  }
  std::vector<found> dropping;
  for (auto id : ids) {
    std::optional<found> at;
    if (auto h = held.find(id); h != held.end()) { at = h->second; }
    if (!at) {
      return absl::NotFoundError(absl::StrFormat(
          "drop packed block %d: this session holds no such block (never leased, or dropped "
          "already)",
          id));
    }
    if (!s.packed[at->pool].at(at->base).retired) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "drop packed block %d: the daemon has not retired it (it may still hold leases); drop "
          "only the blocks a RetireBlocks names",
          id));
    }
    dropping.push_back(*at);
  }
  for (auto const& [pool, base] : dropping) {
    auto& blocks = s.packed[pool];
    auto it      = blocks.find(base);
    if (it == blocks.end()) { continue; }  // named twice
    auto& p          = *pools_[pool];
    auto const bytes = it->second.memory.bytes;
    p.backend->deallocate(it->second.memory);
    blocks.erase(it);
    --packed_blocks_;
    charge_locked(p, &s, s.peer.uid, pool, bytes, -1);
  }
  return absl::OkStatus();
}

std::optional<absl::Status> daemon_core::refusal_locked(pool_entry& p,
                                                        session_entry const& s,
                                                        std::size_t charge,
                                                        std::string const& what)
{
  if (auto quota = quota_refusal_locked(s, charge, what)) { return quota; }
  if (charge > p.capacity - std::min(p.capacity, p.in_use)) {
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

namespace {

/// A session's report for one pool, held against what it holds there now
/// (it may have given slabs back since it last reported).
struct idle_slabs {
  std::size_t idle{};
  std::size_t reclaimable{};
};

idle_slabs idle_of(carved_usage const& c, std::size_t held)
{
  auto const slabs  = std::min(c.slab_bytes, held);
  auto const carved = std::min(c.bytes, slabs);
  auto const idle   = slabs - carved;
  return {.idle = idle, .reclaimable = std::min(c.reclaimable_bytes, idle)};
}

}  // namespace

std::size_t daemon_core::reclaimable_locked(pool_id pool, session_id requester) const
{
  std::size_t total = 0;
  for (auto const& [id, s] : sessions_) {
    if (id == requester) { continue; }
    if (auto blocks = s->packed.find(pool); retire_notify_ && blocks != s->packed.end()) {
      for (auto const& [base, b] : blocks->second) {
        if (b.leases == 0 && !b.retired) { total += b.memory.bytes; }
      }
    }
    auto c = s->carved.find(pool);
    if (c == s->carved.end() || c->second.reclaimable_bytes == 0) { continue; }
    auto const held = s->pool_bytes.contains(pool) ? s->pool_bytes.at(pool) : 0;
    total += idle_of(c->second, held).reclaimable;
  }
  return total;
}

bool daemon_core::reclaim_could_serve_locked(pool_entry const& p,
                                             pool_id pool,
                                             session_id requester,
                                             std::size_t charge) const
{
  if (options_.reclaim_timeout.count() <= 0 || !reclaim_notify_ || draining_) { return false; }
  auto const room = p.capacity - std::min(p.capacity, p.in_use);
  if (charge <= room) { return false; }  // not short of room
  return reclaimable_locked(pool, requester) >= charge - room;
}

bool daemon_core::wait_for_reclaim_locked(std::unique_lock<std::mutex>& lock,
                                          pool_id pool,
                                          session_id requester,
                                          std::size_t charge,
                                          std::size_t ask_for)
{
  auto& p            = *pools_[pool];
  auto const room    = p.capacity - std::min(p.capacity, p.in_use);
  auto const lacking = ask_for > 0 ? ask_for : charge - std::min(charge, room);
  // Only as many sessions as the room needs, those with the most first: the
  // others keep their slabs (and their fast path) for their next allocation.
  struct holder {
    std::size_t reclaimable;
    session_id id;
    std::size_t held;  // in the pool, now
  };
  std::vector<holder> holders;
  for (auto const& [id, s] : sessions_) {
    if (id == requester) { continue; }
    auto c = s->carved.find(pool);
    if (c == s->carved.end() || c->second.reclaimable_bytes == 0) { continue; }
    auto const held = s->pool_bytes.contains(pool) ? s->pool_bytes.at(pool) : 0;
    if (auto r = idle_of(c->second, held).reclaimable; r > 0) { holders.push_back({r, id, held}); }
  }
  std::sort(holders.begin(), holders.end(), [](holder const& a, holder const& b) {
    return a.reclaimable != b.reclaimable ? a.reclaimable > b.reclaimable : a.id < b.id;
  });
  std::vector<holder> asked;
  // Empty packed blocks first: they cost their sessions nothing.
  std::vector<retired_block> retired;
  std::size_t promised = retire_for_room_locked(pool, requester, lacking, retired);
  for (auto const& h : holders) {
    if (promised >= lacking) { break; }
    asked.push_back(h);
    promised += h.reclaimable;
  }
  auto const deadline = std::chrono::steady_clock::now() + options_.reclaim_timeout;
  ++reclaim_waiters_;
  auto notify = reclaim_notify_;
  lock.unlock();
  for (auto const& h : asked) { notify(h.id, pool, lacking); }
  lock.lock();
  auto has_room = [&] {
    if (ask_for > 0) {
      // The ledger had room: wait until each session asked gave back what it
      // reported (or ended), and each block asked back was dropped.
      auto const dropped = [&](retired_block const& r) {
        auto s = sessions_.find(r.session);
        if (s == sessions_.end()) { return true; }
        auto blocks = s->second->packed.find(pool);
        if (blocks == s->second->packed.end()) { return true; }
        auto b = blocks->second.find(r.base);
        return b == blocks->second.end() || b->second.id != r.id;
      };
      return std::all_of(retired.begin(), retired.end(), dropped) &&
             std::all_of(asked.begin(), asked.end(), [&](holder const& h) {
               auto s = sessions_.find(h.id);
               if (s == sessions_.end()) { return true; }
               auto const now =
                   s->second->pool_bytes.contains(pool) ? s->second->pool_bytes.at(pool) : 0;
               return now + h.reclaimable <= h.held;
             });
    }
    return charge <= p.capacity - std::min(p.capacity, p.in_use);
  };
  // Not "until the reports say nothing idle is left": a session reports
  // after it sent its Frees, but the report (gRPC) may be handled before the
  // Frees (the session socket) are.
  room_changed_.wait_until(
      lock, deadline, [&] { return has_room() || draining_ || !sessions_.contains(requester); });
  --reclaim_waiters_;
  return has_room();
}

void daemon_core::room_changed_locked() noexcept
{
  if (reclaim_waiters_ > 0) { room_changed_.notify_all(); }
}

void daemon_core::charge_locked(
    pool_entry& p, session_entry* s, uid_t uid, pool_id pool, std::size_t bytes, int sign) noexcept
{
  auto apply = [&](std::size_t& counter) {
    counter = sign > 0 ? counter + bytes : counter - bytes;
  };
  apply(p.in_use);
  if (s != nullptr) {
    apply(s->bytes);
    apply(s->pool_bytes[pool]);
  }
  auto u = uid_bytes_.try_emplace(uid, 0).first;
  apply(u->second);
  if (u->second == 0) { uid_bytes_.erase(u); }
  if (sign < 0) { room_changed_locked(); }
}

absl::Status daemon_core::free(session_id session,
                               allocation_id id,
                               std::span<std::byte const> release_fence)
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
  if (fenced_.contains(id)) {
    return absl::NotFoundError(absl::StrFormat(
        "free allocation %d: already freed (the daemon releases it once the client's stream "
        "passes the event given with that free)",
        id));
  }
  if (release_fence.empty() && l->packed) {
    release_lease_locked(session, id);  // no backend call: its block stays
    return absl::OkStatus();
  }
  if (release_fence.empty()) {
    // The backend's free (CUDA: cudaFreeAsync, which waits for the driver's
    // lock while another thread's export holds it) runs without the core's
    // lock, as allocate()'s backend work does, so that the other calls go on
    // meanwhile. The lease leaves the ledger first (nobody else can free it
    // now), and its bytes stay charged until the backend has them back: no
    // allocation counts on memory the backend does not have yet.
    auto const owner = sessions_.find(session);
    if (owner == sessions_.end()) {  // not while the lease is found: close_session frees both
      release_lease_locked(session, id);
      return absl::OkStatus();
    }
    auto const uid      = owner->second->peer.uid;
    auto const freed    = ledger_.erase(session, id);
    auto* const backend = pools_[freed.pool]->backend.get();
    lock.unlock();
    backend->deallocate(freed.block());
    lock.lock();
    auto& p        = *pools_[freed.pool];
    auto const now = sessions_.find(session);  // the session may have closed meanwhile
    auto* const s  = now == sessions_.end() ? nullptr : now->second.get();
    charge_locked(p, s, uid, freed.pool, freed.bytes, -1);
    --p.live;
    if (s != nullptr) { --s->count; }
    return absl::OkStatus();
  }
  auto& p    = *pools_[l->pool];
  auto fence = p.backend->open_fence(session, release_fence);
  if (!fence.ok()) {
    return absl::Status(
        fence.status().code(),
        absl::StrFormat(
            "free allocation %d of pool '%s': %s", id, p.config.name, fence.status().message()));
  }
  if ((*fence)->passed()) {
    release_lease_locked(session, id);
    return absl::OkStatus();
  }
  fenced_.emplace(id, fenced_release{.session = session, .fence = *std::move(fence)});
  fences_waiting_.notify_one();
  return absl::OkStatus();
}

std::size_t daemon_core::reap_fences()
{
  std::lock_guard lock(mutex_);
  return reap_fences_locked();
}

std::size_t daemon_core::reap_fences_locked() noexcept
{
  for (auto it = fenced_.begin(); it != fenced_.end();) {
    if (it->second.fence->passed()) {
      auto const id      = it->first;
      auto const session = it->second.session;
      it                 = fenced_.erase(it);
      release_lease_locked(session, id);
    } else {
      ++it;
    }
  }
  return fenced_.size();
}

// Polls the fences while any wait: a fence is a CUDA event in another process,
// which offers no way to be woken when it completes. It never puts a wait on a
// GPU stream either: an event whose process died never completes, and a stream
// waiting on it would hang (measured, docs/protocol.md). Polls start at 50 us
// and back off to 2 ms while nothing passes.
void daemon_core::run_fence_reaper(std::stop_token stop)
{
  using namespace std::chrono_literals;
  constexpr auto fastest = std::chrono::microseconds(50);
  constexpr auto slowest = std::chrono::microseconds(2000);
  auto interval          = fastest;
  // It also sweeps, while sessions hold packed blocks, for empty ones that
  // stayed longer than options.pack_idle (a few times per pack_idle).
  auto const sweep_period = std::max<std::chrono::steady_clock::duration>(
      std::chrono::milliseconds(1), options_.pack_idle / 4);
  auto next_sweep = std::chrono::steady_clock::now() + sweep_period;
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    if (packed_blocks_ > 0 && std::chrono::steady_clock::now() >= next_sweep) {
      retire_idle_blocks_locked();
      next_sweep = std::chrono::steady_clock::now() + sweep_period;
    }
    if (fenced_.empty()) {
      interval = fastest;
      if (packed_blocks_ == 0) {
        fences_waiting_.wait(lock, stop, [this] { return !fenced_.empty() || packed_blocks_ > 0; });
        next_sweep = std::chrono::steady_clock::now() + sweep_period;
      } else {
        fences_waiting_.wait_until(lock, stop, next_sweep, [this] { return !fenced_.empty(); });
      }
      continue;
    }
    fences_waiting_.wait_for(lock, stop, interval, [] { return false; });
    // Poll without the lock (a CUDA event query each, microseconds apiece
    // with many clients), so that calls go on meanwhile.
    std::vector<std::pair<allocation_id, std::shared_ptr<release_fence>>> polling;
    polling.reserve(fenced_.size());
    for (auto const& [id, f] : fenced_) { polling.emplace_back(id, f.fence); }
    lock.unlock();
    std::vector<allocation_id> passed;
    for (auto const& [id, fence] : polling) {
      if (fence->passed()) { passed.push_back(id); }
    }
    polling.clear();  // the last owner of a dropped fence destroys it here, unlocked
    lock.lock();
    std::size_t released = 0;
    for (auto id : passed) {
      // Gone meanwhile if its session closed (which released the lease).
      auto f = fenced_.find(id);
      if (f == fenced_.end()) { continue; }
      auto const session = f->second.session;
      fenced_.erase(f);
      release_lease_locked(session, id);
      ++released;
    }
    interval = released > 0 ? fastest : std::min(interval * 2, slowest);
  }
}

void daemon_core::release_lease_locked(session_id session, allocation_id id) noexcept
{
  auto l = ledger_.erase(session, id);
  if (l.packed) {
    unpack_locked(session, l);
    return;
  }
  auto& p    = *pools_[l.pool];
  auto bytes = l.bytes;
  p.backend->deallocate(l.block());
  p.in_use -= bytes;
  --p.live;
  if (auto s = sessions_.find(session); s != sessions_.end()) {
    s->second->bytes -= bytes;
    s->second->pool_bytes[l.pool] -= bytes;
    --s->second->count;
    auto u = uid_bytes_.find(s->second->peer.uid);
    u->second -= bytes;
    if (u->second == 0) { uid_bytes_.erase(u); }
  }
  room_changed_locked();
}

void daemon_core::release_all_leases_locked(session_entry& s) noexcept
{
  auto const leases = ledger_.take_all(s.id);
  if (leases.empty() && s.packed.empty()) { return; }
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
  // Its packed blocks: the client freed its imports before it closed the
  // session, or died with them.
  for (auto& [pool, blocks] : s.packed) {
    packed_blocks_ -= blocks.size();
    for (auto& [base, b] : blocks) {
      by_pool[pool].push_back(
          backend_allocation{.bytes = b.memory.bytes, .address = b.memory.address});
      bytes[pool] += b.memory.bytes;
    }
  }
  s.packed.clear();
  std::size_t total = 0;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    if (by_pool[i].empty() && count[i] == 0) { continue; }
    auto& p = *pools_[i];
    p.backend->deallocate_many(by_pool[i]);
    p.in_use -= bytes[i];
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

session_info daemon_core::info_locked(session_entry const& s) const
{
  session_info info{.id               = s.id,
                    .peer             = s.peer,
                    .command          = s.command,
                    .client_name      = s.client_name,
                    .bytes            = s.bytes,
                    .allocation_count = s.count,
                    .started          = s.started,
                    .shared_bytes     = s.shared_bytes,
                    .buffers_held     = s.holds.size()};
  for (auto const& [pool, c] : s.carved) {
    info.carved_bytes += c.bytes;
    info.carved_allocations += c.allocation_count;
    auto const idle = idle_of(c, s.pool_bytes.contains(pool) ? s.pool_bytes.at(pool) : 0);
    info.idle_bytes += idle.idle;
    info.reclaimable_bytes += idle.reclaimable;
  }
  for (auto const& [pool, blocks] : s.packed) {
    for (auto const& [base, b] : blocks) {
      info.idle_bytes += b.memory.bytes - b.lease_bytes;
      if (b.leases == 0 && !b.retired) { info.reclaimable_bytes += b.memory.bytes; }
    }
  }
  return info;
}

absl::StatusOr<std::vector<pool_id>> daemon_core::report_usage(
    session_id session, std::vector<carved_usage> const& usage)
{
  std::lock_guard lock(mutex_);
  auto s_it = sessions_.find(session);
  if (s_it == sessions_.end()) {
    return absl::UnauthenticatedError("report usage: the session is closed; open a new session");
  }
  auto& s = *s_it->second;
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
    auto const held  = s.pool_bytes.contains(u.pool) ? s.pool_bytes.at(u.pool) : 0;
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
    pool_backend* backend;  // pools are never removed: stable without the lock
  };
  std::vector<target> targets;
  {
    std::lock_guard lock(mutex_);
    auto s_it = sessions_.find(session);
    if (s_it == sessions_.end()) {
      return absl::UnauthenticatedError("trim: the session is closed; open a new session");
    }
    auto const uid = s_it->second->peer.uid;
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
      for (auto& [sid, s] : sessions_) {
        auto blocks = s->packed.find(id);
        if (blocks == s->packed.end()) { continue; }
        std::vector<block_id> empty;
        for (auto const& [base, b] : blocks->second) {
          if (!b.retired && b.leases == 0) { empty.push_back(b.id); }
        }
        retire_locked(*s, id, empty);
      }
      targets.push_back(target{.id = id, .name = p.config.name, .backend = p.backend.get()});
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
    auto before = t.backend->usage();
    auto freed  = t.backend->trim();
    if (!freed.ok()) {
      return absl::Status(freed.status().code(),
                          absl::StrFormat("trim pool '%s': %s", t.name, freed.status().message()));
    }
    auto after = t.backend->usage();
    out.push_back(pool_trim{
        .pool                    = t.id,
        .name                    = t.name,
        .released_bytes          = *freed,
        .backend_reserved_before = before ? std::optional(before->reserved_bytes) : std::nullopt,
        .backend_reserved_after  = after ? std::optional(after->reserved_bytes) : std::nullopt});
  }
  return out;
}

stats_snapshot daemon_core::stats(std::optional<std::size_t> top_sessions) const
{
  auto descriptions = pools();
  std::lock_guard lock(mutex_);
  stats_snapshot out;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    auto const& p = *pools_[i];
    auto usage    = p.backend->usage();
    auto release  = p.backend->release_threshold();
    out.pools.push_back(pool_stats{
        .pool                   = std::move(descriptions[i]),
        .in_use_bytes           = p.in_use,
        .high_water_bytes       = p.high_water,
        .allocation_count       = p.live,
        .total_allocations      = p.total,
        .backend_reserved_bytes = usage ? std::optional(usage->reserved_bytes) : std::nullopt,
        .backend_used_bytes     = usage ? std::optional(usage->used_bytes) : std::nullopt,
        .release_threshold_bytes =
            release ? std::optional<std::uint64_t>(*release) : std::nullopt});
    out.pools.back().reclaim_waits   = p.reclaim_waits;
    out.pools.back().reclaim_served  = p.reclaim_served;
    out.pools.back().reclaim_refused = p.reclaim_refused;
  }
  for (auto const& [id, s] : sessions_) {
    for (auto const& [pool, c] : s->carved) {
      auto const held = s->pool_bytes.contains(pool) ? s->pool_bytes.at(pool) : 0;
      out.pools[pool].carved_bytes += std::min(c.bytes, held);
      out.pools[pool].carved_allocations += c.allocation_count;
      auto const idle = idle_of(c, held);
      out.pools[pool].idle_bytes += idle.idle;
      out.pools[pool].reclaimable_bytes += idle.reclaimable;
    }
    for (auto const& [pool, blocks] : s->packed) {
      for (auto const& [base, b] : blocks) {
        out.pools[pool].idle_bytes += b.memory.bytes - b.lease_bytes;
        if (b.leases == 0 && !b.retired) { out.pools[pool].reclaimable_bytes += b.memory.bytes; }
      }
    }
  }
  for (auto const& [id, b] : buffers_) {
    if (b->creating) { continue; }
    out.uid_shared_bytes[b->creator_uid] += b->charge;
    auto& ps = out.pools[b->pool];
    ++ps.shared_buffers;
    ps.shared_bytes += b->charge;
    ps.shared_holders += b->holders.size();
  }
  out.session_count = sessions_.size();
  if (top_sessions) {
    auto listing             = top_sessions_locked(*top_sessions);
    out.sessions             = std::move(listing.sessions);
    out.unlisted_bytes       = listing.unlisted_bytes;
    out.unlisted_allocations = listing.unlisted_allocations;
  } else {
    out.sessions.reserve(sessions_.size());
    for (auto const& [id, s] : sessions_) { out.sessions.push_back(info_locked(*s)); }
  }
  return out;
}

std::vector<session_info> daemon_core::sessions() const
{
  std::lock_guard lock(mutex_);
  std::vector<session_info> out;
  out.reserve(sessions_.size());
  for (auto const& [id, s] : sessions_) { out.push_back(info_locked(*s)); }
  return out;
}

session_listing daemon_core::top_sessions(std::size_t n) const
{
  std::lock_guard lock(mutex_);
  return top_sessions_locked(n);
}

session_listing daemon_core::top_sessions_locked(std::size_t n) const
{
  // Order the entries, and copy out (strings and all) only those shown.
  std::vector<session_entry const*> order;
  order.reserve(sessions_.size());
  for (auto const& [id, s] : sessions_) { order.push_back(s.get()); }
  auto const shown = std::min(n, order.size());
  auto const first = order.begin() + static_cast<std::ptrdiff_t>(shown);
  std::partial_sort(
      order.begin(), first, order.end(), [](session_entry const* a, session_entry const* b) {
        return std::tuple(b->bytes, b->count, a->id) < std::tuple(a->bytes, a->count, b->id);
      });
  session_listing out{.session_count = sessions_.size()};
  out.sessions.reserve(shown);
  for (auto it = order.begin(); it != first; ++it) { out.sessions.push_back(info_locked(**it)); }
  for (auto it = first; it != order.end(); ++it) {
    out.unlisted_bytes += (*it)->bytes;
    out.unlisted_allocations += (*it)->count;
  }
  return out;
}

std::size_t daemon_core::session_count() const
{
  std::lock_guard lock(mutex_);
  return sessions_.size();
}

void daemon_core::reconfigure(access_policy access, quota_limits quotas)
{
  std::lock_guard lock(mutex_);
  options_.access = std::move(access);
  options_.quotas = std::move(quotas);
}

void daemon_core::reconfigure(core_reload reload)
{
  std::lock_guard lock(mutex_);
  options_.access          = std::move(reload.access);
  options_.quotas          = std::move(reload.quotas);
  options_.reclaim_timeout = reload.reclaim_timeout;
  options_.pack_up_to      = std::min(reload.pack_up_to, options_.pack_block_size);
}

void daemon_core::begin_drain()
{
  std::lock_guard lock(mutex_);
  draining_ = true;
  buffers_changed_.notify_all();  // waiting opens answer UNAVAILABLE
  room_changed_.notify_all();     // and requests waiting for idle slabs
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
