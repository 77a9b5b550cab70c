#include "daemon/startup/daemon_flags.hpp"

#include "common/runtime_dir.hpp"
#include "daemon/core/types.hpp"
#include "daemon/version.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

namespace rmmd::startup {
namespace {

log::level parse_level(std::string const& name)
{
  if (name == "error") { return log::level::error; }
  if (name == "warning") { return log::level::warning; }
  if (name == "debug") { return log::level::debug; }
  return log::level::info;
}

void add_file_options(CLI::App& app, daemon_flags& flags)
{
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", "rmmd " + std::string(daemon_version()));
  app.add_option("--config",
                 flags.config_path,
                 "Configuration file (protobuf text format, see docs/configuration.md); if the "
                 "default one does not exist, the built-in defaults apply");
  app.add_option("--check-config",
                 flags.check_config_path,
                 "Check a configuration file (default: the one rmmd would read), print every "
                 "error as FILE:LINE:COL: message, and exit")
      ->expected(0, 1)
      ->capture_default_str();
  app.add_option("--runtime-dir",
                 flags.runtime_dir,
                 std::string("Directory for the sockets (default: $") + runtime::runtime_dir_env +
                     ", else the file's runtime_dir, else " + runtime::default_runtime_dir + ")");
  app.add_option("--state-file",
                 flags.state_file,
                 "The state file naming the buffers kept in systemd's fd store across a restart "
                 "(default: the file's state_file, else buffers.state in $STATE_DIRECTORY, else "
                 "in the runtime directory)");
  app.add_option("--probe-fabric", flags.probe_fabric_device, "(internal) fabric export probe")
      ->group("");
}

void add_pool_options(CLI::App& app, daemon_flags& flags)
{
  app.add_option("--backend",
                 flags.backend,
                 "auto: the configured pools (by default CUDA pools on every GPU when there is "
                 "one); host: no CUDA pools; cuda: fail without a GPU")
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.add_option("--cuda-pool-bytes",
                 flags.cuda_pool_bytes,
                 "Most bytes each CUDA pool may lend; 0: 80% of the GPU's free memory at start")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--cuda-release-threshold",
                 flags.cuda_release_threshold,
                 "Bytes a CUDA pool keeps reserved when idle")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--host-pool-bytes",
                 flags.host_pool_bytes,
                 "Size of the (first) shared host pool (e.g. 1GiB)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber);
  app.add_option("--fabric",
                 flags.fabric,
                 "Fabric handles on CUDA pools: auto (where proven to work), on (a pool without "
                 "them is not served), off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--cuda-shared-buffer-memory",
                 flags.shared_buffer_memory,
                 "Memory of shared buffers on CUDA pools: own (an allocation of its own, counted "
                 "in the pool; opens in 0.23 ms at 4 GiB on an H100) or pool (a pointer of the "
                 "pool, whose import grows with its size: 3.9 ms at 4 GiB; a buffer above "
                 "4 GiB is its own either way); docs/sharing.md")
      ->check(CLI::IsMember({"pool", "own"}));
  app.add_option("--keep-released-memory",
                 flags.keep_released_seconds,
                 "Seconds the daemon keeps address-stable memory a sleep or free gave back, for "
                 "the next address-stable allocation or wake of the same uid on the device (served "
                 "at once, where the driver takes about 2.4 ms per GiB to clear it); an allocation "
                 "that finds the device full takes it back first. 0 (the default): back to the "
                 "driver at once. Only where every GPU process of the node allocates through "
                 "rmmd; docs/sleep.md")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--host-pool-name", flags.host_pool_name, "Name of the (first) shared host pool");
  app.add_option("--host-pool-pinned",
                 flags.host_pool_pinned,
                 "Let clients page-lock the (first) host pool for GPU access: auto (on when a "
                 "CUDA pool is served), on, off. A pinnable pool keeps freed pages committed")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--cuda-pack-up-to",
                 flags.pack_up_to,
                 "CUDA pools: carve a client's direct allocations of at most this size out of a 2 "
                 "MiB block of its session's own, exported once (default 64KiB; 0: never)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{0}, core::default_pack_block_size));
}

void add_access_options(CLI::App& app, daemon_flags& flags)
{
  app.add_option("--allow-uid", flags.allow_uids, "A uid that may open sessions (repeatable)")
      ->delimiter(',');
  app.add_option(
         "--allow-gid", flags.allow_gids, "A gid whose members may open sessions (repeatable)")
      ->delimiter(',');
  app.add_option("--session-quota-bytes",
                 flags.session_quota_bytes,
                 "Bytes one session may hold; 0: no limit")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--uid-quota-bytes", flags.uid_quota_bytes, "Bytes one uid may hold; 0: no limit")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-pending-per-uid",
                 flags.admission.max_pending_per_uid,
                 "Connections of one uid that have not said hello yet; more are refused")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-pending-total",
                 flags.admission.max_pending_total,
                 "Connections of all uids that have not said hello yet; more are refused")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-sessions-per-uid",
                 flags.admission.max_sessions_per_uid,
                 "Open sessions of one uid; more are refused")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-sessions-total",
                 flags.admission.max_sessions_total,
                 "Open sessions of all uids; more are refused")
      ->check(CLI::Range(1, 1000000));
}

void add_timing_and_output_options(CLI::App& app, daemon_flags& flags)
{
  app.add_option("--hello-timeout-ms", flags.hello_timeout_ms, "Time a client has to say hello")
      ->check(CLI::Range(1, 600000));
  app.add_option("--max-message-bytes", flags.max_message_bytes, "Largest gRPC message accepted")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{4096}, std::size_t{0x7fffffff}));
  app.add_option("--drain-timeout-ms",
                 flags.drain_timeout_ms,
                 "Time live sessions get to finish after SIGTERM")
      ->check(CLI::Range(0, 3600000));
  app.add_option("--reclaim-timeout-ms",
                 flags.reclaim_timeout_ms,
                 "How long a request that finds its pool short waits for fast-path clients to "
                 "give back idle slabs (default 200; 0: refuse at once)")
      ->check(CLI::Range(0, 60000));
  app.add_option(
      "--metrics-address",
      flags.metrics_address,
      "Serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9400; port 0 "
      "picks one, which `rmmctl health` shows); empty: off");
  app.add_option("--metrics-top-sessions",
                 flags.metrics_top_sessions,
                 "Sessions with metrics series of their own, those holding the most bytes (the "
                 "rest are summed; every session counts in its uid's series); 0: none")
      ->check(CLI::Range(std::size_t{0}, std::size_t{10000}));
  app.add_option("--log-level", flags.log_level, "error, warning, info or debug")
      ->check(CLI::IsMember({"error", "warning", "info", "debug"}));
  app.add_flag("-v,--verbose", flags.verbose, "Log debug lines too (--log-level=debug)");
}

/// The options that set one field each (not the pools). False, after
/// saying why, if the admission limits no longer fit together.
bool apply_field_flags(CLI::App const& app, daemon_flags const& flags, config::daemon_settings& s)
{
  auto given = [&](char const* name) { return app.count(name) > 0; };
  if (given("--allow-uid") || given("--allow-gid")) {
    s.access            = core::access_policy{.uids = flags.allow_uids, .gids = flags.allow_gids};
    s.access_is_default = false;
  }
  if (given("--session-quota-bytes")) { s.quotas.per_session_bytes = flags.session_quota_bytes; }
  if (given("--uid-quota-bytes")) { s.quotas.per_uid_bytes = flags.uid_quota_bytes; }
  auto& a = s.admission;
  if (given("--max-pending-per-uid")) {
    a.max_pending_per_uid = flags.admission.max_pending_per_uid;
  }
  if (given("--max-pending-total")) { a.max_pending_total = flags.admission.max_pending_total; }
  if (given("--max-sessions-per-uid")) {
    a.max_sessions_per_uid = flags.admission.max_sessions_per_uid;
  }
  if (given("--max-sessions-total")) { a.max_sessions_total = flags.admission.max_sessions_total; }
  if (a.max_pending_per_uid > a.max_pending_total) {
    log::error("%s",
               config::per_uid_above_total("pending", a.max_pending_per_uid, a.max_pending_total));
    return false;
  }
  if (a.max_sessions_per_uid > a.max_sessions_total) {
    log::error(
        "%s",
        config::per_uid_above_total("sessions", a.max_sessions_per_uid, a.max_sessions_total));
    return false;
  }
  using std::chrono::milliseconds;
  if (given("--hello-timeout-ms")) { s.hello_timeout = milliseconds(flags.hello_timeout_ms); }
  if (given("--max-message-bytes")) { s.max_message_bytes = flags.max_message_bytes; }
  if (given("--drain-timeout-ms")) { s.drain_timeout = milliseconds(flags.drain_timeout_ms); }
  if (given("--reclaim-timeout-ms")) { s.reclaim_timeout = milliseconds(flags.reclaim_timeout_ms); }
  if (given("--cuda-pack-up-to")) { s.pack_up_to = flags.pack_up_to; }
  if (given("--metrics-address")) { s.metrics_address = flags.metrics_address; }
  if (given("--state-file")) {
    if (!std::filesystem::path(flags.state_file).is_absolute()) {
      log::error("--state-file %s: give an absolute path", flags.state_file);
      return false;
    }
    s.state_file = flags.state_file;
  }
  if (given("--metrics-top-sessions")) { s.metrics_top_sessions = flags.metrics_top_sessions; }
  if (given("--log-level")) { s.log_level = parse_level(flags.log_level); }
  if (flags.verbose) { s.log_level = log::level::debug; }
  // The sockets' directory: --runtime-dir, else $RMMD_RUNTIME_DIR, else the file's, else /run/rmmd.
  s.runtime_dir = given("--runtime-dir") ? std::filesystem::path(flags.runtime_dir)
                                         : config::effective_runtime_dir(s);
  return true;
}

/// The pool options: the host ones apply to the first host pool, the CUDA
/// ones to every CUDA pool (those listed and those made per GPU).
bool apply_pool_flags(CLI::App const& app, daemon_flags const& flags, config::daemon_settings& s)
{
  auto given      = [&](char const* name) { return app.count(name) > 0; };
  auto first_host = std::find_if(s.pools.begin(), s.pools.end(), [](auto const& p) {
    return p.backend == config::pool_kind::host;
  });
  if ((given("--host-pool-bytes") || given("--host-pool-name")) && first_host == s.pools.end()) {
    log::error(
        "--host-pool-bytes / --host-pool-name: the configuration lists no host pool to apply them "
        "to; add one to the file or drop the option");
    return false;
  }
  if (given("--host-pool-bytes")) { first_host->capacity_bytes = flags.host_pool_bytes; }
  if (given("--host-pool-name")) { first_host->name = flags.host_pool_name; }
  if (given("--host-pool-pinned")) {
    if (first_host == s.pools.end()) {
      log::error("--host-pool-pinned: the configuration lists no host pool to apply it to");
      return false;
    }
    first_host->pinnable = flags.host_pool_pinned == "auto"
                               ? std::nullopt
                               : std::optional<bool>(flags.host_pool_pinned == "on");
  }
  if (flags.backend == "host") {
    std::erase_if(s.pools, [](auto const& p) { return p.backend == config::pool_kind::cuda; });
    s.cuda_pool_per_gpu.reset();
  }
  for (auto& p : s.pools) {
    if (p.backend != config::pool_kind::cuda) { continue; }
    if (given("--cuda-pool-bytes")) { p.limit_bytes = flags.cuda_pool_bytes; }
    if (given("--cuda-release-threshold")) {
      p.release_threshold_bytes = flags.cuda_release_threshold;
    }
    if (given("--fabric")) { p.fabric = fabric_mode(flags.fabric); }
  }
  if (s.cuda_pool_per_gpu) {
    auto& g = *s.cuda_pool_per_gpu;
    for (auto& o : g.overrides) {  // the options win over the file, everywhere
      if (given("--cuda-pool-bytes")) { o.limit_bytes.reset(); }
      if (given("--cuda-release-threshold")) { o.release_threshold_bytes.reset(); }
      if (given("--fabric")) { o.fabric.reset(); }
    }
    if (given("--cuda-pool-bytes")) { g.limit_bytes = flags.cuda_pool_bytes; }
    if (given("--cuda-release-threshold")) {
      g.release_threshold_bytes = flags.cuda_release_threshold;
    }
    if (given("--fabric")) { g.fabric = fabric_mode(flags.fabric); }
  }
  auto twice = std::find_if(s.pools.begin(), s.pools.end(), [&](auto const& p) {
    return std::count_if(
               s.pools.begin(), s.pools.end(), [&](auto const& q) { return q.name == p.name; }) > 1;
  });
  if (twice != s.pools.end()) {
    log::error("two pools are named '%s' once the options are applied; rename one", twice->name);
    return false;
  }
  return true;
}

}  // namespace

void add_options(CLI::App& app, daemon_flags& flags)
{
  add_file_options(app, flags);
  add_pool_options(app, flags);
  add_access_options(app, flags);
  add_timing_and_output_options(app, flags);
}

bool apply_flags(CLI::App const& app, daemon_flags const& flags, config::daemon_settings& s)
{
  return apply_field_flags(app, flags, s) && apply_pool_flags(app, flags, s);
}

config::fabric_mode fabric_mode(std::string const& flag)
{
  if (flag == "on") { return config::fabric_mode::required; }
  if (flag == "off") { return config::fabric_mode::off; }
  return config::fabric_mode::automatic;
}

}  // namespace rmmd::startup
