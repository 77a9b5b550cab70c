#pragma once

// The daemon's log: one line per event on stderr, which systemd's journal
// keeps; the level prefix is what sd-daemon(3) understands ("<3>" error,
// "<4>" warning, "<6>" info, "<7>" debug).

#include <absl/strings/str_format.h>

#include <atomic>
#include <cstdio>

namespace rmmd::log {

enum class level : int { error = 3, warning = 4, info = 6, debug = 7 };

/// Lines above this level are not written. Set once at start-up.
inline std::atomic<level> threshold{level::info};

template <typename... Args>
void write(level l, absl::FormatSpec<Args...> const& format, Args const&... args)
{
  if (static_cast<int>(l) > static_cast<int>(threshold.load(std::memory_order_relaxed))) { return; }
  auto line =
      absl::StrFormat("<%d>rmmd: %s\n", static_cast<int>(l), absl::StrFormat(format, args...));
  std::fwrite(line.data(), 1, line.size(), stderr);
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

}  // namespace rmmd::log
