#pragma once

// The test data that one process writes and another checks: a pattern of
// 64-bit words that differs per seed and per word.

#include <cstddef>
#include <cstdint>

namespace rmmd::test {

inline std::uint64_t pattern(std::uint64_t seed, std::size_t word)
{
  return (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (word * 0xBF58476D1CE4E5B9ULL);
}

inline void fill(void* p, std::size_t bytes, std::uint64_t seed)
{
  auto* w = static_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < bytes / 8; ++i) { w[i] = pattern(seed, i); }
}

/// Index of the first word that does not hold the pattern, or -1.
inline long first_mismatch(void const* p, std::size_t bytes, std::uint64_t seed)
{
  auto const* w = static_cast<std::uint64_t const*>(p);
  for (std::size_t i = 0; i < bytes / 8; ++i) {
    if (w[i] != pattern(seed, i)) { return static_cast<long>(i); }
  }
  return -1;
}

}  // namespace rmmd::test
