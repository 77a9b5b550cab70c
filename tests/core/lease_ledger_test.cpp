#include "daemon/core/lease_ledger.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rmmd::core {
namespace {

using ::testing::UnorderedElementsAre;

lease lease_of(session_id owner, std::size_t bytes)
{
  return lease{.owner = owner, .requested_bytes = bytes, .block = {.bytes = bytes}};
}

TEST(LeaseLedger, RecordsFindsAndErases)
{
  lease_ledger ledger;
  auto a = ledger.record(lease_of(1, 100));
  auto b = ledger.record(lease_of(1, 200));
  auto c = ledger.record(lease_of(2, 300));
  EXPECT_NE(a, b);
  EXPECT_EQ(ledger.size(), 3u);
  ASSERT_NE(ledger.find(b), nullptr);
  EXPECT_EQ(ledger.find(b)->requested_bytes, 200u);
  EXPECT_EQ(ledger.find(b)->id, b);
  EXPECT_THAT(ledger.held_by(1), UnorderedElementsAre(a, b));
  EXPECT_THAT(ledger.held_by(2), UnorderedElementsAre(c));
  auto removed = ledger.erase(a);
  EXPECT_EQ(removed.block.bytes, 100u);
  EXPECT_EQ(ledger.find(a), nullptr);
  EXPECT_THAT(ledger.held_by(1), UnorderedElementsAre(b));
  ledger.erase(b);
  EXPECT_TRUE(ledger.held_by(1).empty());
  EXPECT_TRUE(ledger.held_by(99).empty());
}

TEST(LeaseLedger, IdsAreNeverReused)
{
  lease_ledger ledger;
  auto a = ledger.record(lease_of(1, 1));
  ledger.erase(a);
  EXPECT_GT(ledger.record(lease_of(1, 1)), a);
}

}  // namespace
}  // namespace rmmd::core
