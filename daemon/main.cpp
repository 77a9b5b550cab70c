// rmmd: flags and configuration, wiring, signals, sd_notify. Nothing else lives here.

#include "daemon/backends/cuda/cuda_backend.hpp"
#include "daemon/backends/cuda/fabric_probe.hpp"
#include "daemon/backends/host/host_backend.hpp"
#include "daemon/config/config_loader.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/library_logs.hpp"
#include "daemon/log.hpp"
#include "daemon/metrics/metrics_server.hpp"
#include "daemon/service/rmmd_service.hpp"
#include "daemon/session/session_listener.hpp"
#include "tools/gpu/gpu_identity.hpp"
#include "tools/runtime/runtime_dir.hpp"

#include <grpcpp/grpcpp.h>
#include <systemd/sd-daemon.h>
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace fs     = std::filesystem;
namespace config = rmmd::config;
using namespace std::chrono_literals;

/// What the command line says. Options that set a configuration field
/// override that field of the file (only when given).
struct daemon_flags {
  std::string config_path{config::default_config_path};
  std::string check_config_path;
  std::string runtime_dir;
  std::string backend{"auto"};
  std::size_t cuda_pool_bytes{};
  std::size_t cuda_release_threshold{};
  std::string fabric{"auto"};
  std::string shared_buffer_memory{"own"};
  int probe_fabric_device{-1};
  std::size_t host_pool_bytes{config::default_host_pool_bytes};
  std::string host_pool_name{"host"};
  std::string host_pool_pinned{"auto"};
  std::vector<uid_t> allow_uids;
  std::vector<gid_t> allow_gids;
  std::size_t session_quota_bytes{};
  std::size_t uid_quota_bytes{};
  rmmd::session::admission_limits admission{};
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

/// The configuration file the daemon reads: --config, else the default path
/// (whose absence means the built-in defaults).
struct config_source {
  fs::path path;
  bool explicit_path{false};
};

/// Loads the file (or the built-in defaults when the default file is absent).
/// `present` says whether a file was read.
config::load_result load_settings(config_source const& source, bool* present = nullptr)
{
  std::error_code ec;
  bool const exists = fs::exists(source.path, ec);
  if (present != nullptr) { *present = exists; }
  if (!exists && !source.explicit_path) {
    return config::load_result{.settings = config::default_settings(), .errors = {}};
  }
  return config::load_config_file(source.path);
}

/// --check-config: every error as FILE:LINE:COL: message (exit 1), or a
/// summary (exit 0).
int check_config(config_source const& source)
{
  bool present = false;
  auto result  = load_settings(source, &present);
  if (!result.ok()) {
    for (auto const& e : result.errors) {
      std::fprintf(stderr, "%s\n", config::format_error(source.path, e).c_str());
    }
    std::fprintf(stderr,
                 "%s: %zu error(s); rmmd would not start with this file\n",
                 source.path.c_str(),
                 result.errors.size());
    return 1;
  }
  if (present) {
    std::printf("%s: OK\n", source.path.c_str());
  } else {
    std::printf("%s: no such file; rmmd runs with the built-in defaults\n", source.path.c_str());
  }
  std::printf("%s", config::summary(*result.settings).c_str());
  return 0;
}

rmmd::log::level parse_level(std::string const& name)
{
  if (name == "error") { return rmmd::log::level::error; }
  if (name == "warning") { return rmmd::log::level::warning; }
  if (name == "debug") { return rmmd::log::level::debug; }
  return rmmd::log::level::info;
}

/// --fabric auto|on|off.
config::fabric_mode fabric_mode(std::string const& flag)
{
  if (flag == "on") { return config::fabric_mode::required; }
  if (flag == "off") { return config::fabric_mode::off; }
  return config::fabric_mode::automatic;
}

/// Applies the options given on the command line over the file's settings.
/// False, after saying why, if an option does not fit the configuration.
bool apply_flags(CLI::App const& app, daemon_flags const& flags, config::daemon_settings& s)
{
  auto given = [&](char const* name) { return app.count(name) > 0; };
  if (given("--allow-uid") || given("--allow-gid")) {
    s.access = rmmd::core::access_policy{.uids = flags.allow_uids, .gids = flags.allow_gids};
    s.access_is_default = false;
  }
  if (given("--session-quota-bytes")) { s.quotas.per_session_bytes = flags.session_quota_bytes; }
  if (given("--uid-quota-bytes")) { s.quotas.per_uid_bytes = flags.uid_quota_bytes; }
  if (given("--max-pending-per-uid")) {
    s.admission.max_pending_per_uid = flags.admission.max_pending_per_uid;
  }
  if (given("--max-pending-total")) {
    s.admission.max_pending_total = flags.admission.max_pending_total;
  }
  if (given("--max-sessions-per-uid")) {
    s.admission.max_sessions_per_uid = flags.admission.max_sessions_per_uid;
  }
  if (given("--max-sessions-total")) {
    s.admission.max_sessions_total = flags.admission.max_sessions_total;
  }
  auto const& a = s.admission;
  if (a.max_pending_per_uid > a.max_pending_total) {
    rmmd::log::error(
        "%s", config::per_uid_above_total("pending", a.max_pending_per_uid, a.max_pending_total));
    return false;
  }
  if (a.max_sessions_per_uid > a.max_sessions_total) {
    rmmd::log::error(
        "%s",
        config::per_uid_above_total("sessions", a.max_sessions_per_uid, a.max_sessions_total));
    return false;
  }
  if (given("--hello-timeout-ms")) {
    s.hello_timeout = std::chrono::milliseconds(flags.hello_timeout_ms);
  }
  if (given("--max-message-bytes")) { s.max_message_bytes = flags.max_message_bytes; }
  if (given("--drain-timeout-ms")) {
    s.drain_timeout = std::chrono::milliseconds(flags.drain_timeout_ms);
  }
  if (given("--reclaim-timeout-ms")) {
    s.reclaim_timeout = std::chrono::milliseconds(flags.reclaim_timeout_ms);
  }
  if (given("--cuda-pack-up-to")) { s.pack_up_to = flags.pack_up_to; }
  if (given("--metrics-address")) { s.metrics_address = flags.metrics_address; }
  if (given("--metrics-top-sessions")) { s.metrics_top_sessions = flags.metrics_top_sessions; }
  if (given("--log-level")) { s.log_level = parse_level(flags.log_level); }
  if (flags.verbose) { s.log_level = rmmd::log::level::debug; }

  // Pools: the host options apply to the first host pool, the CUDA options to
  // every CUDA pool (those listed and those made per GPU).
  auto first_host = std::find_if(s.pools.begin(), s.pools.end(), [](auto const& p) {
    return p.backend == rmmd::core::backend_kind::host;
  });
  if ((given("--host-pool-bytes") || given("--host-pool-name")) && first_host == s.pools.end()) {
    rmmd::log::error(
        "--host-pool-bytes / --host-pool-name: the configuration lists no host pool to apply them "
        "to; add one to the file or drop the option");
    return false;
  }
  if (given("--host-pool-bytes")) { first_host->capacity_bytes = flags.host_pool_bytes; }
  if (given("--host-pool-name")) { first_host->name = flags.host_pool_name; }
  if (given("--host-pool-pinned")) {
    if (first_host == s.pools.end()) {
      rmmd::log::error("--host-pool-pinned: the configuration lists no host pool to apply it to");
      return false;
    }
    first_host->pinnable = flags.host_pool_pinned == "auto"
                               ? std::nullopt
                               : std::optional<bool>(flags.host_pool_pinned == "on");
  }
  if (flags.backend == "host") {
    std::erase_if(s.pools,
                  [](auto const& p) { return p.backend == rmmd::core::backend_kind::cuda; });
    s.gpu_pool_per_device = false;
  }
  for (auto& p : s.pools) {
    if (p.backend != rmmd::core::backend_kind::cuda) { continue; }
    if (given("--cuda-pool-bytes")) { p.limit_bytes = flags.cuda_pool_bytes; }
    if (given("--cuda-release-threshold")) {
      p.release_threshold_bytes = flags.cuda_release_threshold;
    }
    if (given("--fabric")) { p.fabric = fabric_mode(flags.fabric); }
  }
  // The sockets' directory: --runtime-dir, else $RMMD_RUNTIME_DIR, else the file's, else /run/rmmd.
  s.runtime_dir =
      given("--runtime-dir") ? fs::path(flags.runtime_dir) : config::effective_runtime_dir(s);
  auto names = std::find_if(s.pools.begin(), s.pools.end(), [&](auto const& p) {
    return std::count_if(
               s.pools.begin(), s.pools.end(), [&](auto const& q) { return q.name == p.name; }) > 1;
  });
  if (names != s.pools.end()) {
    rmmd::log::error("two pools are named '%s' once the options are applied; rename one",
                     names->name);
    return false;
  }
  return true;
}

/// The pools as they will be made: the configured ones, then one per GPU
/// where the configuration asks for it.
std::vector<config::pool_settings> pool_plan(config::daemon_settings const& s,
                                             daemon_flags const& flags)
{
  auto plan = s.pools;
  if (!s.gpu_pool_per_device) { return plan; }
  for (int device = 0; device < rmmd::backends::cuda::device_count(); ++device) {
    config::pool_settings p{.name    = "gpu" + std::to_string(device),
                            .backend = rmmd::core::backend_kind::cuda,
                            .device  = device};
    p.limit_bytes             = flags.cuda_pool_bytes;
    p.release_threshold_bytes = flags.cuda_release_threshold;
    p.fabric                  = fabric_mode(flags.fabric);
    plan.push_back(std::move(p));
  }
  return plan;
}

/// A CUDA pool backend; if its fabric export fails even though the probe
/// passed, says so and makes a posix-fd-only pool instead.
std::unique_ptr<rmmd::backends::cuda::cuda_backend> make_cuda_backend(
    rmmd::backends::cuda::cuda_pool_options options)
{
  try {
    return std::make_unique<rmmd::backends::cuda::cuda_backend>(options);
  } catch (std::exception const& e) {
    if (!options.fabric) { throw; }
    rmmd::log::warn(
        "device %d: %s; serving its pool with posix-fd export only", options.device, e.what());
    options.fabric = false;
    return std::make_unique<rmmd::backends::cuda::cuda_backend>(options);
  }
}

/// Adds a host pool; `gpus`: the GPUs this daemon serves CUDA pools on.
bool add_host_pool(rmmd::core::daemon_core& core, config::pool_settings const& p, int gpus)
{
  // Clients may pin a pinnable pool (rmmd::pinned_host_memory_resource), which
  // rules out punching holes in it.
  bool const pinnable = p.pinnable.value_or(gpus > 0);
  try {
    core.add_pool(
        rmmd::core::pool_config{.name         = p.name,
                                .device       = -1,
                                .handle_types = {rmmd::core::handle_type::host_offset},
                                .pinnable     = pinnable},
        std::make_unique<rmmd::backends::host::host_backend>(p.name, p.capacity_bytes, pinnable));
    rmmd::log::info("pool '%s': shared host memory, %d bytes%s",
                    p.name,
                    p.capacity_bytes,
                    pinnable ? ", pinnable by clients (freed pages stay committed)" : "");
    return true;
  } catch (std::exception const& e) {
    rmmd::log::error(
        "cannot create the host pool '%s' of %d bytes: %s", p.name, p.capacity_bytes, e.what());
    return false;
  }
}

/// Adds a CUDA pool. False, after saying why, if it cannot be made; true
/// also when it is skipped because fabric handles are required and missing.
bool add_cuda_pool(rmmd::core::daemon_core& core,
                   config::pool_settings p,
                   int gpus,
                   bool vmm_buffers)
{
  namespace cuda = rmmd::backends::cuda;
  if (!p.gpu.empty()) {
    // The configured UUID or PCI bus id, found among the GPUs this process
    // sees (its own CUDA_VISIBLE_DEVICES decides their ordinals).
    std::string seen;
    p.device = -1;
    for (int d = 0; d < gpus && p.device < 0; ++d) {
      auto id = rmmd::gpu::identify(d);
      if (id && rmmd::gpu::names(*id, p.gpu)) { p.device = d; }
      if (id) { seen += (seen.empty() ? "" : ", ") + id->uuid + " (" + id->pci_bus_id + ")"; }
    }
    if (p.device < 0) {
      rmmd::log::error("pool '%s': no GPU %s among those CUDA shows this daemon: %s",
                       p.name,
                       p.gpu,
                       seen.empty() ? std::string("none") : seen);
      return false;
    }
  }
  if (p.device >= gpus) {
    rmmd::log::error(
        "pool '%s': CUDA device %d does not exist (CUDA sees %d GPU(s); nvidia-smi "
        "lists them)",
        p.name,
        p.device,
        gpus);
    return false;
  }
  bool fabric = false;
  if (p.fabric != config::fabric_mode::off) {
    std::error_code ec;
    auto const self = fs::read_symlink("/proc/self/exe", ec);
    if (ec) {
      rmmd::log::error(
          "pool '%s': cannot find rmmd's own program to probe fabric handles "
          "(/proc/self/exe: %s)",
          p.name,
          ec.message());
      return false;
    }
    auto support = cuda::probe_fabric(p.device, self);
    fabric       = support.usable;
    if (!fabric && p.fabric == config::fabric_mode::required) {
      rmmd::log::error(
          "pool '%s' is not served: it requires fabric handles, but %s", p.name, support.reason);
      return true;
    }
    if (!fabric) {
      rmmd::log::warn("pool '%s': no fabric handles, posix-fd only: %s", p.name, support.reason);
    }
  }
  try {
    std::size_t capacity = p.limit_bytes;
    if (capacity == 0) {
      std::size_t free = 0, total = 0;
      cudaSetDevice(p.device);
      if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        throw std::runtime_error("cudaMemGetInfo failed");
      }
      capacity = free / 10 * 8;
    }
    if (p.release_threshold_bytes > capacity || p.initial_size_bytes > capacity) {
      rmmd::log::error(
          "pool '%s': its release threshold (%d bytes) and initial size (%d bytes) must not "
          "exceed its limit of %d bytes",
          p.name,
          p.release_threshold_bytes,
          p.initial_size_bytes,
          capacity);
      return false;
    }
    auto backend =
        make_cuda_backend(cuda::cuda_pool_options{.device            = p.device,
                                                  .capacity          = capacity,
                                                  .release_threshold = p.release_threshold_bytes,
                                                  .initial_size      = p.initial_size_bytes,
                                                  .fabric            = fabric,
                                                  .vmm_buffers       = vmm_buffers});
    fabric = !backend->fabric_handle().empty();  // the fallback may have dropped it
    std::vector<rmmd::core::handle_type> types{rmmd::core::handle_type::posix_fd};
    if (fabric) { types.push_back(rmmd::core::handle_type::fabric); }
    auto const gpu = rmmd::gpu::identify(p.device).value_or(rmmd::gpu::identity{});
    core.add_pool(rmmd::core::pool_config{.name          = p.name,
                                          .device        = p.device,
                                          .gpu_uuid      = gpu.uuid,
                                          .pci_bus_id    = gpu.pci_bus_id,
                                          .handle_types  = types,
                                          .limit_bytes   = capacity,
                                          .max_alignment = 256},
                  std::move(backend));
    rmmd::log::info("pool '%s': CUDA device %d (%s, %s), %s export, up to %d bytes",
                    p.name,
                    p.device,
                    gpu.uuid,
                    gpu.pci_bus_id,
                    fabric ? "posix-fd and fabric" : "posix-fd",
                    capacity);
    return true;
  } catch (std::exception const& e) {
    rmmd::log::error(
        "cannot create the CUDA pool '%s' on device %d: %s", p.name, p.device, e.what());
    return false;
  }
}

/// Makes the pools in order. False, after saying why, if one that must exist cannot.
bool add_pools(rmmd::core::daemon_core& core,
               std::vector<config::pool_settings> const& plan,
               std::string const& backend_flag,
               bool vmm_buffers)
{
  bool const any_cuda = std::any_of(plan.begin(), plan.end(), [](auto const& p) {
    return p.backend == rmmd::core::backend_kind::cuda;
  });
  int const gpus = any_cuda || backend_flag == "cuda" ? rmmd::backends::cuda::device_count() : 0;
  if (backend_flag == "cuda" && gpus == 0) {
    rmmd::log::error("--backend=cuda, but CUDA sees no GPU (is the driver loaded? nvidia-smi)");
    return false;
  }
  if (!any_cuda && backend_flag == "auto") {
    rmmd::log::info("no CUDA pool: no GPU found, or none configured");
  }
  for (auto const& p : plan) {
    bool ok = p.backend == rmmd::core::backend_kind::host
                  ? add_host_pool(core, p, gpus)
                  : add_cuda_pool(core, p, gpus, vmm_buffers);
    if (!ok) { return false; }
  }
  if (core.pools().empty()) {
    rmmd::log::error("no pool could be served; see the lines above");
    return false;
  }
  return true;
}

/// Takes the runtime directory for this process: an exclusive lock on
/// DIR/rmmd.lock, held by the open fd until the process ends, however it
/// ends (SIGKILL included). The socket files that a killed rmmd left behind
/// are replaced at start; a live rmmd's must not be: the second daemon would
/// take over the sockets while the first went on serving its sessions unseen,
/// both lending the same memory. Returns the fd, or -1 after saying why.
int lock_runtime_dir(fs::path const& dir)
{
  auto const path = dir / "rmmd.lock";
  int fd          = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    rmmd::log::error("cannot open %s: %s", path.string(), std::strerror(errno));
    return -1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int const err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      rmmd::log::error(
          "another rmmd is running with the runtime directory %s (it holds %s); stop it "
          "first, or give this one another --runtime-dir",
          dir.string(),
          path.string());
    } else {
      rmmd::log::error("cannot lock %s: %s", path.string(), std::strerror(err));
    }
    return -1;
  }
  return fd;
}

/// Gives `path` to the socket group (if one is configured). False after saying why.
bool give_to_group(fs::path const& path, config::daemon_settings const& s)
{
  if (!s.socket_group) { return true; }
  if (::chown(path.c_str(), static_cast<uid_t>(-1), *s.socket_group) != 0) {
    rmmd::log::error("cannot give %s to group %s (gid %d): %s; run rmmd as a member of that group",
                     path.string(),
                     s.socket_group_name,
                     *s.socket_group,
                     std::strerror(errno));
    return false;
  }
  return true;
}

/// What a reload may change without a restart.
void log_restart_only_changes(config::daemon_settings const& now,
                              config::daemon_settings const& next)
{
  auto needs_restart = [](char const* what) {
    rmmd::log::warn("reload: %s changed; that needs a restart and is ignored until then", what);
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

std::uint64_t monotonic_usec()
{
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000 +
         static_cast<std::uint64_t>(ts.tv_nsec) / 1000;
}

/// Waits for one of `signals` for at most `timeout`; 0 when none came.
int wait_signal(sigset_t const& signals, std::chrono::milliseconds timeout)
{
  auto const s = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{.tv_sec  = static_cast<time_t>(s.count()),
              .tv_nsec = static_cast<long>((timeout - s).count() * 1'000'000)};
  siginfo_t info{};
  int sig = ::sigtimedwait(&signals, &info, &ts);
  return sig < 0 ? 0 : sig;
}

}  // namespace

int main(int argc, char** argv)
{
  daemon_flags flags;
  CLI::App app{"rmmd: lends memory from node-wide pools to the processes of this node"};
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", "rmmd " + std::string(rmmd::service::daemon_version()));
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
                 std::string("Directory for the sockets (default: $") +
                     rmmd::runtime::runtime_dir_env + ", else the file's runtime_dir, else " +
                     rmmd::runtime::default_runtime_dir + ")");
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
                 "pool, whose import grows with its size: 3.9 ms at 4 GiB); docs/sharing.md")
      ->check(CLI::IsMember({"pool", "own"}));
  app.add_option("--probe-fabric", flags.probe_fabric_device, "(internal) fabric export probe")
      ->group("");
  app.add_option("--host-pool-name", flags.host_pool_name, "Name of the (first) shared host pool");
  app.add_option("--host-pool-pinned",
                 flags.host_pool_pinned,
                 "Let clients page-lock the (first) host pool for GPU access: auto (on when a "
                 "CUDA pool is served), on, off. A pinnable pool keeps freed pages committed")
      ->check(CLI::IsMember({"auto", "on", "off"}));
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
  app.add_option("--cuda-pack-up-to",
                 flags.pack_up_to,
                 "CUDA pools: carve a client's direct allocations of at most this size out of a 2 "
                 "MiB block of its session's own, exported once (default 64KiB; 0: never)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{0}, rmmd::core::default_pack_block_size));
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
  CLI11_PARSE(app, argc, argv);
  // Before anything can make protobuf or gRPC log: their lines are ours too.
  rmmd::log::route_library_logs();
  if (flags.probe_fabric_device >= 0) {
    rmmd::backends::cuda::run_fabric_probe(flags.probe_fabric_device);
  }

  config_source const source{.path = flags.config_path, .explicit_path = app.count("--config") > 0};
  if (app.count("--check-config") > 0) {
    if (flags.check_config_path.empty()) { return check_config(source); }
    return check_config(config_source{.path = flags.check_config_path, .explicit_path = true});
  }

  auto loaded = load_settings(source);
  if (!loaded.ok()) {
    for (auto const& e : loaded.errors) {
      rmmd::log::error("%s", config::format_error(source.path, e));
    }
    rmmd::log::error(
        "%s has errors (listed above); not starting. `rmmd --check-config %s` "
        "checks it",
        source.path.string(),
        source.path.string());
    return 1;
  }
  auto settings = *std::move(loaded.settings);
  if (!apply_flags(app, flags, settings)) { return 1; }
  rmmd::log::threshold = settings.log_level;
  rmmd::log::set_library_log_level(settings.log_level);

  // Every thread inherits this mask: the signals are taken by sigtimedwait below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  fs::path const dir = settings.runtime_dir;
  try {
    if (!fs::exists(dir)) {
      fs::create_directories(dir);
      fs::permissions(dir, static_cast<fs::perms>(settings.runtime_dir_mode));
      if (!give_to_group(dir, settings)) { return 1; }
    }
  } catch (fs::filesystem_error const& e) {
    rmmd::log::error("cannot create the runtime directory %s: %s", dir.string(), e.what());
    return 1;
  }
  // Held until the process ends: never closed.
  if (lock_runtime_dir(dir) < 0) { return 1; }

  rmmd::core::daemon_core core(rmmd::core::core_options{.access          = settings.access,
                                                        .quotas          = settings.quotas,
                                                        .reclaim_timeout = settings.reclaim_timeout,
                                                        .pack_up_to      = settings.pack_up_to});
  if (!add_pools(
          core, pool_plan(settings, flags), flags.backend, flags.shared_buffer_memory == "own")) {
    return 1;
  }

  auto const grpc_path = dir / "rmmd.sock";
  rmmd::service::rmmd_service service(core);

  // Prometheus metrics: off unless metrics_address (file or --metrics-address).
  rmmd::metrics::admission_metrics admission_metrics;
  // A reload may change how many sessions it shows.
  std::atomic<std::size_t> metrics_top_sessions{settings.metrics_top_sessions};
  std::unique_ptr<rmmd::metrics::metrics_server> metrics;
  if (!settings.metrics_address.empty()) {
    try {
      metrics = std::make_unique<rmmd::metrics::metrics_server>(
          settings.metrics_address, [&service, &admission_metrics, &metrics_top_sessions] {
            auto snapshot      = service.metrics_snapshot();
            snapshot.admission = admission_metrics.snapshot();
            return render_prometheus(
                snapshot,
                rmmd::metrics::render_options{.top_sessions = metrics_top_sessions.load()});
          });
    } catch (std::exception const& e) {
      rmmd::log::error("metrics_address %s: %s", settings.metrics_address, e.what());
      return 1;
    }
    service.set_metrics_address(metrics->address());
    rmmd::log::info("metrics: http://%s/metrics", metrics->address());
  }

  grpc::ServerBuilder builder;
  ::unlink(grpc_path.c_str());
  builder.AddListeningPort("unix:" + grpc_path.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(settings.max_message_bytes));
  // The sync server's threads notice a shutdown only when their completion
  // queue poll times out (1 s by default): poll more often so SIGTERM is quick.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 50);
  auto server = builder.BuildAndStart();
  if (!server) {
    rmmd::log::error("cannot listen on %s (is another rmmd running?)", grpc_path.string());
    return 1;
  }
  if (::chmod(grpc_path.c_str(), settings.socket_mode) != 0 ||
      !give_to_group(grpc_path, settings)) {
    rmmd::log::error("cannot set the mode or group of %s", grpc_path.string());
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }

  auto const session_path = dir / "rmmd-session.sock";
  rmmd::session::session_listener listener(
      core,
      rmmd::session::listener_options{
          .socket_path       = session_path,
          .hello_deadline    = settings.hello_timeout,
          .admission         = settings.admission,
          .max_message_bytes = static_cast<std::uint32_t>(settings.max_message_bytes),
          .socket_mode       = settings.socket_mode,
          .call_metrics      = &service.session_call_metrics(),
          .admission_metrics = &admission_metrics});
  try {
    listener.start();
  } catch (std::exception const& e) {
    rmmd::log::error("cannot listen on the session socket: %s", e.what());
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  if (!give_to_group(session_path, settings)) {
    listener.stop();
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }

  auto const pool_count = core.pools().size();
  rmmd::log::info("ready: %d pool(s), sockets in %s", pool_count, dir.string());
  ::sd_notifyf(0, "READY=1\nSTATUS=serving %zu pool(s), 0 session(s)", pool_count);

  // The status line follows the session count; checked once a second.
  std::size_t shown_sessions = 0;
  auto show_status           = [&](bool always) {
    auto n = listener.open_sessions();
    if (!always && n == shown_sessions) { return; }
    shown_sessions = n;
    ::sd_notifyf(0, "STATUS=serving %zu pool(s), %zu session(s)", pool_count, n);
  };

  auto reload = [&] {
    ::sd_notifyf(
        0, "RELOADING=1\nMONOTONIC_USEC=%llu", static_cast<unsigned long long>(monotonic_usec()));
    auto next = load_settings(source);
    if (next.ok() && !apply_flags(app, flags, *next.settings)) {
      next.errors.push_back(
          config::config_error{.message = "the command line options do not fit it"});
    }
    if (!next.ok()) {
      for (auto const& e : next.errors) {
        rmmd::log::error("reload: %s", config::format_error(source.path, e));
      }
      rmmd::log::error("reload: %s is rejected; the current settings stay", source.path.string());
    } else {
      auto const& s = *next.settings;
      log_restart_only_changes(settings, s);
      core.reconfigure({.access          = s.access,
                        .quotas          = s.quotas,
                        .reclaim_timeout = s.reclaim_timeout,
                        .pack_up_to      = s.pack_up_to});
      listener.set_admission_limits(s.admission);
      rmmd::log::threshold = s.log_level;
      rmmd::log::set_library_log_level(s.log_level);
      settings.access               = s.access;
      settings.quotas               = s.quotas;
      settings.admission            = s.admission;
      settings.log_level            = s.log_level;
      settings.drain_timeout        = s.drain_timeout;
      settings.metrics_top_sessions = s.metrics_top_sessions;
      metrics_top_sessions          = s.metrics_top_sessions;
      rmmd::log::info(
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
    ::sd_notify(0, "READY=1");
    show_status(true);
  };

  int sig = 0;
  while (sig != SIGTERM && sig != SIGINT) {
    sig = wait_signal(signals, 1s);
    if (sig == SIGHUP) { reload(); }
    show_status(false);
    // What the rate limits held back since, said once a second at most.
    rmmd::log::report_suppressed();
  }
  rmmd::log::info("%s: draining", ::strsignal(sig));

  // Phase 1: no new sessions; live ones carry on (allocate, free) until they
  // end or the drain deadline passes. Another SIGTERM/SIGINT cuts it short.
  // EXTEND_TIMEOUT_USEC: systemd's stop timeout covers the drain deadline
  // (plus time to reclaim), whatever TimeoutStopSec says.
  // Sessions are refused before anyone hears STOPPING=1: the core refuses a
  // hello still in flight, the listener accepts no more connections.
  core.stop_new_sessions();  // Health and the metrics say "draining" from now on
  listener.stop_accepting();
  ::sd_notifyf(0,
               "STOPPING=1\nEXTEND_TIMEOUT_USEC=%llu",
               static_cast<unsigned long long>(
                   std::chrono::microseconds(settings.drain_timeout + 10s).count()));
  auto const deadline = std::chrono::steady_clock::now() + settings.drain_timeout;
  if (auto n = listener.open_sessions(); n > 0) {
    rmmd::log::info(
        "waiting up to %d ms for %d session(s) to end", settings.drain_timeout.count(), n);
  }
  std::size_t last_left = 0;
  while (true) {
    auto const left = listener.open_sessions();
    auto const now  = std::chrono::steady_clock::now();
    if (left == 0) { break; }
    if (now >= deadline) {
      rmmd::log::warn("drain deadline passed with %d session(s) open; closing them", left);
      break;
    }
    if (left != last_left) {
      last_left = left;
      ::sd_notifyf(0,
                   "STATUS=draining: %zu session(s) left, %lld ms to the deadline",
                   left,
                   static_cast<long long>(
                       std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count()));
    }
    // Sessions end on the listener's call threads; look again every 20 ms.
    auto const s =
        wait_signal(signals,
                    std::min<std::chrono::milliseconds>(
                        20ms, std::chrono::ceil<std::chrono::milliseconds>(deadline - now)));
    if (s == SIGTERM || s == SIGINT) {
      rmmd::log::warn("%s again: closing %d session(s) now", ::strsignal(s), left);
      break;
    }
    if (s == SIGHUP) { rmmd::log::info("SIGHUP while draining: ignored"); }
  }

  // Phase 2: refuse what is left, end the gRPC server, reclaim. Every session
  // has ended (or its time is up), so calls still in flight are cancelled at
  // once: a deadline here would be waited in full while any client keeps its
  // channel open, even an idle one.
  ::sd_notify(0, "STATUS=stopping");
  core.begin_drain();
  server->Shutdown(std::chrono::system_clock::now());
  listener.stop();
  core.close_all_sessions();
  ::unlink(grpc_path.c_str());
  rmmd::log::report_suppressed();
  rmmd::log::info("stopped");
  return 0;
}
