#pragma once

// The checks of a parsed configuration file, one per part of it. Each adds
// every problem it finds to the file's errors, at the field it concerns, and
// writes what is valid into the settings.

#include "daemon/config/detail/checked_file.hpp"
#include "daemon/config/settings.hpp"

namespace rmmd::config::detail {

/// runtime_dir, socket_group, runtime_dir_mode, socket_mode (socket_checks.cpp).
void check_runtime(checked_file& f, daemon_settings& s);
/// allowed_uids, allowed_users, allowed_gids, allowed_groups (socket_checks.cpp).
void check_access(checked_file& f, daemon_settings& s);
/// tenancy (socket_checks.cpp).
void check_tenancy(checked_file& f, daemon_settings& s);
/// pools (pool_checks.cpp).
void check_pools(checked_file& f, daemon_settings& s);
/// cuda_pool_per_gpu (gpu_pool_checks.cpp); after check_pools.
void check_per_gpu_pools(checked_file& f, daemon_settings& s);
/// quotas (limit_checks.cpp).
void check_quotas(checked_file& f, daemon_settings& s);
/// admission (limit_checks.cpp).
void check_admission(checked_file& f, daemon_settings& s);
/// The timeouts and pack_up_to_bytes (limit_checks.cpp).
void check_timing(checked_file& f, daemon_settings& s);
/// max_message_bytes, metrics_address, metrics_top_sessions, log_level (limit_checks.cpp).
void check_outputs(checked_file& f, daemon_settings& s);

/// peering (peering_checks.cpp).
void check_peering(checked_file& f, daemon_settings& s);

}  // namespace rmmd::config::detail
