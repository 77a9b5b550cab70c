#include "daemon/core/lease_ledger.hpp"

#include <utility>

namespace rmmd::core {
namespace {

/// Slots a table keeps however empty it gets (about 650 bytes).
constexpr std::size_t small_table = 15;

}  // namespace

allocation_id lease_ledger::record(session_id owner, lease l)
{
  auto const id = next_id_++;
  by_owner_[owner].emplace(id, l);
  ++size_;
  return id;
}

lease const* lease_ledger::find(session_id owner, allocation_id id) const
{
  auto table = by_owner_.find(owner);
  if (table == by_owner_.end()) { return nullptr; }
  auto it = table->second.find(id);
  return it == table->second.end() ? nullptr : &it->second;
}

std::optional<session_id> lease_ledger::owner_of(allocation_id id) const
{
  for (auto const& [owner, table] : by_owner_) {
    if (table.contains(id)) { return owner; }
  }
  return std::nullopt;
}

lease lease_ledger::erase(session_id owner, allocation_id id)
{
  auto table = by_owner_.find(owner);
  auto it    = table->second.find(id);
  auto l     = it->second;
  auto& t    = table->second;
  t.erase(it);
  --size_;
  // An open-addressing table never shrinks by itself: a session that held a
  // million leases and freed most of them would keep its 80 MB. Shrunk once
  // it is 1/16 full, it has room for 8 times what it holds left before it
  // grows again (tables grow at 7/8), so a session whose count swings does
  // not rehash back and forth. Small tables stay: a session allocating and
  // freeing one lease at a time must not allocate a table per call.
  if (t.capacity() > small_table && t.size() * 16 < t.capacity()) { t.rehash(0); }
  return l;
}

lease_table lease_ledger::take_all(session_id owner)
{
  auto node = by_owner_.extract(owner);
  if (node.empty()) { return {}; }
  size_ -= node.mapped().size();
  return std::move(node.mapped());
}

std::size_t lease_ledger::held_count(session_id owner) const
{
  auto table = by_owner_.find(owner);
  return table == by_owner_.end() ? 0 : table->second.size();
}

}  // namespace rmmd::core
