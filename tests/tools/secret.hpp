#pragma once

// The tenant-isolation tests' secret: 16 bytes one uid writes over and over
// into memory it holds, and a hostile process of another uid looks for in
// everything it can read. Passed between processes as 32 hex digits.

#include <array>
#include <cstddef>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>

namespace rmmd::test {

using secret_bytes = std::array<unsigned char, 16>;

/// 16 fresh random bytes as 32 lowercase hex digits.
inline std::string random_secret_hex()
{
  static constexpr char digits[] = "0123456789abcdef";
  std::random_device random;
  std::string hex;
  for (int i = 0; i < 32; ++i) { hex.push_back(digits[random() & 0xf]); }
  return hex;
}

/// The bytes of 32 hex digits; throws std::invalid_argument otherwise.
inline secret_bytes parse_secret(std::string_view hex)
{
  if (hex.size() != 32) { throw std::invalid_argument("a secret is 32 hex digits"); }
  auto nibble = [](char c) -> unsigned {
    if (c >= '0' && c <= '9') { return static_cast<unsigned>(c - '0'); }
    if (c >= 'a' && c <= 'f') { return static_cast<unsigned>(c - 'a' + 10); }
    if (c >= 'A' && c <= 'F') { return static_cast<unsigned>(c - 'A' + 10); }
    throw std::invalid_argument("a secret is 32 hex digits");
  };
  secret_bytes out{};
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<unsigned char>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

/// Fills `bytes` at `p` with the secret repeated (the tail with its start).
inline void fill_secret(void* p, std::size_t bytes, secret_bytes const& secret)
{
  auto* out = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) { out[i] = secret[i % secret.size()]; }
}

/// Offset of the first copy of the secret in [p, p + bytes), at any byte
/// offset; nullopt if there is none.
inline std::optional<std::size_t> find_secret(void const* p,
                                              std::size_t bytes,
                                              secret_bytes const& secret)
{
  auto const* at = ::memmem(p, bytes, secret.data(), secret.size());
  if (at == nullptr) { return std::nullopt; }
  return static_cast<std::size_t>(static_cast<unsigned char const*>(at) -
                                  static_cast<unsigned char const*>(p));
}

}  // namespace rmmd::test
