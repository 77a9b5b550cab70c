#include "daemon/session/admission.hpp"

#include <absl/strings/str_format.h>

namespace rmmd::session {

using metrics::admission_limit;

void admission::counts::add(uid_t uid)
{
  ++per_uid[uid];
  ++total;
}

void admission::counts::remove(uid_t uid) noexcept
{
  auto it = per_uid.find(uid);
  if (it == per_uid.end()) { return; }  // not counted: nothing to undo
  if (--it->second == 0) { per_uid.erase(it); }
  --total;
}

std::size_t admission::counts::of(uid_t uid) const
{
  auto it = per_uid.find(uid);
  return it == per_uid.end() ? 0 : it->second;
}

admission::admission(admission_limits limits, metrics::admission_metrics* metrics)
    : limits_(limits), metrics_(metrics)
{
}

void admission::set_limits(admission_limits limits)
{
  std::lock_guard lock(mutex_);
  limits_ = limits;
}

admission_limits admission::limits() const
{
  std::lock_guard lock(mutex_);
  return limits_;
}

void admission::refused(admission_limit limit) const noexcept
{
  if (metrics_ != nullptr) { metrics_->refused(limit); }
}

absl::Status admission::admit_pending(uid_t uid)
{
  std::lock_guard lock(mutex_);
  if (auto n = pending_.of(uid); n >= limits_.max_pending_per_uid) {
    refused(admission_limit::max_pending_per_uid);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "open session: uid %d already has %d connection(s) that have not sent their hello, the "
        "most one uid may have (admission.max_pending_per_uid in rmmd.conf, "
        "--max-pending-per-uid); send the SessionHello as soon as the connection is open and "
        "close connections that will not, or ask the operator to raise the limit",
        uid,
        n));
  }
  if (pending_.total >= limits_.max_pending_total) {
    refused(admission_limit::max_pending_total);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "open session: the daemon already has %d connection(s) that have not sent their hello, "
        "the most it takes from all users together (admission.max_pending_total in rmmd.conf, "
        "--max-pending-total); retry shortly, or ask the operator to raise the limit",
        pending_.total));
  }
  pending_.add(uid);
  if (metrics_ != nullptr) { metrics_->set_pending(pending_.total); }
  return absl::OkStatus();
}

void admission::end_pending(uid_t uid) noexcept
{
  std::lock_guard lock(mutex_);
  pending_.remove(uid);
  if (metrics_ != nullptr) { metrics_->set_pending(pending_.total); }
}

absl::Status admission::admit_session(uid_t uid)
{
  std::lock_guard lock(mutex_);
  if (auto n = sessions_.of(uid); n >= limits_.max_sessions_per_uid) {
    refused(admission_limit::max_sessions_per_uid);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "open session: uid %d already has %d open session(s), the most one uid may have "
        "(admission.max_sessions_per_uid in rmmd.conf, --max-sessions-per-uid); close sessions "
        "this user no longer needs (`rmmctl sessions` lists them), or ask the operator to raise "
        "the limit",
        uid,
        n));
  }
  if (sessions_.total >= limits_.max_sessions_total) {
    refused(admission_limit::max_sessions_total);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "open session: the daemon already serves %d session(s), the most it takes from all "
        "users together (admission.max_sessions_total in rmmd.conf, --max-sessions-total); "
        "retry once other sessions have ended, or ask the operator to raise the limit",
        sessions_.total));
  }
  sessions_.add(uid);
  return absl::OkStatus();
}

void admission::end_session(uid_t uid) noexcept
{
  std::lock_guard lock(mutex_);
  sessions_.remove(uid);
}

std::size_t admission::pending() const
{
  std::lock_guard lock(mutex_);
  return pending_.total;
}

std::size_t admission::sessions() const
{
  std::lock_guard lock(mutex_);
  return sessions_.total;
}

}  // namespace rmmd::session
