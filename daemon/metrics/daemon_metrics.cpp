#include "daemon/metrics/daemon_metrics.hpp"

#include <utility>

namespace rmmd::metrics {

daemon_metrics::daemon_metrics(core::daemon_core const& core,
                               std::string version,
                               std::vector<std::string> grpc_methods,
                               std::vector<std::string> session_methods)
    : core_(core),
      version_(std::move(version)),
      grpc_calls_(std::move(grpc_methods)),
      session_calls_(std::move(session_methods))
{
}

daemon_snapshot daemon_metrics::snapshot() const
{
  return daemon_snapshot{
      .version = version_,
      .uptime_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(),
      .draining      = core_.draining(),
      .stats         = core_.pools().stats(),
      .requests      = grpc_calls_.snapshot(),
      .session_calls = session_calls_.snapshot(),
      .admission     = admission_.snapshot(),
      .stable        = core_.stables().totals(),
      .leases        = core_.buffers().leases()};
}

}  // namespace rmmd::metrics
