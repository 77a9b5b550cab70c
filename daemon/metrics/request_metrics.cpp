#include "daemon/metrics/request_metrics.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

namespace rmmd::metrics {
namespace {

constexpr std::array<std::string_view, status_code_count> code_names{"OK",
                                                                     "CANCELLED",
                                                                     "UNKNOWN",
                                                                     "INVALID_ARGUMENT",
                                                                     "DEADLINE_EXCEEDED",
                                                                     "NOT_FOUND",
                                                                     "ALREADY_EXISTS",
                                                                     "PERMISSION_DENIED",
                                                                     "RESOURCE_EXHAUSTED",
                                                                     "FAILED_PRECONDITION",
                                                                     "ABORTED",
                                                                     "OUT_OF_RANGE",
                                                                     "UNIMPLEMENTED",
                                                                     "INTERNAL",
                                                                     "UNAVAILABLE",
                                                                     "DATA_LOSS",
                                                                     "UNAUTHENTICATED"};

constexpr int unknown_code = 2;

/// The bounds in nanoseconds, so observe() compares integers.
constexpr auto bounds_ns = [] {
  std::array<std::uint64_t, latency_bounds_seconds.size()> out{};
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::uint64_t>(latency_bounds_seconds[i] * 1e9 + 0.5);
  }
  return out;
}();

}  // namespace

std::string_view status_code_name(int code) noexcept
{
  if (code < 0 || static_cast<std::size_t>(code) >= code_names.size()) {
    return code_names[unknown_code];
  }
  return code_names[static_cast<std::size_t>(code)];
}

std::uint64_t histogram_snapshot::count() const noexcept
{
  return std::accumulate(buckets.begin(), buckets.end(), std::uint64_t{0});
}

void latency_histogram::observe(std::chrono::nanoseconds elapsed) noexcept
{
  auto const ns = static_cast<std::uint64_t>(std::max<std::int64_t>(elapsed.count(), 0));
  std::size_t i = 0;
  while (i < bounds_ns.size() && ns > bounds_ns[i]) { ++i; }  // le: bound inclusive
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
}

histogram_snapshot latency_histogram::snapshot() const noexcept
{
  histogram_snapshot out;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    out.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  out.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return out;
}

method_snapshot const* request_snapshot::find(std::string_view method) const noexcept
{
  auto it = std::find_if(
      methods.begin(), methods.end(), [&](auto const& m) { return m.method == method; });
  return it == methods.end() ? nullptr : &*it;
}

request_metrics::request_metrics(std::vector<std::string> methods)
    : names_(std::move(methods)), methods_(std::make_unique<per_method[]>(names_.size()))
{
}

std::optional<std::size_t> request_metrics::slot(std::string_view method) const noexcept
{
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == method) { return i; }
  }
  return std::nullopt;
}

void request_metrics::record(std::size_t slot, int code, std::chrono::nanoseconds elapsed) noexcept
{
  if (code < 0 || static_cast<std::size_t>(code) >= status_code_count) { code = unknown_code; }
  auto& m = methods_[slot];
  m.calls[static_cast<std::size_t>(code)].fetch_add(1, std::memory_order_relaxed);
  m.latency.observe(elapsed);
}

void request_metrics::record(std::string_view method,
                             int code,
                             std::chrono::nanoseconds elapsed) noexcept
{
  if (auto s = slot(method)) { record(*s, code, elapsed); }
}

request_snapshot request_metrics::snapshot() const
{
  request_snapshot out;
  out.methods.reserve(names_.size());
  for (std::size_t m = 0; m < names_.size(); ++m) {
    auto& shot  = out.methods.emplace_back();
    shot.method = names_[m];
    for (std::size_t c = 0; c < status_code_count; ++c) {
      shot.calls[c] = methods_[m].calls[c].load(std::memory_order_relaxed);
    }
    shot.latency = methods_[m].latency.snapshot();
  }
  return out;
}

}  // namespace rmmd::metrics
