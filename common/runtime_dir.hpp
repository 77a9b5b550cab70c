#pragma once

// Where rmmd's sockets are when nobody says otherwise: $RMMD_RUNTIME_DIR if
// set and not empty, else /run/rmmd (the shipped unit's RuntimeDirectory=).
// Used by the daemon (daemon/config/settings.cpp, where the flag and the
// config file come into it too) and by the client library
// (rmmd::session::default_runtime_dir(), which rmmctl shows as its default).
// Header-only: both sides include it, neither links the other.

#include <cstdlib>
#include <filesystem>
#include <optional>

namespace rmmd::runtime {

/// The directory the shipped systemd unit gives the daemon.
inline constexpr char const* default_runtime_dir = "/run/rmmd";

/// The environment variable that overrides it, for the daemon and clients alike.
inline constexpr char const* runtime_dir_env = "RMMD_RUNTIME_DIR";

/// $RMMD_RUNTIME_DIR, if set and not empty.
inline std::optional<std::filesystem::path> runtime_dir_from_env()
{
  char const* env = std::getenv(runtime_dir_env);
  if (env == nullptr || *env == '\0') { return std::nullopt; }
  return std::filesystem::path(env);
}

/// $RMMD_RUNTIME_DIR if set, else `configured` if not empty, else /run/rmmd.
/// The client passes nothing; the daemon passes its config file's runtime_dir
/// (its --runtime-dir flag comes before all three).
inline std::filesystem::path resolve_runtime_dir(std::filesystem::path const& configured = {})
{
  if (auto env = runtime_dir_from_env()) { return *env; }
  return configured.empty() ? std::filesystem::path(default_runtime_dir) : configured;
}

}  // namespace rmmd::runtime
