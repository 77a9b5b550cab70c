#pragma once
// The daemon's open-file limit: it holds an fd per persistent buffer, per
// awake address-stable allocation and per sleep backup (docs/sleep.md), so
// an engine of 1,000 tensors needs more than the usual soft limit of 1,024.

namespace rmmd::startup {

/// Raises the soft RLIMIT_NOFILE to the hard one (what systemd's
/// documentation asks of programs that need many fds; the shipped unit's
/// LimitNOFILE sets the hard one), and says so at debug level. Returns the
/// soft limit now in force.
unsigned long raise_open_file_limit() noexcept;

}  // namespace rmmd::startup
