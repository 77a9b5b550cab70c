#pragma once

// rmmd's command line: the options, and how the ones given override the
// configuration file's fields (docs/configuration.md, Command-line flags).
// The same overrides apply at start and at every reload.

#include "daemon/config/settings.hpp"
#include "daemon/core/admission_limits.hpp"

#include <CLI/CLI.hpp>

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace rmmd::startup {

/// What the command line says. Options that set a configuration field
/// override that field of the file (only when given).
struct daemon_flags {
  std::string config_path{config::default_config_path};
  std::string check_config_path;
  std::string runtime_dir;
  std::string state_file;
  std::string backend{"auto"};
  std::size_t cuda_pool_bytes{};
  std::size_t cuda_release_threshold{};
  std::string fabric{"auto"};
  std::string shared_buffer_memory{"own"};
  double keep_released_seconds{0};
  int probe_fabric_device{-1};
  std::size_t host_pool_bytes{config::default_host_pool_bytes};
  std::string host_pool_name{"host"};
  std::string host_pool_pinned{"auto"};
  std::vector<uid_t> allow_uids;
  std::vector<gid_t> allow_gids;
  std::size_t session_quota_bytes{};
  std::size_t uid_quota_bytes{};
  core::admission_limits admission{};
  int hello_timeout_ms{2000};
  std::size_t max_message_bytes{64 * 1024};
  int drain_timeout_ms{5000};
  int reclaim_timeout_ms{0};
  std::size_t pack_up_to{0};
  std::string metrics_address;
  std::size_t metrics_top_sessions{10};
  std::string log_level{"info"};
  bool verbose{false};
};

/// Declares every option of rmmd on `app`, stored into `flags`.
void add_options(CLI::App& app, daemon_flags& flags);

/// Applies the options given on `app`'s command line over the file's
/// settings. False, after saying why, if an option does not fit the
/// configuration.
bool apply_flags(CLI::App const& app, daemon_flags const& flags, config::daemon_settings& s);

/// --fabric auto|on|off.
config::fabric_mode fabric_mode(std::string const& flag);

}  // namespace rmmd::startup
