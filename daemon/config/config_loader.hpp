#pragma once

// Reads rmmd's configuration file (rmmd.v1.DaemonConfig in protobuf text
// format) and validates it, reporting every problem with its line and column.
//
// Parsing is protobuf's TextFormat::Parser (syntax errors, unknown fields and
// enum values, a singular field given twice); it stops at the first syntax
// error. A file that parses is then checked as a whole (duplicate pool names,
// sizes, modes, user and group names, ...) and every semantic error is
// reported, each at the field it concerns (TextFormat::ParseInfoTree). The
// checks live in detail/, one file per part of the file (sockets and access,
// pools, limits and timings).
//
// Thread safety: free functions without shared state; user and group names
// are resolved through NSS (common/system_user.hpp).

#include "daemon/config/settings.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::config {

struct config_error {
  int line{};    ///< 1-based; 0 when the error concerns the whole file
  int column{};  ///< 1-based; 0 when the error concerns the whole file
  std::string message;

  bool operator==(config_error const&) const = default;
};

/// "FILE:LINE:COL: message", or "FILE: message" for an error without a line.
std::string format_error(std::filesystem::path const& file, config_error const& error);

struct load_result {
  std::optional<daemon_settings> settings;  ///< set if and only if `errors` is empty
  std::vector<config_error> errors;

  [[nodiscard]] bool ok() const noexcept
  {
    return errors.empty();
  }
};

/// Parses and validates a configuration text.
load_result parse_config(std::string_view text);

/// Reads `path` and parses it. A file that cannot be read is one error
/// without a line that says why.
load_result load_config_file(std::filesystem::path const& path);

}  // namespace rmmd::config
