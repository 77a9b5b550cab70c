#pragma once

// Which configuration file rmmd reads, reading it (or the built-in defaults
// when the default file is absent), and --check-config.

#include "daemon/config/config_loader.hpp"

#include <filesystem>
#include <optional>

namespace rmmd::startup {

/// The configuration file the daemon reads: --config, else the default path
/// (whose absence means the built-in defaults).
struct config_source {
  std::filesystem::path path;
  bool explicit_path{false};
};

/// Loads the file (or the built-in defaults when the default file is absent).
/// `present` says whether a file was read.
config::load_result load_settings(config_source const& source, bool* present = nullptr);

/// --check-config: every error as FILE:LINE:COL: message (returns 1), or a
/// summary (returns 0); the process's exit status.
int check_config(config_source const& source);

/// The settings to start with; nullopt after logging every error of the file.
std::optional<config::daemon_settings> load_for_start(config_source const& source);

}  // namespace rmmd::startup
