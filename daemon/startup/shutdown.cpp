#include "daemon/startup/shutdown.hpp"

#include "daemon/log.hpp"
#include "daemon/startup/signals.hpp"

#include <cstring>

namespace rmmd::startup {

using namespace std::chrono_literals;

void drain_sessions(core::daemon_core& core,
                    endpoints& endpoints,
                    service_status& status,
                    sigset_t const& signals,
                    std::chrono::milliseconds drain_timeout)
{
  core.stop_new_sessions();  // Health and the metrics say "draining" from now on
  endpoints.stop_accepting();
  status.stopping(drain_timeout);
  auto const deadline = std::chrono::steady_clock::now() + drain_timeout;
  if (auto n = endpoints.open_sessions(); n > 0) {
    log::info("waiting up to %d ms for %d session(s) to end", drain_timeout.count(), n);
  }
  std::size_t last_left = 0;
  while (true) {
    auto const left = endpoints.open_sessions();
    auto const now  = std::chrono::steady_clock::now();
    if (left == 0) { return; }
    if (now >= deadline) {
      log::warn("drain deadline passed with %d session(s) open; closing them", left);
      return;
    }
    auto const to_deadline = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    if (left != last_left) {
      last_left = left;
      status.draining(left, to_deadline);
    }
    // Sessions end on the listener's call threads; look again every 20 ms.
    auto const s = wait_signal(signals, std::min<std::chrono::milliseconds>(20ms, to_deadline));
    if (s == SIGTERM || s == SIGINT) {
      log::warn("%s again: closing %d session(s) now", ::strsignal(s), left);
      return;
    }
    if (s == SIGHUP) { log::info("SIGHUP while draining: ignored"); }
  }
}

void stop_serving(core::daemon_core& core, endpoints& endpoints, service_status& status)
{
  // Every session has ended (or its time is up), so calls still in flight
  // are cancelled at once: a deadline here would be waited in full while any
  // client keeps its channel open, even an idle one.
  // What closing the sessions now frees stays kept: a restart serves it
  // again (their clients did not let go of it), as after a SIGKILL.
  core.buffers().set_buffer_keeper(nullptr);
  core.stables().set_backup_keeper(nullptr);
  status.stopped();
  core.begin_drain();
  endpoints.stop();
  core.close_all_sessions();
  log::report_suppressed();
  log::info("stopped");
}

}  // namespace rmmd::startup
