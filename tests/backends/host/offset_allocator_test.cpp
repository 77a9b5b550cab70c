#include "daemon/backends/host/offset_allocator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace rmmd::backends::host {
namespace {

TEST(OffsetAllocator, RoundsToGranularityAndHonoursAlignment)
{
  offset_allocator a(std::size_t{64} << 20, 256);
  auto first = a.allocate(1, 1);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->size, 256u);
  for (std::size_t alignment = 1; alignment <= (std::size_t{2} << 20); alignment <<= 1) {
    auto r = a.allocate(1000, alignment);
    ASSERT_TRUE(r) << alignment;
    EXPECT_EQ(r->offset % alignment, 0u) << alignment;
    EXPECT_EQ(r->size, 1024u);
  }
}

TEST(OffsetAllocator, CoalescesInAnyOrder)
{
  for (int order = 0; order < 3; ++order) {
    offset_allocator a(4096, 256);
    std::vector<offset_allocator::range> rs;
    for (int i = 0; i < 16; ++i) { rs.push_back(*a.allocate(256, 256)); }
    EXPECT_FALSE(a.allocate(256, 256));  // full
    EXPECT_EQ(a.free_bytes(), 0u);
    if (order == 1) { std::reverse(rs.begin(), rs.end()); }
    if (order == 2) { std::shuffle(rs.begin(), rs.end(), std::mt19937(42)); }
    for (auto r : rs) { a.release(r); }
    EXPECT_EQ(a.free_range_count(), 1u);
    EXPECT_EQ(a.free_bytes(), 4096u);
    EXPECT_TRUE(a.allocate(4096, 256));  // whole again
  }
}

TEST(OffsetAllocator, FragmentationCanRefuseWhatTheTotalWouldAllow)
{
  offset_allocator a(4096, 256);
  std::vector<offset_allocator::range> rs;
  for (int i = 0; i < 16; ++i) { rs.push_back(*a.allocate(256, 256)); }
  for (int i = 0; i < 16; i += 2) {
    a.release(rs[i]);  // every other block
  }
  EXPECT_EQ(a.free_bytes(), 2048u);
  EXPECT_FALSE(a.allocate(512, 256));
  EXPECT_TRUE(a.allocate(256, 256));
}

TEST(OffsetAllocator, RandomWorkloadNeverOverlapsOrLeaks)
{
  constexpr std::size_t capacity = 1 << 20;
  offset_allocator a(capacity, 256);
  std::mt19937 rng(7);
  std::vector<offset_allocator::range> live;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      auto bytes     = 1 + rng() % 20000;
      auto alignment = std::size_t{1} << (rng() % 14);
      if (auto r = a.allocate(bytes, alignment)) {
        EXPECT_EQ(r->offset % alignment, 0u);
        EXPECT_GE(r->size, bytes);
        EXPECT_LE(r->offset + r->size, capacity);
        live.push_back(*r);
      }
    } else {
      auto i = rng() % live.size();
      a.release(live[i]);
      live.erase(live.begin() + static_cast<long>(i));
    }
  }
  std::sort(live.begin(), live.end(), [](auto x, auto y) { return x.offset < y.offset; });
  std::size_t used = 0;
  for (std::size_t i = 0; i < live.size(); ++i) {
    used += live[i].size;
    if (i > 0) { ASSERT_LE(live[i - 1].offset + live[i - 1].size, live[i].offset); }
  }
  EXPECT_EQ(a.free_bytes() + used, capacity);
  for (auto r : live) { a.release(r); }
  EXPECT_EQ(a.free_range_count(), 1u);
}

}  // namespace
}  // namespace rmmd::backends::host
