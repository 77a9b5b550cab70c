#pragma once

#include "daemon/core/pool_backend.hpp"
#include "daemon/core/types.hpp"

#include <chrono>
#include <cstddef>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rmmd::core {

/// One allocation lent to one session.
struct lease {
  allocation_id id{};
  session_id owner{};
  pool_id pool{};
  std::size_t requested_bytes{};
  backend_allocation block{};
  std::chrono::steady_clock::time_point created{};
};

/// Every live lease, by id and by owning session. Not thread-safe.
class lease_ledger {
 public:
  /// Records `l` under a fresh id and returns that id.
  allocation_id record(lease l);

  /// The lease with this id, or nullptr.
  [[nodiscard]] lease const* find(allocation_id id) const;

  /// Removes and returns the lease. REQUIRES: find(id) != nullptr.
  lease erase(allocation_id id);

  /// Ids of every lease `owner` holds.
  [[nodiscard]] std::vector<allocation_id> held_by(session_id owner) const;

  [[nodiscard]] std::size_t size() const noexcept
  {
    return leases_.size();
  }

 private:
  allocation_id next_id_{1};
  std::unordered_map<allocation_id, lease> leases_;
  std::unordered_map<session_id, std::unordered_set<allocation_id>> by_owner_;
};

}  // namespace rmmd::core
