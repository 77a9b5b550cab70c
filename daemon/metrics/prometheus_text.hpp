#pragma once

// The daemon's metrics in Prometheus' text exposition format (version 0.0.4).
// A pure function of a snapshot: tested without HTTP, served by metrics_server.

#include "daemon/core/types.hpp"
#include "daemon/metrics/admission_metrics.hpp"
#include "daemon/metrics/request_metrics.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace rmmd::metrics {

/// What one scrape shows.
struct daemon_snapshot {
  std::string version;
  double uptime_seconds{};
  bool draining{};
  core::stats_snapshot stats;      ///< pools and sessions
  request_snapshot requests;       ///< gRPC calls
  request_snapshot session_calls;  ///< calls on session sockets
  admission_snapshot admission{};  ///< the session socket's admission limits
  core::stable_totals stable{};    ///< address-stable memory, sleep and wake
  core::lease_totals leases{};     ///< shared buffers' write leases
};

/// The Content-Type of render_prometheus()'s text.
inline constexpr std::string_view prometheus_content_type =
    "text/plain; version=0.0.4; charset=utf-8";

/// How much of a snapshot a scrape shows.
struct render_options {
  /// Sessions shown one by one (rmmd_session_*), those holding the most bytes
  /// first; the rest are summed in rmmd_unlisted_sessions*. 0: none. The
  /// per-uid series always cover every session, so a scrape grows with the
  /// number of users, not of sessions.
  std::size_t top_sessions{10};
};

/// Every metric of `snapshot`, each family with its HELP and TYPE lines.
/// docs/operations.md lists them.
std::string render_prometheus(daemon_snapshot const& snapshot, render_options const& options = {});

/// A label value as the text format wants it: backslash, double quote and
/// line feed escaped as \\, \" and \n.
std::string escape_label_value(std::string_view value);

}  // namespace rmmd::metrics
