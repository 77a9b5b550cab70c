#include "daemon/core/lease_ledger.hpp"

#include <utility>

namespace rmmd::core {

allocation_id lease_ledger::record(lease l)
{
  l.id           = next_id_++;
  auto const id  = l.id;
  auto const own = l.owner;
  leases_.emplace(id, std::move(l));
  by_owner_[own].insert(id);
  return id;
}

lease const* lease_ledger::find(allocation_id id) const
{
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

lease lease_ledger::erase(allocation_id id)
{
  auto node  = leases_.extract(id);
  auto owner = by_owner_.find(node.mapped().owner);
  owner->second.erase(id);
  if (owner->second.empty()) { by_owner_.erase(owner); }
  return std::move(node.mapped());
}

std::vector<allocation_id> lease_ledger::held_by(session_id owner) const
{
  auto it = by_owner_.find(owner);
  if (it == by_owner_.end()) { return {}; }
  return {it->second.begin(), it->second.end()};
}

}  // namespace rmmd::core
