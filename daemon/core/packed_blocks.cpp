#include "daemon/core/packed_blocks.hpp"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <unordered_map>

namespace rmmd::core {

packed_blocks::packed_blocks(std::mutex& core_mutex,
                             std::size_t pack_up_to,
                             std::size_t block_size,
                             std::chrono::milliseconds idle)
    : mutex_(core_mutex),
      pack_up_to_(std::min(pack_up_to, block_size)),
      block_size_(block_size),
      idle_(idle),
      idle_sweeper_([this](std::stop_token stop) { sweep_idle_blocks(std::move(stop)); })
{
}

packed_blocks::~packed_blocks()
{
  idle_sweeper_.request_stop();
  if (idle_sweeper_.joinable()) { idle_sweeper_.join(); }
}

void packed_blocks::set_retire_notifier(retire_notifier notify)
{
  retire_notify_ = std::move(notify);
}

void packed_blocks::set_pack_up_to(std::size_t bytes) noexcept
{
  pack_up_to_ = std::min(bytes, block_size_);
}

std::optional<packed_blocks::carving> packed_blocks::carve(session_id session,
                                                           pool_id pool,
                                                           std::size_t bytes,
                                                           std::size_t alignment)
{
  auto const mine = by_session_.find(session);
  if (mine == by_session_.end()) { return std::nullopt; }
  auto const blocks = mine->second.find(pool);
  if (blocks == mine->second.end()) { return std::nullopt; }
  for (auto& [base, b] : blocks->second) {
    if (b.retired || b.ranges.free_bytes() < bytes) { continue; }
    auto const range = b.ranges.allocate(bytes, alignment);
    if (!range) { continue; }
    ++b.leases;
    b.lease_bytes += range->size;
    return carving{
        .block  = b.id,
        .memory = &b.memory,
        .range  = lease{.pool    = pool,
                        .packed  = true,
                        .bytes   = range->size,
                        .offset  = range->offset,
                        .address = static_cast<std::byte*>(b.memory.address) + range->offset}};
  }
  return std::nullopt;
}

void packed_blocks::add(session_id session, pool_id pool, backend_allocation memory)
{
  auto const base  = reinterpret_cast<std::uintptr_t>(memory.address);
  auto const bytes = memory.bytes;
  // A live block's address is never handed out twice.
  by_session_[session][pool].try_emplace(
      base,
      block{.id     = next_block_++,
            .memory = std::move(memory),
            .ranges = offset_allocator(bytes, default_alignment)});
  if (count_++ == 0) { blocks_exist_.notify_one(); }  // the sweeper starts sweeping
}

void packed_blocks::release(session_id session, lease const& range, room_signal room) noexcept
{
  auto const mine = by_session_.find(session);
  if (mine == by_session_.end()) { return; }  // its blocks went with it
  auto const blocks = mine->second.find(range.pool);
  if (blocks == mine->second.end()) { return; }
  auto it = blocks->second.upper_bound(reinterpret_cast<std::uintptr_t>(range.address));
  if (it == blocks->second.begin()) { return; }
  auto& b = std::prev(it)->second;
  b.ranges.release({.offset = range.offset, .size = range.bytes});
  --b.leases;
  b.lease_bytes -= range.bytes;
  if (b.leases != 0 || b.retired || !retire_notify_) { return; }
  b.empty_since = std::chrono::steady_clock::now();
  // One empty block per pool stays for the session's next allocations (a
  // session that allocates and frees one at a time would otherwise lease a
  // block each time); more go back, and every one when room is wanted.
  auto const another_empty =
      std::any_of(blocks->second.begin(), blocks->second.end(), [&](auto const& entry) {
        return &entry.second != &b && !entry.second.retired && entry.second.leases == 0;
      });
  auto const room_wanted = room.waiting || room.pressure_until > std::chrono::steady_clock::now();
  if (room_wanted || another_empty) { retire(session, range.pool, {b.id}); }
}

absl::StatusOr<std::vector<packed_blocks::leaving>> packed_blocks::drop(
    session_id session, std::span<block_id const> ids)
{
  auto& mine = by_session_[session];
  struct found {
    pool_id pool;
    std::uintptr_t base;
  };
  // One pass over the session's blocks, then a lookup per id: a call names
  // up to a datagram's worth of ids, all under the core's lock.
  std::unordered_map<block_id, found> held;
  for (auto const& [pool, blocks] : mine) {
    for (auto const& [base, b] : blocks) { held.emplace(b.id, found{pool, base}); }
  }
  std::vector<found> dropping;
  for (auto id : ids) {
    auto const h = held.find(id);
    if (h == held.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "drop packed block %d: this session holds no such block (never leased, or dropped "
          "already)",
          id));
    }
    if (!mine[h->second.pool].at(h->second.base).retired) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "drop packed block %d: the daemon has not retired it (it may still hold leases); drop "
          "only the blocks a RetireBlocks names",
          id));
    }
    dropping.push_back(h->second);
  }
  std::vector<leaving> out;
  out.reserve(dropping.size());
  for (auto const& [pool, base] : dropping) {
    auto& blocks = mine[pool];
    auto it      = blocks.find(base);
    if (it == blocks.end()) { continue; }  // named twice
    out.push_back(leaving{.pool = pool, .memory = std::move(it->second.memory)});
    blocks.erase(it);
    --count_;
  }
  return out;
}

std::vector<packed_blocks::leaving> packed_blocks::take_all(session_id session)
{
  std::vector<leaving> out;
  auto mine = by_session_.find(session);
  if (mine == by_session_.end()) { return out; }
  for (auto& [pool, blocks] : mine->second) {
    count_ -= blocks.size();
    for (auto& [base, b] : blocks) {
      out.push_back(leaving{
          .pool   = pool,
          .memory = backend_allocation{.bytes = b.memory.bytes, .address = b.memory.address}});
    }
  }
  by_session_.erase(mine);
  return out;
}

void packed_blocks::retire(session_id session,
                           pool_id pool,
                           std::vector<block_id> const& ids) noexcept
{
  if (ids.empty() || !retire_notify_) { return; }
  std::size_t asked = 0;
  try {
    asked = std::min(retire_notify_(session, pool, ids), ids.size());
  } catch (std::exception const&) {
    // Out of memory: none was asked for.
  }
  // Only the blocks the session was asked for are retired: the others stay
  // its own (and reclaimable), to be asked for again by the sweeper or the
  // next request short of room.
  auto const first = ids.begin();
  auto const last  = first + static_cast<std::ptrdiff_t>(asked);
  for (auto& [base, b] : by_session_[session][pool]) {
    if (std::find(first, last, b.id) != last) { b.retired = true; }
  }
}

void packed_blocks::retire_empty(pool_id pool) noexcept
{
  for (auto& [session, mine] : by_session_) {
    auto blocks = mine.find(pool);
    if (blocks == mine.end()) { continue; }
    std::vector<block_id> empty;
    for (auto const& [base, b] : blocks->second) {
      if (!b.retired && b.leases == 0) { empty.push_back(b.id); }
    }
    retire(session, pool, empty);
  }
}

void packed_blocks::retire_idle() noexcept
{
  auto const now = std::chrono::steady_clock::now();
  for (auto& [session, mine] : by_session_) {
    for (auto& [pool, blocks] : mine) {
      std::vector<block_id> idle;
      for (auto const& [base, b] : blocks) {
        if (!b.retired && b.leases == 0 && now - b.empty_since >= idle_) { idle.push_back(b.id); }
      }
      retire(session, pool, idle);
    }
  }
}

std::size_t packed_blocks::retire_for_room(pool_id pool,
                                           session_id requester,
                                           std::size_t wanted,
                                           std::vector<retired_block>& retired)
{
  if (!retire_notify_) { return 0; }
  std::size_t asked = 0;
  for (auto& [session, mine] : by_session_) {
    if (asked >= wanted) { break; }
    if (session == requester) { continue; }
    auto blocks = mine.find(pool);
    if (blocks == mine.end()) { continue; }
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
    retire(session, pool, empty);
    for (auto const& [base, b] : blocks->second) {
      if (b.retired && std::find(empty.begin(), empty.end(), b.id) != empty.end()) {
        retired.push_back({.session = session, .base = base, .id = b.id});
        asked += b.memory.bytes;
      }
    }
  }
  return asked;
}

bool packed_blocks::gone(pool_id pool, retired_block const& r) const
{
  auto mine = by_session_.find(r.session);
  if (mine == by_session_.end()) { return true; }
  auto blocks = mine->second.find(pool);
  if (blocks == mine->second.end()) { return true; }
  auto b = blocks->second.find(r.base);
  return b == blocks->second.end() || b->second.id != r.id;
}

std::size_t packed_blocks::reclaimable(pool_id pool, session_id requester) const
{
  if (!retire_notify_) { return 0; }
  std::size_t total = 0;
  for (auto const& [session, mine] : by_session_) {
    if (session == requester) { continue; }
    auto blocks = mine.find(pool);
    if (blocks == mine.end()) { continue; }
    for (auto const& [base, b] : blocks->second) {
      if (b.leases == 0 && !b.retired) { total += b.memory.bytes; }
    }
  }
  return total;
}

std::map<pool_id, idle_slabs> packed_blocks::idle(session_id session) const
{
  std::map<pool_id, idle_slabs> out;
  auto mine = by_session_.find(session);
  if (mine == by_session_.end()) { return out; }
  for (auto const& [pool, blocks] : mine->second) {
    auto& slot = out[pool];
    for (auto const& [base, b] : blocks) {
      slot.idle += b.memory.bytes - b.lease_bytes;
      if (b.leases == 0 && !b.retired) { slot.reclaimable += b.memory.bytes; }
    }
  }
  return out;
}

// Sweeps a few times per pack_idle while any block exists, and sleeps
// otherwise.
void packed_blocks::sweep_idle_blocks(std::stop_token stop)
{
  auto const period =
      std::max<std::chrono::steady_clock::duration>(std::chrono::milliseconds(1), idle_ / 4);
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    if (count_ == 0) {
      blocks_exist_.wait(lock, stop, [this] { return count_ > 0; });
      continue;
    }
    auto const next = std::chrono::steady_clock::now() + period;
    blocks_exist_.wait_until(lock, stop, next, [] { return false; });
    if (stop.stop_requested()) { break; }
    retire_idle();
  }
}

}  // namespace rmmd::core
