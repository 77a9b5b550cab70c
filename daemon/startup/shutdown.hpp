#pragma once

// Stopping in two phases (SIGTERM, SIGINT): first no new sessions while the
// live ones carry on until they end or the drain deadline passes; then
// everything left is refused, cancelled and reclaimed.

#include "daemon/core/daemon_core.hpp"
#include "daemon/startup/endpoints.hpp"
#include "daemon/startup/service_status.hpp"

#include <signal.h>

#include <chrono>

namespace rmmd::startup {

/// Phase 1: new sessions are refused (the core refuses a hello still in
/// flight, the session socket accepts no more connections) before anyone
/// hears STOPPING=1; live sessions allocate and free until they end or
/// `drain_timeout` passes. Another SIGTERM or SIGINT cuts it short; SIGHUP
/// is ignored.
void drain_sessions(core::daemon_core& core,
                    endpoints& endpoints,
                    service_status& status,
                    sigset_t const& signals,
                    std::chrono::milliseconds drain_timeout);

/// Phase 2: the core refuses new work, the gRPC calls still in flight are
/// cancelled at once, every connection closes and every session is
/// reclaimed.
void stop_serving(core::daemon_core& core, endpoints& endpoints, service_status& status);

}  // namespace rmmd::startup
