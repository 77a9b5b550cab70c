// rmmd: flags, wiring, signals, sd_notify. Nothing else lives here.

#include "daemon/backends/cuda/cuda_backend.hpp"
#include "daemon/backends/cuda/fabric_probe.hpp"
#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/log.hpp"
#include "daemon/metrics/metrics_server.hpp"
#include "daemon/service/rmmd_service.hpp"
#include "daemon/session/session_listener.hpp"

#include <grpcpp/grpcpp.h>
#include <systemd/sd-daemon.h>
#include <CLI/CLI.hpp>

#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

struct daemon_flags {
  std::string runtime_dir;
  std::string backend{"auto"};
  std::size_t cuda_pool_bytes{};
  std::size_t cuda_release_threshold{};
  std::string fabric{"auto"};
  int probe_fabric_device{-1};
  std::size_t host_pool_bytes{std::size_t{1} << 30};
  std::string host_pool_name{"host"};
  std::vector<uid_t> allow_uids;
  std::vector<gid_t> allow_gids;
  std::size_t session_quota_bytes{};
  std::size_t uid_quota_bytes{};
  int hello_timeout_ms{2000};
  std::size_t max_message_bytes{64 * 1024};
  int drain_timeout_ms{5000};
  bool verbose{false};
  std::string metrics_address;  // HOST:PORT of the Prometheus endpoint; empty: off
};

std::string default_runtime_dir()
{
  char const* env = std::getenv("RMMD_RUNTIME_DIR");
  return env != nullptr && *env != '\0' ? env : "/run/rmmd";
}

rmmd::core::access_policy make_access_policy(daemon_flags const& flags)
{
  rmmd::core::access_policy policy{.uids = flags.allow_uids, .gids = flags.allow_gids};
  if (policy.uids.empty() && policy.gids.empty()) {
    // Default: the daemon's own user, and members of the `rmmd` group.
    policy.uids.push_back(::geteuid());
    if (auto const* g = ::getgrnam("rmmd"); g != nullptr) { policy.gids.push_back(g->gr_gid); }
  }
  return policy;
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

/// The pools: the shared host pool, and one CUDA pool per GPU (unless
/// --backend=host). False, after saying why, if a pool that must exist cannot.
bool add_pools(rmmd::core::daemon_core& core, daemon_flags const& flags)
{
  namespace cuda = rmmd::backends::cuda;
  // The host pool first: its id is 0 on every node.
  try {
    core.add_pool(rmmd::core::pool_config{.name         = flags.host_pool_name,
                                          .device       = -1,
                                          .handle_types = {rmmd::core::handle_type::host_offset}},
                  std::make_unique<rmmd::backends::host::host_backend>(flags.host_pool_name,
                                                                       flags.host_pool_bytes));
  } catch (std::exception const& e) {
    rmmd::log::error("cannot create the host pool '%s' of %d bytes: %s",
                     flags.host_pool_name,
                     flags.host_pool_bytes,
                     e.what());
    return false;
  }
  int const gpus = flags.backend == "host" ? 0 : cuda::device_count();
  if (flags.backend == "cuda" && gpus == 0) {
    rmmd::log::error("--backend=cuda, but CUDA sees no GPU (is the driver loaded? nvidia-smi)");
    return false;
  }
  if (flags.backend == "auto" && gpus == 0) {
    rmmd::log::info("no GPU found: serving the host pool only");
  }
  for (int device = 0; device < gpus; ++device) {
    auto name   = "gpu" + std::to_string(device);
    bool fabric = false;
    if (flags.fabric != "off") {
      auto support = cuda::probe_fabric(device, std::filesystem::read_symlink("/proc/self/exe"));
      fabric       = support.usable;
      if (!fabric && flags.fabric == "on") {
        rmmd::log::error("pool '%s' is not served: --fabric=on, but %s", name, support.reason);
        continue;
      }
      if (!fabric) {
        rmmd::log::warn("pool '%s': no fabric handles, posix-fd only: %s", name, support.reason);
      }
    }
    try {
      std::size_t capacity = flags.cuda_pool_bytes;
      if (capacity == 0) {
        std::size_t free = 0, total = 0;
        cudaSetDevice(device);
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
          throw std::runtime_error("cudaMemGetInfo failed");
        }
        capacity = free / 10 * 8;
      }
      auto backend = make_cuda_backend(
          cuda::cuda_pool_options{.device            = device,
                                  .capacity          = capacity,
                                  .release_threshold = flags.cuda_release_threshold,
                                  .fabric            = fabric});
      fabric = !backend->fabric_handle().empty();  // the fallback may have dropped it
      std::vector<rmmd::core::handle_type> types{rmmd::core::handle_type::posix_fd};
      if (fabric) { types.push_back(rmmd::core::handle_type::fabric); }
      core.add_pool(rmmd::core::pool_config{.name          = name,
                                            .device        = device,
                                            .handle_types  = types,
                                            .limit_bytes   = capacity,
                                            .max_alignment = 256},
                    std::move(backend));
      rmmd::log::info("pool '%s': CUDA device %d, %s export, up to %d bytes",
                      name,
                      device,
                      fabric ? "posix-fd and fabric" : "posix-fd",
                      capacity);
    } catch (std::exception const& e) {
      rmmd::log::error("cannot create the CUDA pool '%s' on device %d: %s", name, device, e.what());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv)
{
  daemon_flags flags;
  flags.runtime_dir = default_runtime_dir();
  CLI::App app{"rmmd: lends memory from node-wide pools to the processes of this node"};
  app.option_defaults()->always_capture_default();
  app.add_option(
      "--runtime-dir", flags.runtime_dir, "Directory for the sockets (env RMMD_RUNTIME_DIR)");
  app.add_option(
         "--backend", flags.backend, "auto: CUDA pools on every GPU when there is one; host: none")
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.add_option("--cuda-pool-bytes",
                 flags.cuda_pool_bytes,
                 "Most bytes each GPU's pool may lend; 0: 80% of the GPU's free memory at start")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--cuda-release-threshold",
                 flags.cuda_release_threshold,
                 "Bytes a CUDA pool keeps reserved when idle")
      ->transform(CLI::AsSizeValue(false));
  app.add_option(
         "--host-pool-bytes", flags.host_pool_bytes, "Size of the shared host pool (e.g. 1GiB)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--fabric",
                 flags.fabric,
                 "Fabric handles on CUDA pools: auto (where proven to work), on (a pool without "
                 "them is not served), off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--probe-fabric", flags.probe_fabric_device, "(internal) fabric export probe")
      ->group("");
  app.add_option("--host-pool-name", flags.host_pool_name, "Name of the shared host pool");
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
  app.add_option("--hello-timeout-ms", flags.hello_timeout_ms, "Time a client has to say hello")
      ->check(CLI::Range(1, 600000));
  app.add_option("--max-message-bytes", flags.max_message_bytes, "Largest gRPC message accepted")
      ->transform(CLI::AsSizeValue(false));
  app.add_option(
         "--drain-timeout-ms", flags.drain_timeout_ms, "Time in-flight calls get at shutdown")
      ->check(CLI::Range(0, 600000));
  app.add_flag("-v,--verbose", flags.verbose, "Log debug lines too");
  app.add_option(
      "--metrics-address",
      flags.metrics_address,
      "Serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9400; port 0 "
      "picks one, which `rmmctl health` shows); empty: off");
  CLI11_PARSE(app, argc, argv);
  if (flags.probe_fabric_device >= 0) {
    rmmd::backends::cuda::run_fabric_probe(flags.probe_fabric_device);
  }
  if (flags.verbose) { rmmd::log::threshold = rmmd::log::level::debug; }

  // Every thread inherits this mask: the signals are taken by sigwaitinfo below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  namespace fs       = std::filesystem;
  fs::path const dir = flags.runtime_dir;
  try {
    if (!fs::exists(dir)) {
      fs::create_directories(dir);
      fs::permissions(dir, fs::perms(0750));
    }
  } catch (fs::filesystem_error const& e) {
    rmmd::log::error("cannot create the runtime directory %s: %s", dir.string(), e.what());
    return 1;
  }

  rmmd::core::core_options options;
  options.access                   = make_access_policy(flags);
  options.quotas.per_session_bytes = flags.session_quota_bytes;
  options.quotas.per_uid_bytes     = flags.uid_quota_bytes;
  rmmd::core::daemon_core core(std::move(options));
  if (!add_pools(core, flags)) { return 1; }

  auto const grpc_path = dir / "rmmd.sock";
  rmmd::service::rmmd_service service(core);

  // ---- Prometheus metrics (issue 6, item 5): off unless --metrics-address ----
  std::unique_ptr<rmmd::metrics::metrics_server> metrics;
  if (!flags.metrics_address.empty()) {
    try {
      metrics = std::make_unique<rmmd::metrics::metrics_server>(flags.metrics_address, [&service] {
        return render_prometheus(service.metrics_snapshot());
      });
    } catch (std::exception const& e) {
      rmmd::log::error("--metrics-address: %s", e.what());
      return 1;
    }
    service.set_metrics_address(metrics->address());
    rmmd::log::info("metrics: http://%s/metrics", metrics->address());
  }
  // ---- end of metrics ----

  grpc::ServerBuilder builder;
  ::unlink(grpc_path.c_str());
  builder.AddListeningPort("unix:" + grpc_path.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(flags.max_message_bytes));
  // The sync server's threads notice a shutdown only when their completion
  // queue poll times out (1 s by default): poll more often so SIGTERM is quick.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 50);
  auto server = builder.BuildAndStart();
  if (!server) {
    rmmd::log::error("cannot listen on %s (is another rmmd running?)", grpc_path.string());
    return 1;
  }
  ::chmod(grpc_path.c_str(), 0660);

  rmmd::session::session_listener listener(
      core,
      rmmd::session::listener_options{
          .socket_path       = dir / "rmmd-session.sock",
          .hello_deadline    = std::chrono::milliseconds(flags.hello_timeout_ms),
          .max_message_bytes = static_cast<std::uint32_t>(flags.max_message_bytes)});
  try {
    listener.start();
  } catch (std::exception const& e) {
    rmmd::log::error("cannot listen on the session socket: %s", e.what());
    server->Shutdown();
    return 1;
  }

  rmmd::log::info("ready: %d pool(s), sockets in %s", core.pools().size(), dir.string());
  ::sd_notifyf(0, "READY=1\nSTATUS=serving %zu pool(s)", core.pools().size());

  while (true) {
    siginfo_t info{};
    int sig = ::sigwaitinfo(&signals, &info);
    if (sig == SIGHUP) {
      rmmd::log::info("SIGHUP: nothing to reload yet");
      continue;
    }
    if (sig == SIGTERM || sig == SIGINT) {
      rmmd::log::info("%s: shutting down", ::strsignal(sig));
      break;
    }
  }

  // Two phases: stop taking new work, let in-flight calls end, then reclaim.
  ::sd_notify(0, "STOPPING=1");
  core.begin_drain();
  listener.stop_accepting();
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(flags.drain_timeout_ms));
  listener.stop();
  core.close_all_sessions();
  ::unlink(grpc_path.c_str());
  rmmd::log::info("stopped");
  return 0;
}
