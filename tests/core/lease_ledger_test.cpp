#include "daemon/core/lease_ledger.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace rmmd::core {
namespace {

using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

lease lease_of(session_id owner, std::size_t bytes, pool_id pool = 0)
{
  return lease{.owner           = owner,
               .pool            = pool,
               .requested_bytes = bytes,
               .block           = {.bytes = bytes, .offset = bytes * 2}};
}

TEST(LeaseLedger, RecordsFindsAndErases)
{
  lease_ledger ledger;
  auto a = ledger.record(lease_of(1, 100));
  auto b = ledger.record(lease_of(1, 200, 3));
  auto c = ledger.record(lease_of(2, 300));
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_EQ(ledger.size(), 3u);
  ASSERT_NE(ledger.find(b), nullptr);
  EXPECT_EQ(ledger.find(b)->id, b);
  EXPECT_EQ(ledger.find(b)->owner, 1u);
  EXPECT_EQ(ledger.find(b)->pool, 3u);
  EXPECT_EQ(ledger.find(b)->requested_bytes, 200u);
  EXPECT_EQ(ledger.find(b)->block.offset, 400u);
  EXPECT_THAT(ledger.held_by(1), UnorderedElementsAre(a, b));
  EXPECT_THAT(ledger.held_by(2), UnorderedElementsAre(c));

  auto removed = ledger.erase(a);
  EXPECT_EQ(removed.id, a);
  EXPECT_EQ(removed.owner, 1u);
  EXPECT_EQ(removed.block.bytes, 100u);
  EXPECT_EQ(ledger.find(a), nullptr);
  EXPECT_EQ(ledger.size(), 2u);
  EXPECT_THAT(ledger.held_by(1), UnorderedElementsAre(b));
  EXPECT_THAT(ledger.held_by(2), UnorderedElementsAre(c));

  ledger.erase(b);
  EXPECT_THAT(ledger.held_by(1), IsEmpty());
  EXPECT_THAT(ledger.held_by(99), IsEmpty());
  EXPECT_EQ(ledger.size(), 1u);
}

TEST(LeaseLedger, TheLedgerChoosesTheIdNotTheCaller)
{
  lease_ledger ledger;
  auto l = lease_of(1, 1);
  l.id   = 42;
  auto a = ledger.record(l);
  auto b = ledger.record(l);
  EXPECT_NE(a, b);
  EXPECT_EQ(ledger.find(a)->id, a);
  EXPECT_EQ(ledger.find(b)->id, b);
}

TEST(LeaseLedger, IdsAreNonZeroAndNeverReused)
{
  lease_ledger ledger;
  auto a = ledger.record(lease_of(1, 1));
  EXPECT_NE(a, 0u);  // 0 is what an unset id looks like on the wire
  ledger.erase(a);
  auto b = ledger.record(lease_of(1, 1));
  EXPECT_GT(b, a);
  EXPECT_EQ(ledger.find(a), nullptr);
}

TEST(LeaseLedger, HeldByTracksManyOwners)
{
  lease_ledger ledger;
  std::vector<allocation_id> even, odd;
  for (int i = 0; i < 100; ++i) {
    auto owner = static_cast<session_id>(i % 2);
    (owner == 0 ? even : odd).push_back(ledger.record(lease_of(owner, 1)));
  }
  EXPECT_THAT(ledger.held_by(0), UnorderedElementsAreArray(even));
  EXPECT_THAT(ledger.held_by(1), UnorderedElementsAreArray(odd));
  for (auto id : even) { ledger.erase(id); }
  EXPECT_THAT(ledger.held_by(0), IsEmpty());
  EXPECT_THAT(ledger.held_by(1), UnorderedElementsAreArray(odd));
  EXPECT_EQ(ledger.size(), odd.size());
}

}  // namespace
}  // namespace rmmd::core
