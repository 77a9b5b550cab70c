#pragma once

// CRC-32C (Castagnoli, the polynomial iSCSI, ext4 and LevelDB use), for the
// state file's checksum. A table in software: the file is small and read
// once per start. (Debian 12's abseil predates absl::ComputeCrc32c, and no
// other library of the daemon offers one.)

#include <cstdint>
#include <string_view>

namespace rmmd::restart::detail {

/// CRC-32C of `bytes` (crc32c("123456789") == 0xe3069283).
[[nodiscard]] std::uint32_t crc32c(std::string_view bytes) noexcept;

}  // namespace rmmd::restart::detail
