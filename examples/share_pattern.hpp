#pragma once

// What share_producer writes and share_consumer checks: 32-bit words that
// differ per word, so that a consumer reading the wrong bytes (or bytes the
// producer had not written yet) notices.

#include <cstddef>
#include <cstdint>
#include <span>

namespace share_example {

inline std::uint32_t word(std::size_t i)
{
  return static_cast<std::uint32_t>(i * 2654435761u) ^ 0x5eed5eedu;
}

inline void fill(std::span<std::uint32_t> words)
{
  for (std::size_t i = 0; i < words.size(); ++i) { words[i] = word(i); }
}

/// The index of the first word that is not the pattern, or words.size().
inline std::size_t first_mismatch(std::span<std::uint32_t const> words)
{
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (words[i] != word(i)) { return i; }
  }
  return words.size();
}

}  // namespace share_example
