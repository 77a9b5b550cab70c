#include "daemon/core/offset_allocator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace rmmd::core {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

TEST(OffsetAllocator, RoundsSizesUpToTheGranularity)
{
  offset_allocator a(MiB, 256);
  for (auto [asked, reserved] : std::vector<std::pair<std::size_t, std::size_t>>{
           {1, 256}, {255, 256}, {256, 256}, {257, 512}, {1000, 1024}, {4096, 4096}}) {
    auto r = a.allocate(asked, 1);
    ASSERT_TRUE(r) << asked;
    EXPECT_EQ(r->size, reserved) << asked;
    EXPECT_EQ(r->offset % 256, 0u) << asked;
  }
  EXPECT_EQ(a.free_bytes(), MiB - (256 * 3 + 512 + 1024 + 4096));

  offset_allocator pages(MiB, 4096);
  EXPECT_EQ(pages.allocate(1, 1)->size, 4096u);
  EXPECT_EQ(pages.allocate(4097, 1)->size, 8192u);
}

TEST(OffsetAllocator, CapacityIsRoundedDownToTheGranularity)
{
  offset_allocator a(1000, 256);
  EXPECT_EQ(a.capacity(), 768u);
  EXPECT_EQ(a.free_bytes(), 768u);
  EXPECT_TRUE(a.allocate(768, 256));
  EXPECT_FALSE(a.allocate(1, 1));

  offset_allocator empty(100, 256);
  EXPECT_EQ(empty.capacity(), 0u);
  EXPECT_EQ(empty.free_range_count(), 0u);
  EXPECT_FALSE(empty.allocate(1, 1));
}

TEST(OffsetAllocator, HonoursEveryPowerOfTwoAlignmentUpTo2MiB)
{
  for (std::size_t alignment = 1; alignment <= 2 * MiB; alignment <<= 1) {
    offset_allocator a(8 * MiB, 256);
    // Make the first free offset as badly aligned as the granularity allows.
    auto const misalign = a.allocate(256, 1);
    ASSERT_TRUE(misalign);
    auto r = a.allocate(1000, alignment);
    ASSERT_TRUE(r) << alignment;
    EXPECT_EQ(r->offset % alignment, 0u) << alignment;
    EXPECT_EQ(r->size, 1024u) << alignment;
    // The leading pad is not lost: it stays free.
    EXPECT_EQ(a.free_bytes(), 8 * MiB - 256 - 1024) << alignment;
  }
}

TEST(OffsetAllocator, TheAlignmentPadStaysFreeForLaterRequests)
{
  offset_allocator a(4 * MiB, 256);
  auto first   = a.allocate(256, 1);
  auto aligned = a.allocate(256, MiB);
  ASSERT_TRUE(first && aligned);
  EXPECT_EQ(first->offset, 0u);
  EXPECT_EQ(aligned->offset, MiB);
  EXPECT_EQ(a.free_range_count(), 2u);  // the pad [256, 1 MiB) and the tail
  auto in_pad = a.allocate(4096, 1);
  ASSERT_TRUE(in_pad);
  EXPECT_EQ(in_pad->offset, 256u);  // first fit: the pad comes first
}

TEST(OffsetAllocator, AnAlignmentBeyondTheCapacityFitsOnlyAtZero)
{
  offset_allocator a(MiB, 256);
  auto r = a.allocate(256, 2 * MiB);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->offset, 0u);
  EXPECT_FALSE(a.allocate(256, 2 * MiB));
  // Aligning a non-zero offset up to 2^63 wraps around 64 bits: no fit, not a bogus offset.
  EXPECT_FALSE(a.allocate(256, std::size_t{1} << 63));
  EXPECT_EQ(a.free_bytes(), MiB - 256);
}

TEST(OffsetAllocator, ExhaustionReturnsNulloptAndChangesNothing)
{
  offset_allocator a(64 * KiB, 256);
  EXPECT_FALSE(a.allocate(64 * KiB + 1, 1));  // more than the capacity
  auto all = a.allocate(64 * KiB, 1);
  ASSERT_TRUE(all);
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.free_range_count(), 0u);
  EXPECT_FALSE(a.allocate(1, 1));
  EXPECT_EQ(a.free_bytes(), 0u);
  a.release(*all);
  EXPECT_EQ(a.free_bytes(), 64 * KiB);
  EXPECT_TRUE(a.allocate(64 * KiB, 1));
}

TEST(OffsetAllocator, CoalescesWhateverTheOrderOfRelease)
{
  // Every order of four neighbours (each one merges left, right, both or
  // neither at some point), then longer runs in reverse and shuffled order.
  std::vector<int> order{0, 1, 2, 3};
  do {
    offset_allocator a(1024, 256);
    std::vector<offset_allocator::range> rs;
    for (int i = 0; i < 4; ++i) { rs.push_back(*a.allocate(256, 256)); }
    for (int i : order) { a.release(rs[static_cast<std::size_t>(i)]); }
    EXPECT_EQ(a.free_range_count(), 1u);
    EXPECT_EQ(a.free_bytes(), a.capacity());
  } while (std::next_permutation(order.begin(), order.end()));

  for (int run = 0; run < 3; ++run) {
    offset_allocator a(4096, 256);
    std::vector<offset_allocator::range> rs;
    for (int i = 0; i < 16; ++i) { rs.push_back(*a.allocate(256, 256)); }
    if (run == 1) { std::reverse(rs.begin(), rs.end()); }
    if (run == 2) { std::shuffle(rs.begin(), rs.end(), std::mt19937(42)); }
    for (auto r : rs) { a.release(r); }
    EXPECT_EQ(a.free_range_count(), 1u);
    EXPECT_EQ(a.free_bytes(), a.capacity());
    EXPECT_TRUE(a.allocate(4096, 256));  // whole again
  }
}

TEST(OffsetAllocator, ReleaseReturnsTheMergedFreeRange)
{
  offset_allocator a(4096, 256);
  std::vector<offset_allocator::range> rs;
  for (int i = 0; i < 4; ++i) { rs.push_back(*a.allocate(256, 1)); }
  // Free tail: [1024, 4096).
  auto r = a.release(rs[1]);  // neighbours held: only itself
  EXPECT_EQ(r.offset, 256u);
  EXPECT_EQ(r.size, 256u);
  r = a.release(rs[3]);  // merges with the tail
  EXPECT_EQ(r.offset, 768u);
  EXPECT_EQ(r.size, 4096u - 768u);
  r = a.release(rs[2]);  // merges both ways
  EXPECT_EQ(r.offset, 256u);
  EXPECT_EQ(r.size, 4096u - 256u);
  r = a.release(rs[0]);
  EXPECT_EQ(r.offset, 0u);
  EXPECT_EQ(r.size, 4096u);
}

TEST(OffsetAllocator, FragmentationCanRefuseWhatTheTotalWouldAllow)
{
  offset_allocator a(4096, 256);
  std::vector<offset_allocator::range> rs;
  for (int i = 0; i < 16; ++i) { rs.push_back(*a.allocate(256, 256)); }
  for (int i = 0; i < 16; i += 2) { a.release(rs[static_cast<std::size_t>(i)]); }
  EXPECT_EQ(a.free_bytes(), 2048u);
  EXPECT_EQ(a.free_range_count(), 8u);
  EXPECT_FALSE(a.allocate(512, 256));  // 2 KiB free, but no two free blocks are adjacent
  EXPECT_TRUE(a.allocate(256, 256));
}

/// The reference: one flag per granule, and first fit by brute force (the
/// lowest aligned offset whose whole range is free).
class reference_model {
 public:
  reference_model(std::size_t capacity, std::size_t granularity)
      : granularity_(granularity), used_(capacity / granularity, false)
  {
  }

  [[nodiscard]] std::optional<std::uint64_t> first_fit(std::size_t size,
                                                       std::size_t alignment) const
  {
    auto const step = std::max(alignment, granularity_) / granularity_;
    auto const n    = size / granularity_;
    for (std::size_t g = 0; g + n <= used_.size(); g += step) {
      if (std::none_of(
              used_.begin() + index(g), used_.begin() + index(g + n), [](bool b) { return b; })) {
        return g * granularity_;
      }
    }
    return std::nullopt;
  }

  /// False if any granule of the range was already in the state `to`.
  bool mark(offset_allocator::range r, bool to)
  {
    bool clean = true;
    for (auto g = r.offset / granularity_; g < (r.offset + r.size) / granularity_; ++g) {
      clean    = clean && used_[g] != to;
      used_[g] = to;
    }
    return clean;
  }

  [[nodiscard]] std::size_t free_bytes() const
  {
    return static_cast<std::size_t>(std::count(used_.begin(), used_.end(), false)) * granularity_;
  }

  [[nodiscard]] std::size_t free_runs() const
  {
    std::size_t runs = 0;
    for (std::size_t g = 0; g < used_.size(); ++g) {
      if (!used_[g] && (g == 0 || used_[g - 1])) { ++runs; }
    }
    return runs;
  }

 private:
  static std::ptrdiff_t index(std::size_t g)
  {
    return static_cast<std::ptrdiff_t>(g);
  }

  std::size_t granularity_;
  std::vector<bool> used_;
};

TEST(OffsetAllocator, RandomWorkloadMatchesAReferenceModel)
{
  constexpr std::size_t capacity    = 256 * KiB;
  constexpr std::size_t granularity = 256;
  offset_allocator a(capacity, granularity);
  reference_model model(capacity, granularity);
  std::mt19937 rng(7);
  std::vector<offset_allocator::range> live;
  int refused = 0;
  for (int step = 0; step < 6000; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      std::size_t const bytes     = 1 + rng() % (16 * KiB);
      std::size_t const alignment = std::size_t{1} << (rng() % 16);
      auto const size             = (bytes + granularity - 1) / granularity * granularity;
      auto const expected         = model.first_fit(size, alignment);
      auto const r                = a.allocate(bytes, alignment);
      ASSERT_EQ(r.has_value(), expected.has_value()) << "step " << step;
      if (!r) {
        ++refused;
        continue;
      }
      ASSERT_EQ(r->offset, *expected) << "step " << step;
      ASSERT_EQ(r->size, size);
      ASSERT_EQ(r->offset % alignment, 0u);
      ASSERT_LE(r->offset + r->size, capacity);
      ASSERT_TRUE(model.mark(*r, true)) << "overlaps a live range at step " << step;
      live.push_back(*r);
    } else {
      auto const i = rng() % live.size();
      a.release(live[i]);
      ASSERT_TRUE(model.mark(live[i], false));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_EQ(a.free_bytes(), model.free_bytes()) << "step " << step;
    ASSERT_EQ(a.free_range_count(), model.free_runs()) << "step " << step;
  }
  EXPECT_GT(refused, 0);        // the workload did reach a full or fragmented pool
  EXPECT_GT(live.size(), 10u);  // and kept a good number of ranges alive
  for (auto r : live) { a.release(r); }
  EXPECT_EQ(a.free_range_count(), 1u);
  EXPECT_EQ(a.free_bytes(), capacity);
}

TEST(OffsetAllocator, FindsTheFreeRangeHoldingAnOffset)
{
  offset_allocator a(4096, 256);
  auto x = a.allocate(256, 256);
  auto y = a.allocate(512, 256);
  auto z = a.allocate(256, 256);
  ASSERT_TRUE(x && y && z);
  a.release(*y);
  auto r = a.free_range_at(y->offset + 300);
  EXPECT_EQ(r.offset, y->offset);
  EXPECT_EQ(r.size, 512u);
  auto tail = a.free_range_at(4095);
  EXPECT_EQ(tail.offset, z->offset + 256);
  EXPECT_EQ(tail.size, 4096 - tail.offset);
}

}  // namespace
}  // namespace rmmd::core
