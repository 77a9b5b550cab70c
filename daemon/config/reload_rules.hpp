#pragma once

// What a configuration reload (SIGHUP) does with each field: the one table
// that says which fields a running daemon applies and which need a restart.
// Every member of daemon_settings has a row (tests/config checks the count),
// so no field can change in the file and be silently kept.
//
// Thread safety: pure functions of their arguments.

#include "daemon/config/settings.hpp"

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::config {

enum class on_reload : std::uint8_t {
  applied,       ///< the running daemon takes the new value
  needs_restart  ///< the old value stays until the daemon restarts
};

/// One field of the file (or a few that the daemon uses together).
struct reload_rule {
  std::string_view name;  ///< as the file spells it
  on_reload when;
  bool (*changed)(daemon_settings const& now, daemon_settings const& next);
  /// Copies the field from `from` into `into`.
  void (*take)(daemon_settings& into, daemon_settings const& from);
  /// The field's value in `s`, for the reload line (applied fields only).
  std::string (*value)(daemon_settings const& s);
};

/// Every field, in the order of docs/configuration.md.
[[nodiscard]] std::span<reload_rule const> reload_rules();

/// The fields that differ between the running settings and the file's.
struct reload_changes {
  std::vector<std::string> applied;       ///< "name=value"
  std::vector<std::string> need_restart;  ///< names
};
[[nodiscard]] reload_changes changes_between(daemon_settings const& now,
                                             daemon_settings const& next);

/// The settings a reload leaves the daemon with: `now`, with every field the
/// table applies taken from `next`.
[[nodiscard]] daemon_settings reloaded(daemon_settings const& now, daemon_settings const& next);

/// The reload's log line: "reloaded FILE: applied a=1, b=2; needs a restart
/// (ignored until then): c", or "reloaded FILE: nothing changed".
[[nodiscard]] std::string reload_line(std::filesystem::path const& file,
                                      reload_changes const& changes);

}  // namespace rmmd::config
