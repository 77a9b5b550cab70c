#pragma once

// SIGTERM, SIGINT and SIGHUP are blocked in every thread and taken by
// sigtimedwait on main's thread: no handler runs in signal context.

#include <signal.h>

#include <chrono>

namespace rmmd::startup {

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread (every thread started
/// later inherits the mask) and ignores SIGPIPE; returns the blocked set.
/// Call before any other thread starts.
sigset_t block_signals();

/// Waits for one of `signals` for at most `timeout`; 0 when none came.
int wait_signal(sigset_t const& signals, std::chrono::milliseconds timeout);

}  // namespace rmmd::startup
