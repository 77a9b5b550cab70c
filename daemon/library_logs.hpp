#pragma once

// What the libraries the daemon uses log on their own, routed through
// rmmd::log: libprotobuf's raw "[libprotobuf ERROR ...]" lines (it prints
// one for a hello whose client_name is not UTF-8, for instance) and gRPC's
// gpr_log lines. Each library goes through a rate_limit of its own, since a
// client's bad input can make either of them log.

#include "daemon/log.hpp"

namespace rmmd::log {

/// Installs the handlers (google::protobuf::SetLogHandler,
/// gpr_set_log_function). REQUIRES: called once, at start-up, before any
/// other thread runs (neither library makes the switch thread-safe).
void route_library_logs();

/// Makes gRPC's own verbosity follow the daemon's level: its info lines at
/// `debug`, else its errors only. An operator's GRPC_VERBOSITY wins. Call it
/// at start-up and when a reload changes the level.
void set_library_log_level(level daemon_level);

}  // namespace rmmd::log
