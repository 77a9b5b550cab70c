// rmmd: parses the flags and the configuration, wires the core, its pools
// and its endpoints, and waits for signals. Each step lives in
// daemon/startup/.

#include "daemon/backends/cuda/cuda_backend.hpp"
#include "daemon/backends/cuda/fabric_probe.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/library_logs.hpp"
#include "daemon/log.hpp"
#include "daemon/restart/fd_store.hpp"
#include "daemon/startup/buffer_restore.hpp"
#include "daemon/startup/config_source.hpp"
#include "daemon/startup/daemon_flags.hpp"
#include "daemon/startup/endpoints.hpp"
#include "daemon/startup/open_files.hpp"
#include "daemon/startup/peer_probes.hpp"
#include "daemon/startup/pools.hpp"
#include "daemon/startup/reload.hpp"
#include "daemon/startup/runtime_dir_setup.hpp"
#include "daemon/startup/service_status.hpp"
#include "daemon/startup/shutdown.hpp"
#include "daemon/startup/signals.hpp"

#include <CLI/CLI.hpp>

#include <signal.h>

#include <chrono>
#include <cstring>

namespace startup = rmmd::startup;
using namespace std::chrono_literals;

int main(int argc, char** argv)
{
  startup::daemon_flags flags;
  CLI::App app{"rmmd: lends memory from node-wide pools to the processes of this node"};
  startup::add_options(app, flags);
  CLI11_PARSE(app, argc, argv);
  // Before anything can make protobuf or gRPC log: their lines are ours too.
  rmmd::log::route_library_logs();
  if (flags.probe_fabric_device >= 0) {
    rmmd::backends::cuda::run_fabric_probe(flags.probe_fabric_device);
  }

  // Before any thread runs: it reads and unsets the LISTEN_ variables.
  auto passed = rmmd::restart::take_passed_fds();

  startup::config_source const source{.path          = flags.config_path,
                                      .explicit_path = app.count("--config") > 0};
  if (app.count("--check-config") > 0) {
    if (flags.check_config_path.empty()) { return startup::check_config(source); }
    return startup::check_config({.path = flags.check_config_path, .explicit_path = true});
  }
  auto const apply_flags = [&](rmmd::config::daemon_settings& s) {
    return startup::apply_flags(app, flags, s);
  };
  auto settings = startup::load_for_start(source);
  if (!settings || !apply_flags(*settings)) { return 1; }
  startup::apply_log_level(settings->log_level);

  startup::raise_open_file_limit();
  sigset_t const signals = startup::block_signals();
  if (!startup::prepare_runtime_dir(*settings)) { return 1; }

  rmmd::core::daemon_core core(
      rmmd::core::core_options{.access          = settings->access,
                               .quotas          = settings->quotas,
                               .reclaim_timeout = settings->reclaim_timeout,
                               .pack_up_to      = settings->pack_up_to,
                               .tenancy         = settings->tenancy});
  auto const pools = startup::pool_plan(*settings);
  std::vector<std::string> unserved;  // pools skipped at start, in words: peers hear of them
  if (!pools ||
      !startup::add_pools(core,
                          *pools,
                          flags.backend,
                          {.vmm_buffers   = flags.shared_buffer_memory == "own",
                           .keep_released = std::chrono::milliseconds(
                               static_cast<std::int64_t>(flags.keep_released_seconds * 1000)),
                           .unserved = &unserved})) {
    return 1;
  }
  core.pools().set_driver_usage_source(rmmd::backends::cuda::driver_used_bytes);
  rmmd::restart::fd_store store;
  auto const keeper = startup::restore_buffers(
      core, store, std::move(passed), rmmd::config::effective_state_file(*settings));
  if (keeper && flags.shared_buffer_memory != "own") {
    rmmd::log::warn(
        "buffers of CUDA pools are pointers of their pool "
        "(--cuda-shared-buffer-memory=%s), which no fd keeps: they are lost when the "
        "daemon restarts (host buffers are kept)",
        flags.shared_buffer_memory);
  }
  auto endpoints = startup::endpoints::start(core,
                                             *settings,
                                             settings->peering.enabled()
                                                 ? startup::make_peer_probes(core, unserved)
                                                 : rmmd::peering::probe_exchange{});
  if (!endpoints) { return 1; }

  startup::service_status status(core.pools().list().size());
  rmmd::log::info("ready: %d pool(s), sockets in %s",
                  core.pools().list().size(),
                  settings->runtime_dir.string());
  status.ready();
  int sig = 0;
  while (sig != SIGTERM && sig != SIGINT) {
    sig = startup::wait_signal(signals, 1s);
    if (sig == SIGHUP) {
      status.reloading();
      startup::reload(source, apply_flags, *settings, core, *endpoints);
      status.reloaded(endpoints->open_sessions());
    }
    status.follow(endpoints->open_sessions());
    // What the rate limits held back since, said once a second at most.
    rmmd::log::report_suppressed();
  }
  rmmd::log::info("%s: draining", ::strsignal(sig));
  startup::drain_sessions(core, *endpoints, status, signals, settings->drain_timeout);
  startup::stop_serving(core, *endpoints, status);
  return 0;
}
