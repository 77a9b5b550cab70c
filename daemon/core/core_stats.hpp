#pragma once

// Statistics: what pools and sessions show in stats, rmmctl and /metrics.
//
// Owns: each pool's history, which nothing but the statistics reads: its
// high-water mark, the allocations made, and the requests that waited for
// reclaim and how they ended. Builds the snapshots (stats, session listings)
// from that and the core's state, which it reads and never changes.
//
// Lock discipline: guarded by the core's mutex. REQUIRES: every member is
// called with it held.

#include "daemon/core/core_entries.hpp"
#include "daemon/core/packed_blocks.hpp"
#include "daemon/core/types.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace rmmd::core {

class core_stats {
 public:
  /// The core's state a snapshot reads.
  struct sources {
    std::vector<std::unique_ptr<pool_entry>> const& pools;
    std::vector<pool_description> descriptions;  ///< one per pool, by id
    session_map const& sessions;
    packed_blocks const& blocks;
    std::map<buffer_id, std::unique_ptr<buffer_entry>> const& buffers;
    std::map<stable_id, std::unique_ptr<stable_entry>> const& stables;
  };

  /// A pool was added (ids count up from 0).
  void add_pool()
  {
    pools_.emplace_back();
  }

  /// `pool` lent something more: it now has `in_use` bytes in use.
  void grew(pool_id pool, std::size_t in_use) noexcept
  {
    auto& h      = pools_[pool];
    h.high_water = std::max(h.high_water, in_use);
  }
  /// An allocation was made in `pool`.
  void allocated(pool_id pool) noexcept
  {
    ++pools_[pool].total;
  }
  void reclaim_waited(pool_id pool) noexcept
  {
    ++pools_[pool].reclaim_waits;
  }
  void reclaim_ended(pool_id pool, bool served) noexcept
  {
    ++(served ? pools_[pool].reclaim_served : pools_[pool].reclaim_refused);
  }

  // Write leases (docs/failover.md): what they did since the start.
  void lease_granted() noexcept
  {
    ++leases_.grants;
  }
  void lease_waited() noexcept
  {
    ++leases_.waits;
  }
  void lease_wait_timed_out() noexcept
  {
    ++leases_.wait_timeouts;
  }
  /// A waiter got the lease `took` after its holder's end.
  void lease_taken_over(std::chrono::steady_clock::duration took) noexcept;
  /// The counters and the takeover histogram (`held` and `waiters` are 0:
  /// the buffers' state says those).
  [[nodiscard]] lease_totals const& leases() const noexcept
  {
    return leases_;
  }

  /// Pools and sessions; with `top_sessions`, only that many sessions (see
  /// top()), otherwise every session, by id.
  [[nodiscard]] stats_snapshot snapshot(sources in, std::optional<std::size_t> top_sessions) const;

  /// What `s` holds and reports.
  [[nodiscard]] static session_info info(session_entry const& s, packed_blocks const& blocks);

  /// At most `n` sessions: those holding the most bytes first, then the most
  /// allocations, then the oldest; and what the others hold together.
  [[nodiscard]] static session_listing top(session_map const& sessions,
                                           packed_blocks const& blocks,
                                           std::size_t n);

 private:
  struct pool_history {
    std::size_t high_water{};
    std::uint64_t total{};
    std::uint64_t reclaim_waits{};  // see pool_stats
    std::uint64_t reclaim_served{};
    std::uint64_t reclaim_refused{};
  };
  std::vector<pool_history> pools_;  // index == pool id
  lease_totals leases_;
};

}  // namespace rmmd::core
