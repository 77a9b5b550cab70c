#include "daemon/core/lease_ledger.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace rmmd::core {
namespace {

lease lease_of(std::size_t bytes, pool_id pool = 0)
{
  return lease{.pool = pool, .bytes = bytes, .offset = bytes * 2};
}

TEST(LeaseLedger, RecordsFindsAndErasesByOwner)
{
  lease_ledger ledger;
  auto a = ledger.record(1, lease_of(100));
  auto b = ledger.record(1, lease_of(200, 3));
  auto c = ledger.record(2, lease_of(300));
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_EQ(ledger.size(), 3u);
  ASSERT_NE(ledger.find(1, b), nullptr);
  EXPECT_EQ(ledger.find(1, b)->pool, 3u);
  EXPECT_EQ(ledger.find(1, b)->bytes, 200u);
  EXPECT_EQ(ledger.find(1, b)->offset, 400u);
  EXPECT_EQ(ledger.find(1, b)->block().bytes, 200u);
  EXPECT_EQ(ledger.find(1, b)->block().offset, 400u);
  EXPECT_EQ(ledger.held_count(1), 2u);
  EXPECT_EQ(ledger.held_count(2), 1u);

  // Another session's lease is not found under this one, but its owner is.
  EXPECT_EQ(ledger.find(2, a), nullptr);
  EXPECT_EQ(ledger.owner_of(a), 1u);
  EXPECT_EQ(ledger.owner_of(c), 2u);
  EXPECT_EQ(ledger.owner_of(999), std::nullopt);

  auto removed = ledger.erase(1, a);
  EXPECT_EQ(removed.bytes, 100u);
  EXPECT_EQ(ledger.find(1, a), nullptr);
  EXPECT_EQ(ledger.owner_of(a), std::nullopt);
  EXPECT_EQ(ledger.size(), 2u);
  EXPECT_EQ(ledger.held_count(1), 1u);

  ledger.erase(1, b);
  EXPECT_EQ(ledger.held_count(1), 0u);
  EXPECT_EQ(ledger.held_count(99), 0u);
  EXPECT_EQ(ledger.size(), 1u);
}

TEST(LeaseLedger, IdsAreNonZeroUniqueAcrossSessionsAndNeverReused)
{
  lease_ledger ledger;
  auto a = ledger.record(1, lease_of(1));
  EXPECT_NE(a, 0u);  // 0 is what an unset id looks like on the wire
  ledger.erase(1, a);
  auto b = ledger.record(1, lease_of(1));
  auto c = ledger.record(2, lease_of(1));
  EXPECT_GT(b, a);
  EXPECT_GT(c, b);
  EXPECT_EQ(ledger.find(1, a), nullptr);
}

TEST(LeaseLedger, TakeAllRemovesEveryLeaseOfOneOwner)
{
  lease_ledger ledger;
  std::set<allocation_id> even, odd;
  for (int i = 0; i < 1000; ++i) {
    auto owner = static_cast<session_id>(i % 2);
    (owner == 0 ? even : odd).insert(ledger.record(owner, lease_of(256, owner)));
  }
  auto taken = ledger.take_all(0);
  std::set<allocation_id> ids;
  for (auto const& [id, l] : taken) {
    ids.insert(id);
    EXPECT_EQ(l.pool, 0u);
  }
  EXPECT_EQ(ids, even);
  EXPECT_EQ(ledger.size(), odd.size());
  EXPECT_EQ(ledger.held_count(0), 0u);
  EXPECT_TRUE(ledger.take_all(0).empty());
  for (auto id : odd) { EXPECT_NE(ledger.find(1, id), nullptr); }
}

TEST(LeaseLedger, ATableThatEmptiesAndRefillsKeepsEveryLease)
{
  // Shrinking (at 1/16 full) must keep what is left findable.
  lease_ledger ledger;
  std::vector<allocation_id> ids;
  for (int i = 0; i < 100000; ++i) { ids.push_back(ledger.record(7, lease_of(256))); }
  for (std::size_t i = 0; i + 10 < ids.size(); ++i) { ledger.erase(7, ids[i]); }
  EXPECT_EQ(ledger.size(), 10u);
  for (std::size_t i = ids.size() - 10; i < ids.size(); ++i) {
    EXPECT_NE(ledger.find(7, ids[i]), nullptr);
  }
  for (int i = 0; i < 1000; ++i) { ledger.record(7, lease_of(512)); }
  EXPECT_EQ(ledger.held_count(7), 1010u);
  EXPECT_EQ(ledger.take_all(7).size(), 1010u);
  EXPECT_EQ(ledger.size(), 0u);
}

}  // namespace
}  // namespace rmmd::core
