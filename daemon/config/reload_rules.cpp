#include "daemon/config/reload_rules.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <array>
#include <tuple>

namespace rmmd::config {
namespace {

std::string text(std::size_t v)
{
  return absl::StrCat(v);
}
std::string text(std::chrono::milliseconds v)
{
  return absl::StrCat(v.count());
}
std::string text(log::level v)
{
  return std::string(level_name(v));
}
std::string text(std::vector<peer_grant_settings> const& grants)
{
  return absl::StrCat(grants.size(), " grant(s)");
}
std::string text(std::optional<peer_tls_files> const& tls)
{
  return tls ? tls->certificate.string() : std::string("none");
}
template <typename Id>
std::string text(std::vector<Id> const& ids)
{
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}
std::string text(std::map<uid_t, std::size_t> const& overrides)
{
  return absl::StrCat("{", absl::StrJoin(overrides, ",", absl::PairFormatter(":")), "}");
}

/// A row for the field that `field` (a captureless lambda) returns a
/// reference to, or a tuple of references for fields used together.
template <auto field>
constexpr reload_rule applied(std::string_view name)
{
  return reload_rule{
      .name    = name,
      .when    = on_reload::applied,
      .changed = [](daemon_settings const& a,
                    daemon_settings const& b) { return field(a) != field(b); },
      .take = [](daemon_settings& into, daemon_settings const& from) { field(into) = field(from); },
      .value = [](daemon_settings const& s) { return text(field(s)); }};
}

template <auto field>
constexpr reload_rule needs_restart(std::string_view name)
{
  return reload_rule{
      .name    = name,
      .when    = on_reload::needs_restart,
      .changed = [](daemon_settings const& a,
                    daemon_settings const& b) { return field(a) != field(b); },
      .take = [](daemon_settings& into, daemon_settings const& from) { field(into) = field(from); },
      .value = nullptr};
}

// Restart-only, and why: the sockets and their directory are made once at
// start (runtime_dir, socket_group, runtime_dir_mode, socket_mode), and the
// state file is read once, at start, before it is written again; pools,
// those listed and those made per GPU, own driver memory that live leases
// point into, and tenancy decides which pools (one per tenant, or one for
// all) there are; hello_timeout_ms and max_message_bytes are fixed when the
// listener and the gRPC server are built; the metrics endpoint listens once;
// the peer listener, the peers dialed and the lease times are set up once
// (the TLS files are read again, and the grants taken, on every reload).
// One row a field; clang-format 14 breaks a lambda given as a template
// argument across lines, so the table is kept as written.
// clang-format off
constexpr std::array rules{
    needs_restart<[](auto& s) -> auto& { return s.runtime_dir; }>("runtime_dir"),
    needs_restart<[](auto& s) { return std::tie(s.socket_group, s.socket_group_name); }>("socket_group"),
    needs_restart<[](auto& s) -> auto& { return s.runtime_dir_mode; }>("runtime_dir_mode"),
    needs_restart<[](auto& s) -> auto& { return s.socket_mode; }>("socket_mode"),
    needs_restart<[](auto& s) -> auto& { return s.state_file; }>("state_file"),
    applied<[](auto& s) -> auto& { return s.access.uids; }>("allowed_uids/allowed_users"),
    applied<[](auto& s) -> auto& { return s.access.gids; }>("allowed_gids/allowed_groups"),
    needs_restart<[](auto& s) -> auto& { return s.pools; }>("pools"),
    needs_restart<[](auto& s) -> auto& { return s.cuda_pool_per_gpu; }>("cuda_pool_per_gpu"),
    needs_restart<[](auto& s) { return std::tie(s.tenancy.isolate, s.tenancy.shared_gids); }>("tenancy"),
    applied<[](auto& s) -> auto& { return s.quotas.per_session_bytes; }>("quotas.per_session_bytes"),
    applied<[](auto& s) -> auto& { return s.quotas.per_uid_bytes; }>("quotas.per_uid_bytes"),
    applied<[](auto& s) -> auto& { return s.quotas.per_uid_overrides; }>("quotas.uid_overrides"),
    applied<[](auto& s) -> auto& { return s.admission.max_pending_per_uid; }>("admission.max_pending_per_uid"),
    applied<[](auto& s) -> auto& { return s.admission.max_pending_total; }>("admission.max_pending_total"),
    applied<[](auto& s) -> auto& { return s.admission.max_sessions_per_uid; }>("admission.max_sessions_per_uid"),
    applied<[](auto& s) -> auto& { return s.admission.max_sessions_total; }>("admission.max_sessions_total"),
    applied<[](auto& s) -> auto& { return s.drain_timeout; }>("drain_timeout_ms"),
    needs_restart<[](auto& s) -> auto& { return s.hello_timeout; }>("hello_timeout_ms"),
    applied<[](auto& s) -> auto& { return s.reclaim_timeout; }>("reclaim_timeout_ms"),
    applied<[](auto& s) -> auto& { return s.pack_up_to; }>("pack_up_to_bytes"),
    needs_restart<[](auto& s) -> auto& { return s.max_message_bytes; }>("max_message_bytes"),
    needs_restart<[](auto& s) -> auto& { return s.metrics_address; }>("metrics_address"),
    applied<[](auto& s) -> auto& { return s.metrics_top_sessions; }>("metrics_top_sessions"),
    applied<[](auto& s) -> auto& { return s.log_level; }>("log_level"),
    needs_restart<[](auto& s) { return std::tie(s.peering.node_name, s.peering.listen_address, s.peering.insecure_plaintext_for_tests, s.peering.peers, s.peering.hold_lease, s.peering.renew_interval, s.peering.keepalive); }>("peering"),
    applied<[](auto& s) -> auto& { return s.peering.tls; }>("peering.tls"),
    applied<[](auto& s) -> auto& { return s.peering.grants; }>("peering.grants"),
};
// clang-format on

}  // namespace

std::span<reload_rule const> reload_rules()
{
  return rules;
}

reload_changes changes_between(daemon_settings const& now, daemon_settings const& next)
{
  reload_changes out;
  for (auto const& rule : rules) {
    if (!rule.changed(now, next)) { continue; }
    if (rule.when == on_reload::applied) {
      out.applied.push_back(absl::StrCat(std::string(rule.name), "=", rule.value(next)));
    } else {
      out.need_restart.emplace_back(rule.name);
    }
  }
  return out;
}

daemon_settings reloaded(daemon_settings const& now, daemon_settings const& next)
{
  auto out = now;
  for (auto const& rule : rules) {
    if (rule.when == on_reload::applied) { rule.take(out, next); }
  }
  // Whether the allowed ids are the built-in ones goes with the ids.
  out.access_is_default = next.access_is_default;
  return out;
}

std::string reload_line(std::filesystem::path const& file, reload_changes const& changes)
{
  if (changes.applied.empty() && changes.need_restart.empty()) {
    return absl::StrCat("reloaded ", file.string(), ": nothing changed");
  }
  std::string line = absl::StrCat("reloaded ", file.string(), ":");
  if (!changes.applied.empty()) {
    absl::StrAppend(&line, " applied ", absl::StrJoin(changes.applied, ", "));
  }
  if (!changes.need_restart.empty()) {
    absl::StrAppend(&line,
                    changes.applied.empty() ? "" : ";",
                    " needs a restart (ignored until then): ",
                    absl::StrJoin(changes.need_restart, ", "));
  }
  return line;
}

}  // namespace rmmd::config
