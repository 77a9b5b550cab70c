#pragma once

// Counters and latency histograms of the daemon's gRPC calls. Recorded on the
// call path without a lock (relaxed atomic adds), read by the metrics endpoint.
// No gRPC here: a status code is its number (grpc::StatusCode and
// absl::StatusCode share them).
//
// Thread safety: record() and snapshot() may be called from any thread. A
// snapshot taken while calls are recorded may miss the newest of them, but its
// histogram counts always add up (count is the sum of the buckets).

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rmmd::metrics {

enum class rpc_method : std::uint8_t {
  allocate,
  free,
  get_stats,
  list_sessions,
  list_pools,
  trim,
  health,
  report_usage,
  create_buffer,
  publish_buffer,
  open_buffer,
  close_buffer,
  delete_buffer,
  list_buffers,
  blocks_dropped,  // session sockets only: a client let go of packed-lease blocks
  set_buffer_manifest,
  describe_buffer,
  get_buffer_manifest,
};
inline constexpr std::size_t rpc_method_count = 18;

/// The method's name in the service ("Allocate", "Free", ...).
std::string_view method_name(rpc_method method) noexcept;

/// gRPC's status codes, OK (0) to UNAUTHENTICATED (16).
inline constexpr std::size_t status_code_count = 17;

/// gRPC's name of a status code ("OK", "INVALID_ARGUMENT", ...); "UNKNOWN"
/// for a number outside 0..16.
std::string_view status_code_name(int code) noexcept;

/// Upper bounds of the latency buckets, in seconds: 25 us (a fast unary call
/// over a Unix socket takes ~70 us) to 2.5 s.
inline constexpr std::array<double, 16> latency_bounds_seconds{25e-6,
                                                               50e-6,
                                                               100e-6,
                                                               250e-6,
                                                               500e-6,
                                                               1e-3,
                                                               2.5e-3,
                                                               5e-3,
                                                               10e-3,
                                                               25e-3,
                                                               50e-3,
                                                               100e-3,
                                                               250e-3,
                                                               500e-3,
                                                               1.0,
                                                               2.5};

struct histogram_snapshot {
  /// Observations per bucket (not cumulative); the last one counts those above
  /// the largest bound.
  std::array<std::uint64_t, latency_bounds_seconds.size() + 1> buckets{};
  double sum_seconds{};

  [[nodiscard]] std::uint64_t count() const noexcept;
};

struct request_snapshot {
  /// calls[method][code]: calls that ended with that status code.
  std::array<std::array<std::uint64_t, status_code_count>, rpc_method_count> calls{};
  std::array<histogram_snapshot, rpc_method_count> latency{};
};

class latency_histogram {
 public:
  void observe(std::chrono::nanoseconds elapsed) noexcept;
  [[nodiscard]] histogram_snapshot snapshot() const noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, latency_bounds_seconds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

class request_metrics {
 public:
  /// One call of `method` that ended with status `code` after `elapsed`.
  void record(rpc_method method, int code, std::chrono::nanoseconds elapsed) noexcept;
  [[nodiscard]] request_snapshot snapshot() const noexcept;

 private:
  std::array<std::array<std::atomic<std::uint64_t>, status_code_count>, rpc_method_count> calls_{};
  std::array<latency_histogram, rpc_method_count> latency_{};
};

}  // namespace rmmd::metrics
