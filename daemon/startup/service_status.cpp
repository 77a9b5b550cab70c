#include "daemon/startup/service_status.hpp"

#include <systemd/sd-daemon.h>

#include <time.h>

#include <cstdint>

namespace rmmd::startup {
namespace {

using namespace std::chrono_literals;

std::uint64_t monotonic_usec()
{
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000 +
         static_cast<std::uint64_t>(ts.tv_nsec) / 1000;
}

}  // namespace

void service_status::ready()
{
  ::sd_notifyf(0, "READY=1\nSTATUS=serving %zu pool(s), 0 session(s)", pool_count_);
}

void service_status::follow(std::size_t open_sessions, bool always)
{
  if (!always && open_sessions == shown_sessions_) { return; }
  shown_sessions_ = open_sessions;
  ::sd_notifyf(0, "STATUS=serving %zu pool(s), %zu session(s)", pool_count_, open_sessions);
}

void service_status::reloading()
{
  ::sd_notifyf(
      0, "RELOADING=1\nMONOTONIC_USEC=%llu", static_cast<unsigned long long>(monotonic_usec()));
}

void service_status::reloaded(std::size_t open_sessions)
{
  ::sd_notify(0, "READY=1");
  follow(open_sessions, true);
}

void service_status::stopping(std::chrono::milliseconds drain_timeout)
{
  // EXTEND_TIMEOUT_USEC: systemd's stop timeout covers the drain deadline
  // (plus time to reclaim), whatever TimeoutStopSec says.
  ::sd_notifyf(
      0,
      "STOPPING=1\nEXTEND_TIMEOUT_USEC=%llu",
      static_cast<unsigned long long>(std::chrono::microseconds(drain_timeout + 10s).count()));
}

void service_status::draining(std::size_t left, std::chrono::milliseconds to_deadline)
{
  ::sd_notifyf(0,
               "STATUS=draining: %zu session(s) left, %lld ms to the deadline",
               left,
               static_cast<long long>(to_deadline.count()));
}

void service_status::stopped()
{
  ::sd_notify(0, "STATUS=stopping");
}

}  // namespace rmmd::startup
