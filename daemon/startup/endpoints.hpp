#pragma once

// What clients reach: the gRPC server (rmmd.sock), the session socket
// (rmmd-session.sock) and, when configured, the Prometheus endpoint, wired to
// one core. Owns the adapters and their metrics; the core outlives it.
//
// Thread safety: made, reconfigured and stopped from main's thread only;
// open_sessions() may be called from any thread.

#include "daemon/config/settings.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/metrics/daemon_metrics.hpp"
#include "daemon/metrics/metrics_server.hpp"
#include "daemon/peering/peering.hpp"
#include "daemon/service/rmmd_service.hpp"
#include "daemon/session/session_listener.hpp"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <memory>

namespace rmmd::startup {

class endpoints {
 public:
  /// Listens on both sockets in settings.runtime_dir (modes and group as
  /// configured), serves metrics if settings.metrics_address is set, and
  /// peers with other nodes if settings.peering is enabled (with `probes`).
  /// nullptr after saying why.
  static std::unique_ptr<endpoints> start(core::daemon_core& core,
                                          config::daemon_settings const& settings,
                                          peering::probe_exchange probes = {});

  endpoints(endpoints const&)            = delete;
  endpoints& operator=(endpoints const&) = delete;
  /// Stops what still runs (stop()).
  ~endpoints();

  [[nodiscard]] std::size_t open_sessions() const noexcept;

  /// A reload: the admission limits, the sessions the metrics show, and
  /// peering's grants and certificates.
  void reconfigure(config::daemon_settings const& settings);

  /// Drain, first phase: the session socket accepts no more connections;
  /// the live sessions go on.
  void stop_accepting();

  /// Drain, second phase: cancels the gRPC calls in flight at once, closes
  /// every session connection and removes the gRPC socket file. Peering
  /// stops first: this node's holds on other nodes are closed, theirs here
  /// ended.
  void stop();

 private:
  explicit endpoints(core::daemon_core& core);
  bool start_metrics(config::daemon_settings const& settings);
  bool start_grpc(config::daemon_settings const& settings);
  bool start_sessions(config::daemon_settings const& settings);
  bool start_peering(config::daemon_settings const& settings, peering::probe_exchange probes);

  core::daemon_core& core_;
  metrics::daemon_metrics daemon_metrics_;  // before service_, which counts into it
  service::rmmd_service service_;
  std::atomic<std::size_t> metrics_top_sessions_{0};
  std::unique_ptr<peering::peering> peering_;  // before metrics_, whose page shows it
  std::unique_ptr<metrics::metrics_server> metrics_;
  std::filesystem::path grpc_path_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<session_socket::session_listener> listener_;
};

}  // namespace rmmd::startup
