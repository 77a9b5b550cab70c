#pragma once

// The daemon's settings: what the configuration file (rmmd.v1.DaemonConfig in
// protobuf text format) says once it is validated and every name is resolved,
// in plain C++ types. No protobuf, no gRPC.
//
// docs/configuration.md describes each field, its default, the flags that
// override it and what a reload applies.

#include "daemon/core/admission_limits.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/core/types.hpp"
#include "daemon/log.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::config {

inline constexpr char const* default_config_path     = "/etc/rmmd/rmmd.conf";
inline constexpr std::size_t default_host_pool_bytes = std::size_t{1} << 30;

/// Fabric handles on a CUDA pool.
enum class fabric_mode : std::uint8_t {
  automatic,  ///< where a probe proves they work; posix-fd only elsewhere
  required,   ///< a pool without them is not served
  off,        ///< posix fd only
};

/// Which kind of backend serves a pool (the config's Pool.backend). Each
/// kind's pools are made by daemon/backends (pool_kinds.hpp).
enum class pool_kind : std::uint8_t { host, cuda };

struct pool_settings {
  std::string name;
  pool_kind backend{pool_kind::host};
  int device{-1};  ///< cuda: the CUDA device ordinal; host: -1
  /// cuda: the GPU by UUID or PCI bus id (config `gpu`); when set, `device`
  /// is found from it at start.
  std::string gpu{};
  fabric_mode fabric{fabric_mode::automatic};
  std::size_t initial_size_bytes{};       ///< cuda
  std::size_t release_threshold_bytes{};  ///< cuda
  std::size_t limit_bytes{};              ///< cuda; 0: 80% of the GPU's free memory at start
  std::size_t capacity_bytes{};           ///< host
  std::optional<bool> pinnable{};         ///< host; unset: on when a CUDA pool is served
  int line{};                             ///< where the file defines it (0: built in), for messages

  bool operator==(pool_settings const& other) const
  {
    return name == other.name && backend == other.backend && device == other.device &&
           gpu == other.gpu && fabric == other.fabric &&
           initial_size_bytes == other.initial_size_bytes &&
           release_threshold_bytes == other.release_threshold_bytes &&
           limit_bytes == other.limit_bytes && capacity_bytes == other.capacity_bytes &&
           pinnable == other.pinnable;
  }
};

/// One cuda_pool_per_gpu.gpu_overrides entry: what differs for one GPU's
/// pool. Unset fields take the shared settings.
struct gpu_pool_override {
  int device{-1};      ///< the GPU by CUDA ordinal; -1: by `gpu`
  std::string gpu{};   ///< the GPU by UUID or PCI bus id
  std::string name{};  ///< empty: name_prefix and the ordinal
  bool skip{false};    ///< no pool on this GPU
  std::optional<fabric_mode> fabric{};
  std::optional<std::size_t> initial_size_bytes{};
  std::optional<std::size_t> release_threshold_bytes{};
  std::optional<std::size_t> limit_bytes{};
  int line{};  ///< where the file defines it, for messages

  bool operator==(gpu_pool_override const& other) const
  {
    return device == other.device && gpu == other.gpu && name == other.name && skip == other.skip &&
           fabric == other.fabric && initial_size_bytes == other.initial_size_bytes &&
           release_threshold_bytes == other.release_threshold_bytes &&
           limit_bytes == other.limit_bytes;
  }
};

/// cuda_pool_per_gpu: a CUDA pool on every GPU the daemon sees at start,
/// named name_prefix and the ordinal (gpu_pools.hpp makes them).
struct per_gpu_pools {
  std::string name_prefix{"gpu"};
  fabric_mode fabric{fabric_mode::automatic};
  std::size_t initial_size_bytes{};
  std::size_t release_threshold_bytes{};
  std::size_t limit_bytes{};  ///< 0: 80% of the GPU's free memory at start
  std::vector<gpu_pool_override> overrides{};

  bool operator==(per_gpu_pools const& other) const = default;
};

/// peering.tls: the files, as written (checked readable at load).
struct peer_tls_files {
  std::filesystem::path certificate{};
  std::filesystem::path private_key{};
  std::filesystem::path trusted_ca{};

  bool operator==(peer_tls_files const& other) const = default;
};

/// One peering.peers entry: a daemon this one dials.
struct peer_node_settings {
  std::string name{};
  std::string address{};          ///< "HOST:PORT"
  std::string identity{};         ///< the subject its certificate must carry; empty: any
  std::string tls_server_name{};  ///< empty: the address's host

  bool operator==(peer_node_settings const& other) const = default;
};

/// One peering.grants entry: what a peer identity may open here.
struct peer_grant_settings {
  std::string identity{};  ///< a certificate subject, exactly; "*": any trusted peer
  std::vector<std::string> name_prefixes{};
  bool allow_writers{false};

  bool operator==(peer_grant_settings const& other) const = default;
};

inline constexpr std::chrono::milliseconds default_peer_hold_lease{15000};
inline constexpr std::chrono::milliseconds default_peer_renew_interval{3000};
inline constexpr std::chrono::milliseconds default_peer_keepalive{5000};

/// rmmd.conf's `peering`: daemons of other nodes (docs/configuration.md).
struct peering_settings {
  std::string node_name{};       ///< the file's, else the host name
  std::string listen_address{};  ///< empty: no peer listener
  std::optional<peer_tls_files> tls{};
  bool insecure_plaintext_for_tests{false};
  std::vector<peer_node_settings> peers{};
  std::vector<peer_grant_settings> grants{};
  std::chrono::milliseconds hold_lease{default_peer_hold_lease};
  std::chrono::milliseconds renew_interval{default_peer_renew_interval};
  std::chrono::milliseconds keepalive{default_peer_keepalive};

  /// Whether this daemon listens for peers or dials any.
  [[nodiscard]] bool enabled() const noexcept
  {
    return !listen_address.empty() || !peers.empty();
  }

  bool operator==(peering_settings const& other) const = default;
};

/// This host's name (gethostname), the default peering.node_name.
std::string host_name();

struct daemon_settings {
  /// Empty: $RMMD_RUNTIME_DIR, else /run/rmmd (see effective_runtime_dir).
  std::filesystem::path runtime_dir;
  std::optional<gid_t> socket_group;  ///< none: the daemon's own group
  std::string socket_group_name;      ///< as written, for messages
  mode_t runtime_dir_mode{0750};
  mode_t socket_mode{0660};
  /// Empty: see effective_state_file.
  std::filesystem::path state_file;

  /// Resolved ids. When the file names none: the daemon's euid, root and
  /// the `rmmd` group (if it exists), and access_is_default is true.
  core::access_policy access;
  bool access_is_default{true};

  /// In id order. Without pools in the file: one host pool "host" of 1 GiB
  /// and cuda_pool_per_gpu with its defaults.
  std::vector<pool_settings> pools;
  /// Set: after `pools`, one CUDA pool per GPU that CUDA sees (gpu0, gpu1...).
  std::optional<per_gpu_pools> cuda_pool_per_gpu{per_gpu_pools{}};

  core::quota_limits quotas;
  core::admission_limits admission;
  std::chrono::milliseconds drain_timeout{5000};
  std::chrono::milliseconds hello_timeout{2000};
  /// See core_options::reclaim_timeout.
  std::chrono::milliseconds reclaim_timeout{core::default_reclaim_timeout};
  /// See core_options::pack_up_to.
  std::size_t pack_up_to{core::default_pack_up_to};
  /// See core_options::tenancy (rmmd.conf's `tenancy`).
  core::tenancy_policy tenancy{};
  std::size_t max_message_bytes{64 * 1024};
  std::string metrics_address;  ///< "HOST:PORT"; empty: no metrics endpoint
  /// Sessions with metrics series of their own (the top ones by bytes).
  std::size_t metrics_top_sessions{10};
  log::level log_level{log::level::info};
  peering_settings peering;  ///< node_name: the host name unless the file says
};

/// The built-in settings: what the daemon runs with when no file exists.
daemon_settings default_settings();

/// The access policy used when none is configured: the daemon's own euid and
/// the `rmmd` group, if the system has one.
core::access_policy default_access();

/// $RMMD_RUNTIME_DIR if set, else `runtime_dir`, else /run/rmmd (the
/// daemon's --runtime-dir comes before all three).
std::filesystem::path effective_runtime_dir(daemon_settings const& settings);

/// `state_file` if set, else buffers.state in $STATE_DIRECTORY (its first
/// entry), else in effective_runtime_dir.
std::filesystem::path effective_state_file(daemon_settings const& settings);

/// A few lines for people: what the daemon would run with.
std::string summary(daemon_settings const& settings);

/// Why admission.max_<what>_per_uid (`per_uid`) may not exceed
/// admission.max_<what>_total (`total`); `what` is "pending" or "sessions".
std::string per_uid_above_total(std::string_view what, std::size_t per_uid, std::size_t total);

/// Human names: "0660", "info", "cuda", "automatic".
std::string mode_text(mode_t mode);
std::string_view level_name(log::level level);

}  // namespace rmmd::config
