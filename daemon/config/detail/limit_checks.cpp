#include "common/system_user.hpp"
#include "daemon/config/detail/checks.hpp"
#include "daemon/config/detail/value_formats.hpp"

#include <climits>
#include <cstdint>
#include <map>
#include <optional>

namespace rmmd::config::detail {
namespace {

/// Longest drain an operator may ask for (systemd's TimeoutStopSec must cover it).
constexpr std::uint32_t max_drain_ms      = 3'600'000;
constexpr std::uint32_t max_hello_ms      = 600'000;
constexpr std::uint32_t max_reclaim_ms    = 60'000;
constexpr std::uint64_t min_message_bytes = 4096;
/// Largest admission limit: far above any node's processes, and below any fd limit.
constexpr std::uint32_t max_admission_limit = 1'000'000;
// Beyond this a scrape is as large as the per-session series were meant to avoid.
constexpr std::uint32_t max_metrics_top_sessions = 10'000;

}  // namespace

void check_quotas(checked_file& f, daemon_settings& s)
{
  if (!f.config().has_quotas()) { return; }
  auto const& q              = f.config().quotas();
  auto const n               = f.nested(f.root(), "quotas");
  s.quotas.per_session_bytes = q.per_session_bytes();
  s.quotas.per_uid_bytes     = q.per_uid_bytes();
  std::map<uid_t, int> first_line;
  for (int i = 0; i < q.uid_overrides_size(); ++i) {
    auto const& o = q.uid_overrides(i);
    auto const on = f.nested(n, "uid_overrides", i);
    std::optional<uid_t> uid;
    switch (o.who_case()) {
      case v1::UidQuota::kUid:
        uid = o.uid();
        break;
      case v1::UidQuota::kUser:
        if (auto user = common::find_user(o.user())) { uid = user->uid; }
        if (!uid) {
          f.error(on,
                  "user",
                  -1,
                  "uid_overrides: no user named \"%s\" on this system; give an existing user "
                  "name or a uid",
                  o.user());
        }
        break;
      default:
        f.error(
            on, "uid", -1, "uid_overrides[%d] names nobody; give `uid: N` or `user: \"NAME\"`", i);
    }
    if (!uid) { continue; }
    if (auto [it, fresh] = first_line.emplace(*uid, on.line); !fresh) {
      f.error(on,
              o.has_user() ? "user" : "uid",
              -1,
              "uid_overrides: uid %d already has a quota at line %d; give each uid one override",
              *uid,
              it->second);
      continue;
    }
    s.quotas.per_uid_overrides[*uid] = o.bytes();
  }
}

void check_admission(checked_file& f, daemon_settings& s)
{
  if (!f.config().has_admission()) { return; }
  auto const& a = f.config().admission();
  auto const n  = f.nested(f.root(), "admission");
  // Each limit as written (or its default), checked for range.
  auto limit = [&](std::string_view field, bool given, std::uint32_t value, std::size_t& out) {
    if (!given) { return; }
    if (value == 0 || value > max_admission_limit) {
      f.error(n,
              field,
              -1,
              "admission.%s %d is out of range; give 1 to %d",
              field,
              value,
              max_admission_limit);
      return;
    }
    out = value;
  };
  auto& l = s.admission;
  limit("max_pending_per_uid",
        a.has_max_pending_per_uid(),
        a.max_pending_per_uid(),
        l.max_pending_per_uid);
  limit("max_pending_total", a.has_max_pending_total(), a.max_pending_total(), l.max_pending_total);
  limit("max_sessions_per_uid",
        a.has_max_sessions_per_uid(),
        a.max_sessions_per_uid(),
        l.max_sessions_per_uid);
  limit("max_sessions_total",
        a.has_max_sessions_total(),
        a.max_sessions_total(),
        l.max_sessions_total);
  // A per-uid limit above its total is an error where it was written.
  if (l.max_pending_per_uid > l.max_pending_total) {
    f.error(n,
            a.has_max_pending_per_uid() ? "max_pending_per_uid" : "max_pending_total",
            -1,
            "%s",
            per_uid_above_total("pending", l.max_pending_per_uid, l.max_pending_total));
  }
  if (l.max_sessions_per_uid > l.max_sessions_total) {
    f.error(n,
            a.has_max_sessions_per_uid() ? "max_sessions_per_uid" : "max_sessions_total",
            -1,
            "%s",
            per_uid_above_total("sessions", l.max_sessions_per_uid, l.max_sessions_total));
  }
}

void check_timing(checked_file& f, daemon_settings& s)
{
  if (f.config().has_drain_timeout_ms()) {
    if (f.config().drain_timeout_ms() > max_drain_ms) {
      f.error(f.root(),
              "drain_timeout_ms",
              -1,
              "drain_timeout_ms %d is longer than the most allowed, %d (one hour)",
              f.config().drain_timeout_ms(),
              max_drain_ms);
    }
    s.drain_timeout = std::chrono::milliseconds(f.config().drain_timeout_ms());
  }
  if (f.config().has_hello_timeout_ms()) {
    if (f.config().hello_timeout_ms() == 0 || f.config().hello_timeout_ms() > max_hello_ms) {
      f.error(f.root(),
              "hello_timeout_ms",
              -1,
              "hello_timeout_ms %d is out of range; give 1 to %d",
              f.config().hello_timeout_ms(),
              max_hello_ms);
    }
    s.hello_timeout = std::chrono::milliseconds(f.config().hello_timeout_ms());
  }
  if (f.config().has_reclaim_timeout_ms()) {
    if (f.config().reclaim_timeout_ms() > max_reclaim_ms) {
      f.error(f.root(),
              "reclaim_timeout_ms",
              -1,
              "reclaim_timeout_ms %d is longer than the most allowed, %d (one minute); give 0 "
              "to refuse a short pool's requests at once",
              f.config().reclaim_timeout_ms(),
              max_reclaim_ms);
    }
    s.reclaim_timeout = std::chrono::milliseconds(f.config().reclaim_timeout_ms());
  }
  if (f.config().has_pack_up_to_bytes()) {
    if (f.config().pack_up_to_bytes() > core::default_pack_block_size) {
      f.error(f.root(),
              "pack_up_to_bytes",
              -1,
              "pack_up_to_bytes %d is larger than a packed block (%d bytes); give at most that, "
              "or 0 to give every allocation a driver allocation of its own",
              f.config().pack_up_to_bytes(),
              core::default_pack_block_size);
    }
    s.pack_up_to = f.config().pack_up_to_bytes();
  }
}

void check_outputs(checked_file& f, daemon_settings& s)
{
  if (f.config().has_max_message_bytes()) {
    auto bytes = f.config().max_message_bytes();
    if (bytes < min_message_bytes || bytes > static_cast<std::uint64_t>(INT_MAX)) {
      f.error(f.root(),
              "max_message_bytes",
              -1,
              "max_message_bytes %d is out of range; give %d to %d",
              bytes,
              min_message_bytes,
              INT_MAX);
    }
    s.max_message_bytes = bytes;
  }
  if (!f.config().metrics_address().empty()) {
    if (auto why = check_address(f.config().metrics_address()); !why.empty()) {
      f.error(f.root(),
              "metrics_address",
              -1,
              "metrics_address \"%s\": %s",
              f.config().metrics_address(),
              why);
    }
    s.metrics_address = f.config().metrics_address();
  }
  if (f.config().has_metrics_top_sessions()) {
    if (f.config().metrics_top_sessions() > max_metrics_top_sessions) {
      f.error(f.root(),
              "metrics_top_sessions",
              -1,
              "metrics_top_sessions %d is out of range; give 0 (no per-session series) to %d",
              f.config().metrics_top_sessions(),
              max_metrics_top_sessions);
    }
    s.metrics_top_sessions = f.config().metrics_top_sessions();
  }
  switch (f.config().log_level()) {
    case v1::DaemonConfig::ERROR:
      s.log_level = log::level::error;
      break;
    case v1::DaemonConfig::WARNING:
      s.log_level = log::level::warning;
      break;
    case v1::DaemonConfig::DEBUG:
      s.log_level = log::level::debug;
      break;
    default:
      s.log_level = log::level::info;
      break;
  }
}

}  // namespace rmmd::config::detail
