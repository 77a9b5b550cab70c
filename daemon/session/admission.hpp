#pragma once

// Fair admission on the session socket: counts the connections that have
// not said hello and the open sessions, per uid and in all, and refuses
// past the limits (admission_limits) with RESOURCE_EXHAUSTED, naming the
// limit, its configuration field and its flag. A refusal counts nothing.
//
// Thread safety: every member may be called from any thread (one mutex; it is
// taken once per connection and once per session, never per call).

#include "daemon/core/admission_limits.hpp"
#include "daemon/metrics/admission_metrics.hpp"

#include <absl/status/status.h>

#include <sys/types.h>

#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace rmmd::session_socket {

namespace detail {
/// What admission counts (connections, sessions) and its limits' words.
struct counted_kind;
}  // namespace detail

class admission {
 public:
  /// Refusals and the pending count go to `metrics` unless it is null.
  explicit admission(core::admission_limits limits, metrics::admission_metrics* metrics = nullptr);
  admission(admission const&)            = delete;
  admission& operator=(admission const&) = delete;

  /// New limits (a reload): they apply to the next connection and hello.
  /// What is open stays open, even above a lowered limit.
  void set_limits(core::admission_limits limits);
  [[nodiscard]] core::admission_limits limits() const;

  /// A connection of `uid` that has not said hello: OK, and it counts until
  /// end_pending(); or RESOURCE_EXHAUSTED saying which limit it is past.
  absl::Status admit_pending(uid_t uid);
  /// REQUIRES: admit_pending(uid) returned OK, and this is its only end.
  void end_pending(uid_t uid) noexcept;

  /// A hello of `uid`: OK, and the session counts until end_session(); or
  /// RESOURCE_EXHAUSTED saying which limit it is past.
  absl::Status admit_session(uid_t uid);
  /// REQUIRES: admit_session(uid) returned OK, and this is its only end.
  void end_session(uid_t uid) noexcept;

  [[nodiscard]] std::size_t pending() const;
  [[nodiscard]] std::size_t sessions() const;

 private:
  /// Counts per uid; a uid leaves the map when its count is back to 0.
  struct counts {
    std::unordered_map<uid_t, std::size_t> per_uid;
    std::size_t total{};

    void add(uid_t uid);
    void remove(uid_t uid) noexcept;
    [[nodiscard]] std::size_t of(uid_t uid) const;
  };

  void refused(metrics::admission_limit limit) const noexcept;
  /// The one check of every limit: `uid` past `max_per_uid`, or everyone past
  /// `max_total`, is refused, naming that limit; otherwise counted.
  /// REQUIRES: mutex_ held.
  absl::Status admit(counts& counted,
                     uid_t uid,
                     std::size_t max_per_uid,
                     std::size_t max_total,
                     detail::counted_kind const& kind);

  mutable std::mutex mutex_;
  core::admission_limits limits_;
  counts pending_;
  counts sessions_;
  metrics::admission_metrics* metrics_;
};

}  // namespace rmmd::session_socket
