#pragma once

// The runtime directory that holds both sockets: made with its mode and group
// if missing, and locked for this process so that a second rmmd cannot take
// over a live one's sockets.

#include "daemon/config/settings.hpp"

#include <filesystem>

namespace rmmd::startup {

/// Creates settings.runtime_dir if missing (runtime_dir_mode, socket_group)
/// and takes its lock (DIR/rmmd.lock) for the rest of the process's life.
/// False after saying why.
bool prepare_runtime_dir(config::daemon_settings const& settings);

/// Gives `path` to the socket group (if one is configured). False after
/// saying why.
bool give_to_group(std::filesystem::path const& path, config::daemon_settings const& s);

}  // namespace rmmd::startup
