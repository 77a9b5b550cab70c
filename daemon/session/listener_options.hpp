#pragma once

// What the session socket is told at start: where it listens, its limits,
// its thread count and where it counts what it answers.

#include "daemon/core/admission_limits.hpp"
#include "daemon/metrics/admission_metrics.hpp"
#include "daemon/metrics/request_metrics.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace rmmd::session_socket {

struct listener_options {
  std::filesystem::path socket_path;
  /// A client that has not sent its hello by then is disconnected.
  std::chrono::milliseconds hello_deadline{2000};
  /// A larger hello is refused (INVALID_ARGUMENT) and disconnected.
  std::size_t max_hello_bytes{4096};
  /// Connections waiting to say hello and open sessions, per uid and in all;
  /// past them a connection or hello is refused (RESOURCE_EXHAUSTED).
  core::admission_limits admission{};
  /// Advertised in the welcome: the gRPC server's message size cap.
  std::uint32_t max_message_bytes{};
  /// Mode of the socket file.
  unsigned socket_mode{0660};
  /// Threads answering calls. The core serialises its ledger; these overlap
  /// the backends' work (a CUDA allocation and its export) and the socket I/O.
  /// Four measured best on an H100 host of 16 cores (8 gave half the
  /// throughput of 16 direct clients: more threads contend in the driver).
  std::size_t call_threads{4};
  /// A larger call is answered INVALID_ARGUMENT (the session goes on).
  std::size_t max_call_bytes{4096};
  /// Where each answered call is counted; none if null.
  metrics::request_metrics* call_metrics{nullptr};
  /// Where admission refusals and waiting connections are counted; none if null.
  metrics::admission_metrics* admission_metrics{nullptr};
};

}  // namespace rmmd::session_socket
