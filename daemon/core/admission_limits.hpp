#pragma once

// How many connections and sessions the session socket takes, per uid and in
// all: what rmmd.conf's `admission` message (and its flags) set. A plain
// value type, shared by the configuration and the listener.

#include <cstddef>

namespace rmmd::core {

struct admission_limits {
  /// Connections of one uid that have not said hello yet. A client sends its
  /// hello as soon as it is connected (the daemon reads it at accept when it
  /// is already there, and such a connection never waits), so only silent
  /// connections count: 16 leaves room for a burst of slow starters while a
  /// uid holding silent connections cannot take the daemon from others.
  std::size_t max_pending_per_uid{16};
  /// Connections that have not said hello yet, of all uids together: the
  /// backstop that keeps silent connections from many uids from using up the
  /// daemon's fds (each one holds one for at most hello_timeout_ms).
  std::size_t max_pending_total{256};
  /// Open sessions of one uid: far above what one tenant's processes on a
  /// node need (a rank or worker per core), far below the fds the unit
  /// grants (LimitNOFILE=65536; a session holds one on each socket).
  std::size_t max_sessions_per_uid{1024};
  /// Open sessions of all uids together.
  std::size_t max_sessions_total{16384};

  bool operator==(admission_limits const&) const = default;
};

}  // namespace rmmd::core
