#pragma once

// What the session listener's admission limits did: refusals per limit (a
// fixed set of four labels, never per uid or per session) and the
// connections waiting to say hello. Relaxed atomics, read by the metrics
// endpoint.
//
// Thread safety: every member may be called from any thread.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rmmd::metrics {

/// The admission limits, named as in rmmd.conf (admission.<name>).
enum class admission_limit : std::uint8_t {
  max_pending_per_uid,
  max_pending_total,
  max_sessions_per_uid,
  max_sessions_total,
};
inline constexpr std::size_t admission_limit_count = 4;

/// "max_pending_per_uid", ...: the configuration field's name.
std::string_view limit_name(admission_limit limit) noexcept;

struct admission_snapshot {
  /// refusals[limit]: connections or hellos refused because of it.
  std::array<std::uint64_t, admission_limit_count> refusals{};
  /// Connections accepted that have not said hello yet.
  std::uint64_t pending_connections{};
};

class admission_metrics {
 public:
  void refused(admission_limit limit) noexcept;
  void set_pending(std::size_t connections) noexcept;
  [[nodiscard]] admission_snapshot snapshot() const noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, admission_limit_count> refusals_{};
  std::atomic<std::uint64_t> pending_{0};
};

}  // namespace rmmd::metrics
