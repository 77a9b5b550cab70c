#include "daemon/core/reclaim_coordinator.hpp"

#include <algorithm>
#include <vector>

namespace rmmd::core {

std::size_t reclaim_coordinator::reclaimable(session_map const& sessions,
                                             packed_blocks const& blocks,
                                             pool_id pool,
                                             session_id requester) const
{
  std::size_t total = blocks.reclaimable(pool, requester);
  for (auto const& [id, s] : sessions) {
    if (id == requester) { continue; }
    auto c = s->carved.find(pool);
    if (c == s->carved.end() || c->second.reclaimable_bytes == 0) { continue; }
    total += idle_of(c->second, s->held_in(pool)).reclaimable;
  }
  return total;
}

bool reclaim_coordinator::could_serve(session_map const& sessions,
                                      packed_blocks const& blocks,
                                      pool_entry const& p,
                                      pool_id pool,
                                      session_id requester,
                                      std::size_t charge) const
{
  if (!enabled()) { return false; }
  auto const room = p.room();
  if (charge <= room) { return false; }  // not short of room
  return reclaimable(sessions, blocks, pool, requester) >= charge - room;
}

bool reclaim_coordinator::wait_for_room(std::unique_lock<std::mutex>& lock,
                                        session_map const& sessions,
                                        packed_blocks& blocks,
                                        pool_entry const& p,
                                        wait_request const& request,
                                        bool const& draining)
{
  auto const pool = request.pool;
  auto const lacking =
      request.ask_for > 0 ? request.ask_for : request.charge - std::min(request.charge, p.room());
  // Only as many sessions as the room needs, those with the most first: the
  // others keep their slabs (and their fast path) for their next allocation.
  struct holder {
    std::size_t reclaimable;
    session_id id;
    std::size_t held;  // in the pool, now
  };
  std::vector<holder> holders;
  for (auto const& [id, s] : sessions) {
    if (id == request.requester) { continue; }
    auto c = s->carved.find(pool);
    if (c == s->carved.end() || c->second.reclaimable_bytes == 0) { continue; }
    auto const held = s->held_in(pool);
    if (auto r = idle_of(c->second, held).reclaimable; r > 0) { holders.push_back({r, id, held}); }
  }
  std::sort(holders.begin(), holders.end(), [](holder const& a, holder const& b) {
    return a.reclaimable != b.reclaimable ? a.reclaimable > b.reclaimable : a.id < b.id;
  });
  std::vector<holder> asked;
  // Empty packed blocks first: they cost their sessions nothing.
  std::vector<packed_blocks::retired_block> retired;
  std::size_t promised = blocks.retire_for_room(pool, request.requester, lacking, retired);
  for (auto const& h : holders) {
    if (promised >= lacking) { break; }
    asked.push_back(h);
    promised += h.reclaimable;
  }
  auto const deadline = std::chrono::steady_clock::now() + timeout_;
  ++waiters_;
  auto notify = notify_;
  lock.unlock();
  for (auto const& h : asked) { notify(h.id, pool, lacking); }
  lock.lock();
  auto has_room = [&] {
    if (request.ask_for > 0) {
      // The ledger had room: wait until each session asked gave back what it
      // reported (or ended), and each block asked back was dropped.
      return std::all_of(retired.begin(),
                         retired.end(),
                         [&](auto const& r) { return blocks.gone(pool, r); }) &&
             std::all_of(asked.begin(), asked.end(), [&](holder const& h) {
               auto s = sessions.find(h.id);
               return s == sessions.end() || s->second->held_in(pool) + h.reclaimable <= h.held;
             });
    }
    return request.charge <= p.room();
  };
  // Not "until the reports say nothing idle is left": a session reports
  // after it sent its Frees, but the report (gRPC) may be handled before the
  // Frees (the session socket) are.
  room_changed_.wait_until(lock, deadline, [&] {
    return has_room() || draining || !sessions.contains(request.requester);
  });
  --waiters_;
  return has_room();
}

}  // namespace rmmd::core
