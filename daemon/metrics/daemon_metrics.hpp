#pragma once

// What the metrics endpoint shows, gathered at each scrape: the core's stats,
// read from the core itself, beside the counters that the adapters record
// into (the gRPC service's calls, the session socket's calls and admission).
//
// Thread safety: the counters are lock-free (request_metrics,
// admission_metrics); snapshot() may be called from any thread.

#include "daemon/core/daemon_core.hpp"
#include "daemon/metrics/admission_metrics.hpp"
#include "daemon/metrics/prometheus_text.hpp"
#include "daemon/metrics/request_metrics.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace rmmd::metrics {

class daemon_metrics {
 public:
  /// `version`: the daemon's, as the scrape reports it; `grpc_methods` and
  /// `session_methods`: the calls each transport counts
  /// (wire::call_names).
  daemon_metrics(core::daemon_core const& core,
                 std::string version,
                 std::vector<std::string> grpc_methods,
                 std::vector<std::string> session_methods);
  daemon_metrics(daemon_metrics const&)            = delete;
  daemon_metrics& operator=(daemon_metrics const&) = delete;

  /// Where the gRPC service counts the calls it answers.
  [[nodiscard]] request_metrics& grpc_calls() noexcept
  {
    return grpc_calls_;
  }
  /// Where the session socket counts the calls it answers.
  [[nodiscard]] request_metrics& session_calls() noexcept
  {
    return session_calls_;
  }
  /// Where the session socket counts admission refusals and waiting connections.
  [[nodiscard]] admission_metrics& admission() noexcept
  {
    return admission_;
  }

  /// What one scrape shows, as of now.
  [[nodiscard]] daemon_snapshot snapshot() const;

 private:
  core::daemon_core const& core_;
  std::string version_;
  std::chrono::steady_clock::time_point started_{std::chrono::steady_clock::now()};
  request_metrics grpc_calls_;
  request_metrics session_calls_;
  admission_metrics admission_;
};

}  // namespace rmmd::metrics
