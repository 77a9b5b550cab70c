#pragma once

// A configuration reload (SIGHUP): the file is read again and the flags are
// applied over it; a file with errors is rejected as a whole; otherwise every
// field that config::reload_rules() marks applied goes to the core, the
// endpoints and the log, and one line names the changed fields applied and
// the changed fields that need a restart.

#include "daemon/config/settings.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/log.hpp"
#include "daemon/startup/config_source.hpp"
#include "daemon/startup/endpoints.hpp"

#include <functional>

namespace rmmd::startup {

/// The command line's overrides, applied to a freshly read file; false after
/// saying why they do not fit it.
using flag_overrides = std::function<bool(config::daemon_settings&)>;

/// Reloads `source` into the running daemon; `settings` (what it runs with)
/// becomes the reloaded settings. Leaves everything as it was if the file
/// has errors.
void reload(config_source const& source,
            flag_overrides const& apply_flags,
            config::daemon_settings& settings,
            core::daemon_core& core,
            endpoints& endpoints);

/// The daemon's and its libraries' log threshold.
void apply_log_level(log::level level);

}  // namespace rmmd::startup
