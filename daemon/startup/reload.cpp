#include "daemon/startup/reload.hpp"

#include "daemon/library_logs.hpp"

namespace rmmd::startup {

namespace {

/// What a reload may change without a restart.
void log_restart_only_changes(config::daemon_settings const& now,
                              config::daemon_settings const& next)
{
  auto needs_restart = [](char const* what) {
    log::warn("reload: %s changed; that needs a restart and is ignored until then", what);
  };
  if (now.pools != next.pools || now.gpu_pool_per_device != next.gpu_pool_per_device) {
    needs_restart("the pools");
  }
  if (now.runtime_dir != next.runtime_dir) { needs_restart("runtime_dir"); }
  if (now.socket_group != next.socket_group || now.socket_mode != next.socket_mode ||
      now.runtime_dir_mode != next.runtime_dir_mode) {
    needs_restart("socket_group, socket_mode or runtime_dir_mode");
  }
  if (now.hello_timeout != next.hello_timeout) { needs_restart("hello_timeout_ms"); }
  if (now.max_message_bytes != next.max_message_bytes) { needs_restart("max_message_bytes"); }
  if (now.metrics_address != next.metrics_address) { needs_restart("metrics_address"); }
}

}  // namespace

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
    log::error("reload: %s is rejected; the current settings stay", source.path.string());
    return;
  }
  auto const& s = *next.settings;
  log_restart_only_changes(settings, s);
  core.reconfigure(s.access, s.quotas);
  settings.access               = s.access;
  settings.quotas               = s.quotas;
  settings.admission            = s.admission;
  settings.log_level            = s.log_level;
  settings.drain_timeout        = s.drain_timeout;
  settings.metrics_top_sessions = s.metrics_top_sessions;
  endpoints.reconfigure(settings);
  apply_log_level(settings.log_level);
  log::info(
      "reloaded %s: %d allowed uid(s), %d allowed gid(s), quotas per session %d and per uid "
      "%d bytes (%d override(s)), admission %d/%d silent connections and %d/%d sessions "
      "per uid/in all, log level %s, drain %d ms, metrics top %d sessions",
      source.path.string(),
      s.access.uids.size(),
      s.access.gids.size(),
      s.quotas.per_session_bytes,
      s.quotas.per_uid_bytes,
      s.quotas.per_uid_overrides.size(),
      s.admission.max_pending_per_uid,
      s.admission.max_pending_total,
      s.admission.max_sessions_per_uid,
      s.admission.max_sessions_total,
      config::level_name(s.log_level),
      s.drain_timeout.count(),
      s.metrics_top_sessions);
}

}  // namespace rmmd::startup
