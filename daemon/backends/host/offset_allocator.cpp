#include "daemon/backends/host/offset_allocator.hpp"

#include <algorithm>
#include <cassert>
#include <iterator>

namespace rmmd::backends::host {
namespace {

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a)
{
  return (v + a - 1) & ~(a - 1);
}

}  // namespace

offset_allocator::offset_allocator(std::size_t capacity, std::size_t granularity)
    : capacity_(capacity & ~(granularity - 1)), granularity_(granularity), free_bytes_(capacity_)
{
  if (capacity_ > 0) { free_.emplace(0, capacity_); }
}

std::optional<offset_allocator::range> offset_allocator::allocate(std::size_t bytes,
                                                                  std::size_t alignment)
{
  if (bytes == 0 || bytes > capacity_) { return std::nullopt; }
  auto const size = align_up(bytes, granularity_);
  // Aligning to less than the granularity is free: every range starts on it.
  alignment = std::max(alignment, granularity_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    auto const [start, length] = *it;
    auto const begin           = align_up(start, alignment);
    if (begin - start > length || length - (begin - start) < size) { continue; }
    auto const end      = begin + size;
    auto const tail_len = start + length - end;
    // Replace [start, start+length) by the pad before `begin` and the tail.
    if (begin == start) {
      free_.erase(it);
    } else {
      it->second = begin - start;
    }
    if (tail_len > 0) { free_.emplace(end, tail_len); }
    free_bytes_ -= size;
    return range{.offset = begin, .size = size};
  }
  return std::nullopt;
}

void offset_allocator::release(range r)
{
  auto [it, inserted] = free_.emplace(r.offset, r.size);
  assert(inserted);
  free_bytes_ += r.size;
  // Merge with the following range, then with the preceding one.
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

}  // namespace rmmd::backends::host
