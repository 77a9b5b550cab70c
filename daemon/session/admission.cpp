#include "daemon/session/admission.hpp"

#include <absl/strings/str_format.h>

namespace rmmd::session_socket {

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

admission::admission(core::admission_limits limits, metrics::admission_metrics* metrics)
    : limits_(limits), metrics_(metrics)
{
}

void admission::set_limits(core::admission_limits limits)
{
  std::lock_guard lock(mutex_);
  limits_ = limits;
}

core::admission_limits admission::limits() const
{
  std::lock_guard lock(mutex_);
  return limits_;
}

void admission::refused(admission_limit limit) const noexcept
{
  if (metrics_ != nullptr) { metrics_->refused(limit); }
}

namespace detail {

/// One limit: what its refusal names, and what the refused client may do.
struct limit_rule {
  admission_limit limit;
  char const* setting;  ///< its field under `admission` in rmmd.conf
  char const* flag;
  char const* advice;
};

/// What admission counts, per uid and in all, and the words for it.
struct counted_kind {
  char const* per_uid_words;  ///< "uid U already has N <these>"
  char const* total_verb;     ///< "the daemon already <verb> N <total_words>"
  char const* total_words;
  limit_rule per_uid;
  limit_rule total;
};

}  // namespace detail

namespace {

using detail::counted_kind;

constexpr counted_kind pending_connections{
    .per_uid_words = "connection(s) that have not sent their hello",
    .total_verb    = "has",
    .total_words   = "connection(s) that have not sent their hello",
    .per_uid       = {admission_limit::max_pending_per_uid,
                      "max_pending_per_uid",
                      "--max-pending-per-uid",
                      "send the SessionHello as soon as the connection is open and close "
                            "connections that will not, or ask the operator to raise the limit"},
    .total         = {admission_limit::max_pending_total,
                      "max_pending_total",
                      "--max-pending-total",
                      "retry shortly, or ask the operator to raise the limit"}};

constexpr counted_kind open_sessions{
    .per_uid_words = "open session(s)",
    .total_verb    = "serves",
    .total_words   = "session(s)",
    .per_uid       = {admission_limit::max_sessions_per_uid,
                      "max_sessions_per_uid",
                      "--max-sessions-per-uid",
                      "close sessions this user no longer needs (`rmmctl sessions` lists them), "
                            "or ask the operator to raise the limit"},
    .total         = {admission_limit::max_sessions_total,
                      "max_sessions_total",
                      "--max-sessions-total",
                      "retry once other sessions have ended, or ask the operator to raise the "
                              "limit"}};

}  // namespace

absl::Status admission::admit(counts& counted,
                              uid_t uid,
                              std::size_t max_per_uid,
                              std::size_t max_total,
                              counted_kind const& kind)
{
  if (auto n = counted.of(uid); n >= max_per_uid) {
    refused(kind.per_uid.limit);
    return absl::ResourceExhaustedError(
        absl::StrFormat("open session: uid %d already has %d %s, the most one uid may have "
                        "(admission.%s in rmmd.conf, %s); %s",
                        uid,
                        n,
                        kind.per_uid_words,
                        kind.per_uid.setting,
                        kind.per_uid.flag,
                        kind.per_uid.advice));
  }
  if (counted.total >= max_total) {
    refused(kind.total.limit);
    return absl::ResourceExhaustedError(
        absl::StrFormat("open session: the daemon already %s %d %s, the most it takes from all "
                        "users together (admission.%s in rmmd.conf, %s); %s",
                        kind.total_verb,
                        counted.total,
                        kind.total_words,
                        kind.total.setting,
                        kind.total.flag,
                        kind.total.advice));
  }
  counted.add(uid);
  return absl::OkStatus();
}

absl::Status admission::admit_pending(uid_t uid)
{
  std::lock_guard lock(mutex_);
  auto admitted = admit(
      pending_, uid, limits_.max_pending_per_uid, limits_.max_pending_total, pending_connections);
  if (admitted.ok() && metrics_ != nullptr) { metrics_->set_pending(pending_.total); }
  return admitted;
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
  return admit(
      sessions_, uid, limits_.max_sessions_per_uid, limits_.max_sessions_total, open_sessions);
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

}  // namespace rmmd::session_socket
