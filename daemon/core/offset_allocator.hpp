#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace rmmd::core {

/// Hands out ranges [offset, offset + size) of a fixed-size region: first fit
/// over an address-ordered free list, with adjacent free ranges coalesced on
/// release. Every range it returns starts at a multiple of the requested
/// alignment and its size is rounded up to a multiple of `granularity`.
///
/// Not thread-safe. No memory is touched: it only does arithmetic on offsets.
class offset_allocator {
 public:
  /// REQUIRES: granularity is a power of two.
  explicit offset_allocator(std::size_t capacity, std::size_t granularity = 256);

  struct range {
    std::uint64_t offset{};
    std::size_t size{};  ///< reserved size: the request rounded up to the granularity
  };

  /// REQUIRES: bytes > 0; alignment a power of two.
  /// Returns nullopt when no free range fits.
  std::optional<range> allocate(std::size_t bytes, std::size_t alignment);

  /// Frees `r` and merges it with the free ranges beside it. Returns the free
  /// range that now contains `r` (after that merge), so that a caller can give
  /// back to the system the pages that have just become entirely free.
  /// REQUIRES: `r` came from allocate() and was not released.
  range release(range r);

  /// The free range that contains `offset`. REQUIRES: `offset` is free.
  [[nodiscard]] range free_range_at(std::uint64_t offset) const;

  [[nodiscard]] std::size_t capacity() const noexcept
  {
    return capacity_;
  }
  [[nodiscard]] std::size_t free_bytes() const noexcept
  {
    return free_bytes_;
  }
  /// Number of disjoint free ranges (1 when nothing is allocated).
  [[nodiscard]] std::size_t free_range_count() const noexcept
  {
    return free_.size();
  }

 private:
  std::size_t capacity_;
  std::size_t granularity_;
  std::size_t free_bytes_;
  std::map<std::uint64_t, std::size_t> free_;  // offset -> size, address order
};

}  // namespace rmmd::core
