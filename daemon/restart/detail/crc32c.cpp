#include "daemon/restart/detail/crc32c.hpp"

#include <array>

namespace rmmd::restart::detail {
namespace {

constexpr std::uint32_t reflected_polynomial = 0x82f63b78;

constexpr std::array<std::uint32_t, 256> make_table()
{
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) { c = (c & 1) ? (c >> 1) ^ reflected_polynomial : c >> 1; }
    table[i] = c;
  }
  return table;
}

constexpr auto table = make_table();

}  // namespace

std::uint32_t crc32c(std::string_view bytes) noexcept
{
  std::uint32_t c = 0xffffffff;
  for (unsigned char b : bytes) { c = table[(c ^ b) & 0xff] ^ (c >> 8); }
  return c ^ 0xffffffff;
}

}  // namespace rmmd::restart::detail
