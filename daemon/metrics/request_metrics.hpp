#pragma once

// Counters and latency histograms of the calls one transport answers (the
// gRPC service's, the session socket's), by method and status code. The
// methods are named at construction, from the call table
// (wire::call_names); they are the `method` label values. Recorded on the
// call path without a lock (relaxed atomic adds), read by the metrics
// endpoint. No gRPC here: a status code is its number (grpc::StatusCode and
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
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::metrics {

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

/// The calls of one method.
struct method_snapshot {
  std::string method;
  /// calls[code]: calls that ended with that status code.
  std::array<std::uint64_t, status_code_count> calls{};
  histogram_snapshot latency{};
};

struct request_snapshot {
  /// Every method counted, in the order they were named.
  std::vector<method_snapshot> methods;

  /// The method named `method`; null if it is not counted.
  [[nodiscard]] method_snapshot const* find(std::string_view method) const noexcept;
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
  /// Counts the calls of `methods` (their names, each once).
  explicit request_metrics(std::vector<std::string> methods);
  request_metrics(request_metrics const&)            = delete;
  request_metrics& operator=(request_metrics const&) = delete;

  /// Where `method` is counted: the slot record() takes; nullopt if it is not.
  [[nodiscard]] std::optional<std::size_t> slot(std::string_view method) const noexcept;

  /// One call of the method in `slot` that ended with status `code` after
  /// `elapsed`. REQUIRES: `slot` is one that slot() returned.
  void record(std::size_t slot, int code, std::chrono::nanoseconds elapsed) noexcept;
  /// record() of the method named `method`; nothing if it is not counted.
  void record(std::string_view method, int code, std::chrono::nanoseconds elapsed) noexcept;

  [[nodiscard]] request_snapshot snapshot() const;

 private:
  struct per_method {
    std::array<std::atomic<std::uint64_t>, status_code_count> calls{};
    latency_histogram latency;
  };

  std::vector<std::string> const names_;
  std::unique_ptr<per_method[]> methods_;
};

}  // namespace rmmd::metrics
