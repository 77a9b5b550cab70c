#pragma once

// Lowercase hexadecimal of a byte string: how a session token travels in gRPC
// metadata and how logs and tools print tokens and ids. Header-only, shared by
// the daemon, the client and the bench.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace rmmd::common {

/// Two lowercase hex digits per byte, most significant nibble first.
[[nodiscard]] inline std::string to_hex(std::span<std::byte const> bytes)
{
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    auto const v = std::to_integer<unsigned>(b);
    out.push_back(digits[v >> 4]);
    out.push_back(digits[v & 0xf]);
  }
  return out;
}

[[nodiscard]] inline std::string to_hex(std::string_view bytes)
{
  return to_hex(std::as_bytes(std::span{bytes.data(), bytes.size()}));
}

}  // namespace rmmd::common
