#include "daemon/core/offset_allocator.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <iterator>

namespace rmmd::core {
namespace {

/// REQUIRES: a is a power of two. Wraps to a small number on overflow, which
/// the caller's fit check then rejects (see fits()).
constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a)
{
  return (v + a - 1) & ~(a - 1);
}

/// Where a block of `size` bytes aligned to `alignment` would start inside the
/// free range [start, start + length), or nullopt if it does not fit there.
std::optional<std::uint64_t> fit(std::uint64_t start,
                                 std::uint64_t length,
                                 std::uint64_t size,
                                 std::uint64_t alignment)
{
  auto const begin = align_up(start, alignment);
  // `begin < start` only when align_up wrapped around: no such offset exists.
  if (begin < start) { return std::nullopt; }
  auto const pad = begin - start;
  if (pad > length || length - pad < size) { return std::nullopt; }
  return begin;
}

}  // namespace

offset_allocator::offset_allocator(std::size_t capacity, std::size_t granularity)
    // A capacity that is not a multiple of the granularity loses its tail: every
    // free range then starts and ends on the granularity, which is what makes
    // alignments up to the granularity free of charge in allocate().
    : capacity_(capacity & ~(granularity - 1)), granularity_(granularity), free_bytes_(capacity_)
{
  assert(std::has_single_bit(granularity));
  if (capacity_ > 0) { free_.emplace(0, capacity_); }
}

std::optional<offset_allocator::range> offset_allocator::allocate(std::size_t bytes,
                                                                  std::size_t alignment)
{
  assert(std::has_single_bit(alignment));
  // The capacity check also keeps align_up(bytes) from overflowing.
  if (bytes == 0 || bytes > capacity_) { return std::nullopt; }
  auto const size = align_up(bytes, granularity_);
  alignment       = std::max(alignment, granularity_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    auto const [start, length] = *it;
    auto const begin           = fit(start, length, size, alignment);
    if (!begin) { continue; }
    auto const end = *begin + size;
    // [start, start + length) becomes the leading pad [start, begin), which
    // stays free so that alignment wastes nothing, and the tail [end, ...).
    if (*begin == start) {
      free_.erase(it);
    } else {
      it->second = *begin - start;
    }
    if (auto const tail = start + length - end; tail > 0) { free_.emplace(end, tail); }
    free_bytes_ -= size;
    return range{.offset = *begin, .size = size};
  }
  return std::nullopt;
}

offset_allocator::range offset_allocator::release(range r)
{
  assert(r.size > 0 && r.size % granularity_ == 0 && r.offset % granularity_ == 0);
  assert(r.offset + r.size <= capacity_);
  auto [it, inserted] = free_.emplace(r.offset, r.size);
  assert(inserted);  // a double release would land on an existing free range
  free_bytes_ += r.size;
  // Merge with the following range, then with the preceding one.
  if (auto next = std::next(it); next != free_.end()) {
    assert(it->first + it->second <= next->first);  // overlap: released twice
    if (it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    assert(prev->first + prev->second <= it->first);  // overlap: released twice
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
      it = prev;
    }
  }
  return range{.offset = it->first, .size = it->second};
}

offset_allocator::range offset_allocator::free_range_at(std::uint64_t offset) const
{
  auto it = free_.upper_bound(offset);
  assert(it != free_.begin());  // nothing free at or before `offset`
  --it;
  assert(offset < it->first + it->second);
  return range{.offset = it->first, .size = it->second};
}

}  // namespace rmmd::core
