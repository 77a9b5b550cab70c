#pragma once

// What rmmd tells systemd (sd_notify; Type=notify): READY=1 once both
// sockets listen, RELOADING=1 around a reload, STOPPING=1 on drain, and a
// STATUS= line that follows the session count.

#include <chrono>
#include <cstddef>

namespace rmmd::startup {

class service_status {
 public:
  explicit service_status(std::size_t pool_count) : pool_count_(pool_count) {}

  /// READY=1, and "serving N pool(s), 0 session(s)".
  void ready();
  /// The status line, if `open_sessions` changed since it was last shown
  /// (or always, with `always`).
  void follow(std::size_t open_sessions, bool always = false);
  /// RELOADING=1 with the monotonic time systemd asks for.
  void reloading();
  /// READY=1 after a reload, and the status line again.
  void reloaded(std::size_t open_sessions);
  /// STOPPING=1, stretching systemd's stop timeout to cover `drain_timeout`
  /// and the time to reclaim after it.
  void stopping(std::chrono::milliseconds drain_timeout);
  /// "draining: N session(s) left, M ms to the deadline".
  void draining(std::size_t left, std::chrono::milliseconds to_deadline);
  /// "stopping".
  void stopped();

 private:
  std::size_t pool_count_;
  std::size_t shown_sessions_{0};
};

}  // namespace rmmd::startup
