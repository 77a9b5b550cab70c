#include "daemon/startup/signals.hpp"

#include <time.h>

namespace rmmd::startup {

sigset_t block_signals()
{
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

int wait_signal(sigset_t const& signals, std::chrono::milliseconds timeout)
{
  auto const s = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{.tv_sec  = static_cast<time_t>(s.count()),
              .tv_nsec = static_cast<long>((timeout - s).count() * 1'000'000)};
  siginfo_t info{};
  int sig = ::sigtimedwait(&signals, &info, &ts);
  return sig < 0 ? 0 : sig;
}

}  // namespace rmmd::startup
