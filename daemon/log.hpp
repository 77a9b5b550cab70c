#pragma once

// The daemon's log: one line per event on stderr, which systemd's journal
// keeps; the level prefix is what sd-daemon(3) understands ("<3>" error,
// "<4>" warning, "<6>" info, "<7>" debug).
//
// A line that a client can cause (a bad hello, a refused session, a session
// opened and closed) goes through a rate_limit, so that a client flooding the
// daemon cannot flood the journal: see limited(). What the libraries the
// daemon uses log on their own (protobuf, gRPC) comes here too
// (daemon/library_logs.hpp), through limits of their own.

#include <absl/strings/str_format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

namespace rmmd::log {

enum class level : int { error = 3, warning = 4, info = 6, debug = 7 };

/// Lines above this level are not written. Set once at start-up.
inline std::atomic<level> threshold{level::info};

/// True if a line of `l` is written at the current threshold.
inline bool enabled(level l) noexcept
{
  return static_cast<int>(l) <= static_cast<int>(threshold.load(std::memory_order_relaxed));
}

/// Writes `text` as one line of level `l` (no threshold check): control
/// characters in it (a line feed in a client's name, say) are escaped, so
/// that nothing a client sends can forge a line of its own.
void write_line(level l, std::string_view text);

template <typename... Args>
void write(level l, absl::FormatSpec<Args...> const& format, Args const&... args)
{
  if (!enabled(l)) { return; }
  write_line(l, absl::StrFormat(format, args...));
}

template <typename... Args>
void error(absl::FormatSpec<Args...> const& format, Args const&... args)
{
  write(level::error, format, args...);
}
template <typename... Args>
void warn(absl::FormatSpec<Args...> const& format, Args const&... args)
{
  write(level::warning, format, args...);
}
template <typename... Args>
void info(absl::FormatSpec<Args...> const& format, Args const&... args)
{
  write(level::info, format, args...);
}

/// A token bucket for one class of lines that clients can cause: `burst`
/// lines at once, then `per_second` on average. A line it holds back is
/// counted; the count is written, as "N similar line(s) suppressed: WHAT",
/// before the next line it lets through, or by report_suppressed().
///
/// Every rate_limit registers itself for report_suppressed() while it lives.
/// Thread safety: any thread.
class rate_limit {
 public:
  /// `what` names the class of lines in the suppression count.
  rate_limit(std::string what, double per_second, double burst);
  rate_limit(rate_limit const&)            = delete;
  rate_limit& operator=(rate_limit const&) = delete;
  ~rate_limit();

  /// Takes a token for a line of `l`: true if it may be written now, and
  /// then `suppressed` holds the lines held back since the last one written
  /// (which the caller reports); false if it is held back (and counted).
  bool take(level l, std::uint64_t& suppressed) noexcept;
  /// Writes the count of lines held back and not yet reported, if any, at
  /// the most severe level among them.
  void report() noexcept;

  [[nodiscard]] std::string const& what() const noexcept
  {
    return what_;
  }

 private:
  using clock = std::chrono::steady_clock;

  std::string const what_;
  double const per_second_;
  double const burst_;
  std::mutex mutex_;
  double tokens_;
  clock::time_point last_{clock::now()};
  std::uint64_t suppressed_{};
  level suppressed_level_{level::debug};  ///< the most severe level held back
};

/// Writes a line of `l` through `limit`: at once while its bucket has
/// tokens, else counted and reported later. Lines above the threshold are
/// neither written nor counted.
template <typename... Args>
void limited(rate_limit& limit,
             level l,
             absl::FormatSpec<Args...> const& format,
             Args const&... args)
{
  if (!enabled(l)) { return; }
  std::uint64_t suppressed = 0;
  if (!limit.take(l, suppressed)) { return; }
  if (suppressed > 0) {
    write_line(l, absl::StrFormat("%d similar line(s) suppressed: %s", suppressed, limit.what()));
  }
  write_line(l, absl::StrFormat(format, args...));
}

/// Writes the suppression counts that no later line has reported, of every
/// rate_limit alive: the main loop calls it about once a second, so that a
/// flood that stops is still accounted for.
void report_suppressed() noexcept;

}  // namespace rmmd::log
