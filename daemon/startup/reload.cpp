#include "daemon/startup/reload.hpp"

#include "daemon/config/reload_rules.hpp"
#include "daemon/library_logs.hpp"

namespace rmmd::startup {

void apply_log_level(log::level level)
{
  log::threshold = level;
  log::set_library_log_level(level);
}

void reload(config_source const& source,
            flag_overrides const& apply_flags,
            config::daemon_settings& settings,
            core::daemon_core& core,
            endpoints& endpoints)
{
  auto next = load_settings(source);
  if (next.ok() && !apply_flags(*next.settings)) {
    next.errors.push_back(
        config::config_error{.message = "the command line options do not fit it"});
  }
  if (!next.ok()) {
    for (auto const& e : next.errors) {
      log::error("reload: %s", config::format_error(source.path, e));
    }
    log::error("reload: %s is rejected; the current settings stay%s",
               source.path.string(),
               settings.peering.tls && !settings.peering.insecure_plaintext_for_tests
                   ? " (peering keeps its old certificates, the listener's and the links')"
                   : "");
    return;
  }
  auto const changes = config::changes_between(settings, *next.settings);
  settings           = config::reloaded(settings, *next.settings);
  core.reconfigure(core::core_reload{.access          = settings.access,
                                     .quotas          = settings.quotas,
                                     .reclaim_timeout = settings.reclaim_timeout,
                                     .pack_up_to      = settings.pack_up_to});
  endpoints.reconfigure(settings);
  apply_log_level(settings.log_level);
  // drain_timeout is read from `settings` when the drain begins.
  auto const line = config::reload_line(source.path, changes);
  if (changes.need_restart.empty()) {
    log::info("%s", line);
  } else {
    log::warn("%s", line);
  }
}

}  // namespace rmmd::startup
